"""Parameter-server training's other tasks: a `worker` or `ps` process serves the chief.

Every process of such a cluster runs the same binary: `serve_unless_chief`
turns a `worker` or `ps` process into a `tf.distribute.Server` that serves
until it is killed, and lets the `chief` go on to build and train the Trainer.
Where the variables live and how each mode runs a step is `loops.placement`.
"""

from __future__ import annotations

import signal

import tensorflow as tf

from loops.cluster import strategies


def serve_unless_chief() -> None:
    """On a `worker` or `ps` task of TF_CONFIG, serves the cluster until killed; the chief returns.

    Raises:
        ValueError: TF_CONFIG is bad for it (`strategies.cluster_resolver`).
    """
    resolver = strategies.cluster_resolver("parameter_server")
    task_type, task_id = resolver.task_type, resolver.task_id
    if task_type == "chief":
        return
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=task_type,
        task_index=task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"{task_type}_{task_id} serving at {server.target} until stopped", flush=True)
    # join blocks in C++ holding the GIL, so a Python SIGTERM handler (a binary
    # installs one at its start) would never run: the default action ends it.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    server.join()
