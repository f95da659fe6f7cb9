"""Trains the classifier under the exact parameter-server mode and, as references, on one
replica and on mirrored replicas; prints the largest differences as JSON.

Usage: `python ps_exact_run.py WORKERS SERVERS STEPS MODEL_DIR`. The workers and
servers are processes on ports of 127.0.0.1 that this one starts and kills; it is
the chief. The references run first: a process that has connected to a cluster
keeps its eager context remote. Then a run in MODEL_DIR stops after 4 steps and a
new Trainer resumes it, and a new run goes on from that step-4 checkpoint on the rest of the
stream as its own data (a continuation). A model with a `loops.EmbeddingTable` trains here too.

Runs saved by that cluster continue on another one, of its worker_0, its servers
and one server more (started at once), which this process connects to last (a
process connects to another cluster under a new address of its own: the tasks
serve whichever spec their chief sends them); the same runs continue on
mirrored replicas in the test's own process, from copies of their checkpoints
(MODEL_DIR_at_4_mirrored, MODEL_DIR_table_at_3_mirrored), against the
uninterrupted weights written to MODEL_DIR_uninterrupted.pickle.
"""

import json
import os
import pickle
import re
import shutil
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import test_table_training as table_case  # noqa: E402

import loops  # noqa: E402
import loops_models as models  # noqa: E402
from conftest import make_trainer, optimizer_factory, tiny_batches, tiny_examples  # noqa: E402  (4 CPUs)
from loops import testing  # noqa: E402
from loops.cluster import launch  # noqa: E402

TABLE_STEPS = 6  # the table model's 4 batches of 8, 8, 3 and 1, and 2 of the next epoch


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


class TableLoop(table_case.TableModel):
    """test_table_training's model (an EmbeddingTable with its own Adagrad, a Dense head),
    its head's optimizer checkpointed too, so that a resume is exact."""

    def checkpoint_items(self):
        return {"model": self.model, "optimizer": self.optimizer}


def build_table(strategy, **settings):
    return make_trainer(
        TableLoop,
        own_table=True,
        strategy=strategy,
        train_data=table_case.batches,
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
        **settings,
    )


def table_weights(trainer):
    """The table and its slot whole (however many servers hold their rows), the head, both
    optimizers' variables and the step."""
    definition = trainer.definition
    table = definition.table
    weights = {
        "global_step": trainer.global_step.numpy(),
        "table": tf.concat(table.shards, 0).numpy(),
        "table_accumulator": tf.concat(table.slot_shards("accumulator"), 0).numpy(),
        "table_iterations": table.optimizer.iterations.numpy(),
    }
    for variable in definition.head.variables + definition.optimizer.variables:
        # Keras numbers the names of each model it builds (dense_21): the numbers dropped.
        weights[re.sub(r"_\d+(?=_|$)", "", variable.path.split("/", 1)[1])] = variable.numpy()
    return weights


STARTED = time.monotonic()


def say(stage):
    """Notes a stage on stderr, which the test shows when this process fails or hangs."""
    print(f"ps_exact_run: {stage} after {time.monotonic() - STARTED:.0f} s", file=sys.stderr)


