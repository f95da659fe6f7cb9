"""Parameter-server training: the tasks that serve the chief, and what each mode promises.

Under `tf.distribute.ParameterServerStrategy` the variables live on the `ps`
tasks, the `worker` tasks only run functions the coordinator (the `chief`
task, which runs the Trainer) schedules on them, and the chief reads each
step's batches from the train stream at the run's position (`TrainInput`).
`parameter_server_mode` says how a step is applied:
- "exact" (the default): the workers compute the gradients of the step's
  slices on the same weights and the chief applies their sum once
  (`loops.run.exact_parameter_server`): the losses and weights of one process,
  exact resume mid-stream, recovery from divergence, a retried closure
  changing nothing.
- "async": each step runs whole on one worker, which applies it at once on
  whatever weights it read (`executors.ScheduledExecutor`): every batch is
  scheduled once and a resume continues at the first batch not yet scheduled,
  but the order of the updates, and so the numbers, are not reproducible.

Every process of such a cluster runs the same binary: `serve_unless_chief`
turns a `worker` or `ps` process into a `tf.distribute.Server` that serves
until it is killed, and lets the `chief` go on to build and train the Trainer.
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
