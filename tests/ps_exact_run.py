"""Trains the classifier under the exact parameter-server mode and, as references, on one
replica and on mirrored replicas; prints the largest differences as JSON.

Usage: `python ps_exact_run.py WORKERS SERVERS STEPS MODEL_DIR`. The workers and
servers are processes on ports of 127.0.0.1 that this one starts and kills; it is
the chief. The references run first: a process that has connected to a cluster
keeps its eager context remote. Then a run in MODEL_DIR stops after 4 steps and a
new Trainer resumes it.
"""

import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

import loops  # noqa: E402
import loops_models as models  # noqa: E402
from conftest import make_trainer, optimizer_factory, tiny_batches  # noqa: E402  (4 CPUs)
from loops import testing  # noqa: E402
from loops.cluster import launch  # noqa: E402


def build(strategy, **settings):
    return make_trainer(
        loops.ClassifierLoop,
        model_fn=lambda: models.build_classifier(
            "mlp",
            input_shape=(8, 8, 1),
            num_classes=10,
            l2=1e-3,
            batch_norm=False,
            dropout=0.3,
            seed=3,
        ),
        optimizer_fn=optimizer_factory("adam"),
        strategy=strategy,
        # 21 examples in batches of 8: every third step is a partial batch of 5.
        train_data=tiny_batches(8, 21, shuffle_seed=5),
        eval_data=tiny_batches(8, 21, seed=1),
        steps_per_loop=4,
        progress=loops.testing.quiet_progress(),
        **settings,
    )


SERVE = """
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
spec, job, index = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index)
print("serving", flush=True)
server.join()
"""


def start_cluster(workers, servers):
    """Starts the workers and servers, processes on 127.0.0.1; returns (spec, processes)."""
    addresses = [f"127.0.0.1:{port}" for port in launch.free_ports(1 + workers + servers)]
    spec = {
        "chief": addresses[:1],
        "worker": addresses[1 : 1 + workers],
        "ps": addresses[1 + workers :],
    }
    tasks = [("worker", index) for index in range(workers)]
    tasks += [("ps", index) for index in range(servers)]
    processes = {
        f"{job}_{index}": subprocess.Popen(
            [sys.executable, "-c", SERVE, json.dumps(spec), job, str(index)],
            stdin=subprocess.DEVNULL,
        )
        for job, index in tasks
    }
    return spec, processes


def connect(spec):
    """The chief's ParameterServerStrategy of the cluster `spec` (it waits for the tasks)."""
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    return tf.distribute.experimental.ParameterServerStrategy(resolver)


def main(workers, servers, steps, model_dir):
    # Started first: they import TensorFlow while the references train.
    spec, processes = start_cluster(workers, servers)
    runs = {
        "1 replica": testing.train_run(build, testing.replica_strategy(1), num_steps=steps),
        "2 mirrored": testing.train_run(build, testing.replica_strategy(2), num_steps=steps),
    }
    strategy = connect(spec)
    exact = testing.train_run(build, strategy, num_steps=steps)
    report = {
        "num_examples": exact["logs"]["num_examples"].tolist(),
        "loss": exact["logs"]["loss"].tolist(),
    }
    for name, reference in runs.items():
        testing.assert_runs_agree(exact, reference, rtol=1e-5, label=f"exact ps vs {name}")
        report[name] = largest_difference(exact, reference)
    # Resumed mid-stream: 4 steps, a new Trainer restores step 4 and trains the rest.
    build(strategy, model_dir=model_dir).train(4)
    resumed = build(strategy, model_dir=model_dir)
    report["restored_step"] = int(resumed.global_step.numpy())
    resumed.train(steps)
    weights = testing.loop_weights(resumed)
    testing.assert_close(weights, exact["weights"], rtol=1e-5, label="resumed vs uninterrupted")
    report["resumed"] = largest_difference({"weights": weights}, exact)
    # The asynchronous mode: each batch scheduled once, in order; a resume goes on from
    # the first batch not yet scheduled.
    async_dir = model_dir + "_async"
    first = build(strategy, model_dir=async_dir, parameter_server_mode="async").train(4)
    report["async_first_num_examples"] = first["num_examples"].tolist()
    resumed = build(strategy, model_dir=async_dir, parameter_server_mode="async")
    report["async_resumed_num_examples"] = resumed.train(steps)["num_examples"].tolist()
    report["async_counts"] = resumed.executor.results_extra()["parameter_server"]
    print("RESULT " + json.dumps(report), flush=True)
    for process in processes.values():
        process.kill()


def largest_difference(run, reference):
    return max(
        testing.relative_error(run["weights"][key], reference["weights"][key])
        for key in reference["weights"]
    )


if __name__ == "__main__":
    main(*(int(argument) for argument in sys.argv[1:4]), sys.argv[4])