def main(workers, servers, steps, model_dir):
    # Started first: they import TensorFlow while the references train. The other shape is
    # worker_0, these servers and one more, started now too and connected to last.
    spec, processes = testing.local_parameter_server(workers, servers)
    extra = f"127.0.0.1:{launch.free_ports(1)[0]}"
    other_spec = {**spec, "worker": spec["worker"][:1], "ps": [*spec["ps"], extra]}
    processes[f"ps_{servers}"] = testing.serve_task(other_spec, "ps", servers)
    runs = {
        "1 replica": testing.train_run(build, testing.replica_strategy(1), num_steps=steps),
        "2 mirrored": testing.train_run(build, testing.replica_strategy(2), num_steps=steps),
    }
    one_recovered = recovered(testing.replica_strategy(1), model_dir + "_one", steps)
    table_trainer = build_table(testing.replica_strategy(1))
    table_trainer.train(TABLE_STEPS)
    table_one = table_weights(table_trainer)  # read now: connecting drops this context
    # Saved by 2 mirrored replicas after 4 steps, for the cluster to continue.
    mirrored_dir = model_dir + "_mirrored"
    build(testing.replica_strategy(2), model_dir=mirrored_dir).train(4)
    say("the references trained")
    strategy = testing.parameter_server_strategy(spec)
    exact = testing.train_run(build, strategy, num_steps=steps)
    report = {
        "num_examples": exact["logs"]["num_examples"].tolist(),
        "loss": exact["logs"]["loss"].tolist(),
    }
    for name, reference in runs.items():
        testing.assert_runs_agree(exact, reference, rtol=1e-5, label=f"exact ps vs {name}")
        report[name] = largest_difference(exact, reference)
    restarts(strategy, model_dir, mirrored_dir, exact, steps, report)
    say("connected, exact and restarted")
    table_exact = table_runs(strategy, table_one, model_dir, report)
    async_runs(strategy, model_dir, steps, report)
    # A step that reads an inf: back to step 0 and past its batches, as one replica does.
    exact_recovered = recovered(strategy, model_dir + "_recovered", steps)
    testing.assert_close(
        exact_recovered["weights"], one_recovered["weights"], rtol=1e-5, label="recovered"
    )
    report["recoveries"] = exact_recovered["recoveries"]
    report["recovered"] = largest_difference(exact_recovered, one_recovered)
    say("the table, async and recovery")
    report["worker_killed"] = worker_killed_mid_step(strategy, processes["worker_1"], exact, steps)
    say("worker_1 killed")
    # The asynchronous mode keeps training on the worker left: every batch scheduled once.
    lost = build(strategy, model_dir=model_dir + "_async_lost", parameter_server_mode="async")
    report["async_after_lost_worker"] = lost.train(steps)["num_examples"].tolist()
    report["async_after_lost_worker_counts"] = lost.executor.results_extra()["parameter_server"]
    report["server_killed"] = server_killed(strategy, spec, processes["ps_1"], model_dir)
    processes["ps_1"] = testing.serve_task(spec, "ps", 1)
    say("ps_1 killed")
    # worker_1 stays down: the rerun's cluster is worker_0 and both servers.
    rerun_spec = {**spec, "worker": spec["worker"][:1]}
    report["server_rerun"] = server_rerun(rerun_spec, model_dir, exact, steps)
    say("rerun on the cluster started again")
    report["other_shape"] = other_shape(other_spec, model_dir, exact, table_exact, steps)
    with open(model_dir + "_uninterrupted.pickle", "wb") as file:
        pickle.dump({"classifier": exact["weights"], "table": table_exact}, file)
    say("the other shape")
    print("RESULT " + json.dumps(report), flush=True)
    for process in processes.values():
        process.kill()
    # The coordinator's threads would go on trying to reach the killed worker.
    os._exit(0)


def restarts(strategy, model_dir, mirrored_dir, exact, steps, report):
    """Runs that stop and continue on the cluster, each to the `exact` weights: resumed after
    step 4 (a copy of its checkpoint kept for the other shapes), preempted by SIGUSR1, and
    the run 2 mirrored replicas saved at step 4."""
    # Resumed mid-stream: 4 steps, a new Trainer restores step 4 and trains the rest.
    build(strategy, model_dir=model_dir).train(4)
    for shape in ("_at_4", "_at_4_mirrored"):  # for the other shapes to continue
        shutil.copytree(model_dir, model_dir + shape)
    resumed = build(strategy, model_dir=model_dir)
    report["restored_step"] = int(resumed.global_step.numpy())
    resumed.train(steps)
    weights = testing.loop_weights(resumed)
    testing.assert_close(weights, exact["weights"], rtol=1e-5, label="resumed vs uninterrupted")
    report["resumed"] = largest_difference({"weights": weights}, exact)
    report["sigusr1"] = preempted_by_sigusr1(strategy, model_dir, exact, steps)
    report["continued"] = continued(strategy, model_dir, exact, steps)
    # Another shape: 2 mirrored replicas saved step 4, the cluster trains on from there.
    reshaped = build(strategy, model_dir=mirrored_dir)
    report["reshaped_restored_step"] = int(reshaped.global_step.numpy())
    reshaped.train(steps)
    weights = testing.loop_weights(reshaped)
    testing.assert_close(weights, exact["weights"], rtol=1e-5, label="mirrored then exact")
    report["reshaped"] = largest_difference({"weights": weights}, exact)


def continued(strategy, model_dir, exact, steps):
    """A new run that goes on from the step-4 checkpoint on the stream's remainder as its
    own data (`loops.WarmStart.continuation`: its next day): the uninterrupted weights, the
    model it starts from evaluated once on its eval data (the temporal evaluation)."""
    stream = tiny_batches(8, 21, shuffle_seed=5)
    run = build(
        strategy,
        train_data=lambda: stream().repeat().skip(4),
        model_dir=model_dir + "_continued",
        warm_start=loops.WarmStart.continuation(model_dir + "_at_4"),
    )
    start = int(run.global_step.numpy())
    report = run.warm_start_report
    run.train(steps)
    weights = testing.loop_weights(run)
    testing.assert_close(weights, exact["weights"], rtol=1e-5, label="continued vs uninterrupted")
    return {
        "from_step": start,
        "evaluated_at_start": report["evaluated_at_start"],
        "left": report["left"],
        "difference": largest_difference({"weights": weights}, exact),
    }


