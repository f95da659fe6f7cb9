"""The JSON report every benchmark writes: the machine, the options it ran with, and its numbers."""

from __future__ import annotations

import os
from typing import Any


def write(args, **numbers: Any) -> dict:
    """Writes {machine, config, **numbers} to `args.output` atomically; says where; returns it.

    `config` is every parsed option but the output path.
    """
    import tensorflow as tf

    import loops

    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "tensorflow": tf.__version__,
            "gpus": len(tf.config.list_physical_devices("GPU")),
            "onednn": loops.cluster.strategies.onednn_enabled(),
        },
        "config": {key: value for key, value in vars(args).items() if key != "output"},
        **numbers,
    }
    loops.core.reporting.write_json_atomic(args.output, report)
    print(f"wrote {args.output}")
    return report
