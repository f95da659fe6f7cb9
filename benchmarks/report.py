"""The JSON report every benchmark writes: the machine, the options it ran with, and its numbers."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any


def write(args, **numbers: Any) -> dict:
    """Writes {machine, config, **numbers} to `args.output` atomically; says where; returns it.

    `config` is every parsed option but the output path.
    """
    import tensorflow as tf

    from loops import topology
    from loops.core import reporting

    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "tensorflow": tf.__version__,
            "gpus": len(tf.config.list_physical_devices("GPU")),
            "onednn": topology.onednn_enabled(),
        },
        "config": {key: value for key, value in vars(args).items() if key != "output"},
        **numbers,
    }
    reporting.write_json_atomic(args.output, report)
    print(f"wrote {args.output}")
    return report


def run(
    argv: Sequence[str] | None,
    parse_args: Callable[[Sequence[str] | None], Any],
    measure: Callable[[Any], list],
    format_table: Callable[[list], str],
) -> int:
    """A benchmark's main: its logical CPUs, its rows measured and printed, the report written."""
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import loops
    from loops import topology

    loops.configure_logical_cpus(max(args.replicas))
    rows = measure(args)
    print(format_table(rows))
    print(f"oneDNN kernels: {'on' if topology.onednn_enabled() else 'off'} (TF_ENABLE_ONEDNN_OPTS)")
    write(args, rows=rows)
    return 0
