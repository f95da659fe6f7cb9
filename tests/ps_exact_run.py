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
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import loops  # noqa: E402
import loops_models as models  # noqa: E402
from conftest import make_trainer, optimizer_factory, tiny_batches, tiny_examples  # noqa: E402  (4 CPUs)
from loops import testing  # noqa: E402


def build(strategy, train_data=None, **settings):
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
        train_data=train_data or tiny_batches(8, 21, shuffle_seed=5),
        eval_data=tiny_batches(8, 21, seed=1),
        steps_per_loop=4,
        progress=loops.testing.quiet_progress(),
        **settings,
    )


def main(workers, servers, steps, model_dir):
    # Started first: they import TensorFlow while the references train.
    spec, processes = testing.local_parameter_server(workers, servers)
    runs = {
        "1 replica": testing.train_run(build, testing.replica_strategy(1), num_steps=steps),
        "2 mirrored": testing.train_run(build, testing.replica_strategy(2), num_steps=steps),
    }
    one_recovered = recovered(testing.replica_strategy(1), model_dir + "_one", steps)
    # Saved by 2 mirrored replicas after 4 steps, for the cluster to continue.
    mirrored_dir = model_dir + "_mirrored"
    build(testing.replica_strategy(2), model_dir=mirrored_dir).train(4)
    strategy = testing.parameter_server_strategy(spec)
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
    # Another shape: 2 mirrored replicas saved step 4, the cluster trains on from there.
    reshaped = build(strategy, model_dir=mirrored_dir)
    report["reshaped_restored_step"] = int(reshaped.global_step.numpy())
    reshaped.train(steps)
    weights = testing.loop_weights(reshaped)
    testing.assert_close(weights, exact["weights"], rtol=1e-5, label="mirrored then exact")
    report["reshaped"] = largest_difference({"weights": weights}, exact)
    # The asynchronous mode: each batch scheduled once, in order; a resume goes on from
    # the first batch not yet scheduled.
    async_dir = model_dir + "_async"
    first = build(strategy, model_dir=async_dir, parameter_server_mode="async").train(4)
    report["async_first_num_examples"] = first["num_examples"].tolist()
    resumed = build(strategy, model_dir=async_dir, parameter_server_mode="async")
    report["async_resumed_num_examples"] = resumed.train(steps)["num_examples"].tolist()
    report["async_counts"] = resumed.executor.results_extra()["parameter_server"]
    # A step that reads an inf: back to step 0 and past its batches, as one replica does.
    exact_recovered = recovered(strategy, model_dir + "_recovered", steps)
    testing.assert_close(
        exact_recovered["weights"], one_recovered["weights"], rtol=1e-5, label="recovered"
    )
    report["recoveries"] = exact_recovered["recoveries"]
    report["recovered"] = largest_difference(exact_recovered, one_recovered)
    report["worker_killed"] = worker_killed_mid_step(strategy, processes["worker_1"], exact, steps)
    report["server_killed"] = server_killed(strategy, spec, processes["ps_1"], model_dir)
    print("RESULT " + json.dumps(report), flush=True)
    for process in processes.values():
        process.kill()
    # The coordinator's threads would go on trying to reach the killed worker.
    os._exit(0)


def worker_killed_mid_step(strategy, worker, exact, steps):
    """Trains again, killing `worker` right after step 4's closures are scheduled (they run
    again on the other worker); returns the largest difference from the `exact` weights."""
    trainer = build(strategy)
    coordinator = trainer.coordinator
    schedule = coordinator.schedule
    scheduled = []

    def schedule_then_kill(*args, **kwargs):
        remote = schedule(*args, **kwargs)
        scheduled.append(remote)
        if len(scheduled) == 8:  # both closures of step 4
            worker.kill()
        return remote

    coordinator.schedule = schedule_then_kill
    trainer.train(steps)
    assert worker.wait(timeout=10) is not None
    return {
        "difference": largest_difference({"weights": testing.loop_weights(trainer)}, exact),
        **trainer.executor.results_extra()["parameter_server"],
    }


def recovered(strategy, model_dir, steps):
    """Trains with on_nonfinite="recover" on a stream whose second batch holds an inf (only
    the first time: the rest repeats clean epochs); returns its weights and recoveries."""
    images, labels = tiny_examples(21)
    bad = images.astype(np.float32)
    bad[8 + 6, 3, 3, 0] = np.inf

    def stream():
        first = tf.data.Dataset.from_tensor_slices((bad, labels)).batch(8)
        clean = tf.data.Dataset.from_tensor_slices((images.astype(np.float32), labels))
        return first.concatenate(clean.batch(8).repeat())

    trainer = build(strategy, train_data=stream, model_dir=model_dir, on_nonfinite="recover")
    trainer.train(steps)
    return {
        "weights": testing.loop_weights(trainer),
        "recoveries": [dict(entry) for entry in trainer.controller.recoveries.entries],
    }


def server_killed(strategy, spec, server, model_dir):
    """Trains 2 steps, kills `server`, and trains on: returns what the Trainer raised, and
    in how many seconds."""
    # The sentence takes the addresses from TF_CONFIG, as a launched chief has it.
    os.environ["TF_CONFIG"] = json.dumps({"cluster": spec, "task": {"type": "chief", "index": 0}})
    trainer = build(strategy, model_dir=model_dir + "_server")
    trainer.train(2)
    server.kill()
    server.wait()
    started = time.monotonic()
    try:
        trainer.train(7)
    except Exception as error:  # noqa: BLE001  (reported, whatever it is)
        return {
            "error": type(error).__name__,
            "message": str(error),
            "seconds": time.monotonic() - started,
        }
    return {"error": None}


def largest_difference(run, reference):
    return max(
        testing.relative_error(run["weights"][key], reference["weights"][key])
        for key in reference["weights"]
    )


if __name__ == "__main__":
    main(*(int(argument) for argument in sys.argv[1:4]), sys.argv[4])