def preempted_by_sigusr1(strategy, model_dir, exact, steps):
    """SIGUSR1 to this process (the chief) as step 2's closures are scheduled: the Trainer
    saves at the next boundary (step 4) and stops, preempted; a new Trainer (the rerun)
    trains on to the uninterrupted weights."""
    trainer = build(strategy, model_dir=model_dir + "_sigusr1")
    coordinator = trainer.coordinator
    schedule = coordinator.schedule
    scheduled = []

    def schedule_then_signal(*args, **kwargs):
        scheduled.append(True)
        if len(scheduled) == 3:  # step 2's first closure
            os.kill(os.getpid(), signal.SIGUSR1)
        return schedule(*args, **kwargs)

    coordinator.schedule = schedule_then_signal
    trainer.train(steps)
    report = {"preempted": trainer.state.preempted, "stopped_at": int(trainer.global_step.numpy())}
    rerun = build(strategy, model_dir=model_dir + "_sigusr1")
    report["restored_step"] = int(rerun.global_step.numpy())
    rerun.train(steps)
    weights = testing.loop_weights(rerun)
    testing.assert_close(weights, exact["weights"], rtol=1e-5, label="preempted, then rerun")
    report["difference"] = largest_difference({"weights": weights}, exact)
    return report


def table_runs(strategy, table_one, model_dir, report):
    """The table model on the cluster: uninterrupted (equal to one replica's `table_one`),
    and saved after step 3 into MODEL_DIR_table_at_3; returns the uninterrupted weights."""
    trainer = build_table(strategy)
    trainer.train(TABLE_STEPS)
    weights = table_weights(trainer)
    report["table_shard_rows"] = [int(shard.shape[0]) for shard in trainer.definition.table.shards]
    testing.assert_close(weights, table_one, rtol=1e-5, label="table vs 1 replica")
    report["table_1 replica"] = largest_difference({"weights": weights}, {"weights": table_one})
    build_table(strategy, model_dir=model_dir + "_table_at_3").train(3)
    shutil.copytree(model_dir + "_table_at_3", model_dir + "_table_at_3_mirrored")
    return weights


def async_runs(strategy, model_dir, steps, report):
    """The asynchronous mode: each batch scheduled once, in order; a resume goes on from the
    first batch not yet scheduled."""
    async_dir = model_dir + "_async"
    first = build(strategy, model_dir=async_dir, parameter_server_mode="async").train(4)
    report["async_first_num_examples"] = first["num_examples"].tolist()
    resumed = build(strategy, model_dir=async_dir, parameter_server_mode="async")
    report["async_resumed_num_examples"] = resumed.train(steps)["num_examples"].tolist()
    report["async_counts"] = resumed.executor.results_extra()["parameter_server"]


def connect_again(spec):
    """This process as the chief of `spec` under a new address (its own server keeps the
    old one)."""
    return testing.parameter_server_strategy(
        {**spec, "chief": [f"127.0.0.1:{launch.free_ports(1)[0]}"]}
    )


def server_rerun(spec, model_dir, exact, steps):
    """The cluster `spec` (its ps_1 started again after the kill, 1 worker of 2): the killed
    run's model_dir trained on, from its last checkpoint, to the uninterrupted weights."""
    trainer = build(connect_again(spec), model_dir=model_dir + "_server")
    restored = int(trainer.global_step.numpy())
    trainer.train(steps)
    weights = testing.loop_weights(trainer)
    testing.assert_close(weights, exact["weights"], rtol=1e-5, label="rerun after the server")
    return {
        "restored_step": restored,
        "difference": largest_difference({"weights": weights}, exact),
    }


def other_shape(spec, model_dir, exact, table_exact, steps):
    """On 1 worker and one server more: the classifier saved by the first cluster at step 4,
    and the table model saved at step 3 (its rows now split in 3), trained to the end."""
    strategy = connect_again(spec)
    classifier = build(strategy, model_dir=model_dir + "_at_4")
    report = {"classifier_restored_step": int(classifier.global_step.numpy())}
    classifier.train(steps)
    weights = testing.loop_weights(classifier)
    testing.assert_close(weights, exact["weights"], rtol=1e-5, label="classifier, other shape")
    report["classifier"] = largest_difference({"weights": weights}, exact)
    table = build_table(strategy, model_dir=model_dir + "_table_at_3")
    report["table_restored_step"] = int(table.global_step.numpy())
    report["table_shard_rows"] = [int(shard.shape[0]) for shard in table.definition.table.shards]
    table.train(TABLE_STEPS)
    weights = table_weights(table)
    testing.assert_close(weights, table_exact, rtol=1e-5, label="table, other shape")
    report["table"] = largest_difference({"weights": weights}, {"weights": table_exact})
    return report


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
