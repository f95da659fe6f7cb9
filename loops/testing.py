"""Checks that a definition trains to the same numbers on 1 and N replicas, for users' tests too.

Usage (the CPU must be split before any TensorFlow op runs, e.g. in conftest.py):

    loops.configure_logical_cpus(4)

    def test_my_loop_parity():
        loops.testing.assert_replica_parity(
            lambda strategy: loops.Trainer(MyLoop(), strategy=strategy, train_data=..., seed=1),
            num_steps=5)

`local_parameter_server` starts the workers and servers of a parameter-server
cluster on 127.0.0.1, for this process to be its chief (tests, benchmarks).
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

from loops import placement
from loops.cluster import launch, strategies
from loops.core import health, reporting
from loops.run.trainer import Trainer
from loops.tables import embedding_tables


def replica_strategy(num_replicas: int, name: str = "mirrored") -> tf.distribute.Strategy:
    """The default strategy for 1 replica, else strategy `name` over `num_replicas` devices.

    Args:
        num_replicas: local replicas.
        name: `mirrored` or `central_storage` (the strategies `make_strategy`
            sizes with a replica count).
    """
    if num_replicas == 1:
        return strategies.make_strategy("default")
    return strategies.make_strategy(name, num_replicas)


def quiet_progress() -> reporting.Progress:
    """A Progress that writes into memory (its `stream.getvalue()` holds the lines)."""
    return reporting.Progress(stream=io.StringIO())


def _variables(value) -> list:
    if isinstance(value, (tf.Variable, keras.Variable)):
        return [value]
    return list(getattr(value, "variables", []) or [])


def table_weights(item: object) -> dict[str, np.ndarray]:
    """Each `loops.EmbeddingTable` of a model and each of its slots as one logical (rows, width)
    array, its blocks joined in row order whatever the split (servers, replicas, workers,
    none), keyed `table/<layer name>/<variable>`; {} for anything that is not a Keras model.
    Split over several workers, every worker must call it (its blocks are gathered)."""
    if not isinstance(item, keras.Model):
        return {}
    weights = {}
    for layer in embedding_tables.tables_in(item):
        for name in ("embeddings", *layer.slot_names):
            weights[f"table/{layer.name}/{name}"] = np.asarray(layer.whole(name))
    return weights


def loop_weights(trainer: Trainer, *, check_replicas_agree: bool = True) -> dict[str, np.ndarray]:
    """Every variable the trainer checkpoints, keyed `item/index/name`; a model's
    `loops.EmbeddingTable`s and their slots as one array each, keyed `item/table/layer/name`
    (`table_weights`).

    Args:
        check_replicas_agree: also assert that every replica's copy of a
            mirrored variable holds the same value.
    """
    weights = {"global_step": trainer.global_step.numpy()}
    for item_name, item in trainer.saved_items().items():
        if item_name == "global_step":
            continue
        for key, value in table_weights(item).items():
            weights[f"{item_name}/{key}"] = value
        for index, variable in enumerate(_variables(item)):
            # Keras uniquifies names per process (dense_2, sgd_1); drop the suffixes
            # so the same variable of two loops gets the same key.
            path = re.sub(r"_\d+(?=/|$|_)", "", getattr(variable, "path", None) or variable.name)
            key = f"{item_name}/{index}/{path}"
            # A Keras variable wraps its tf.Variable in `.value`; on a tf.Variable
            # `.value` is a method.
            tensor = variable if isinstance(variable, tf.Variable) else variable.value
            copies = [np.asarray(v) for v in trainer.strategy.experimental_local_results(tensor)]
            if check_replicas_agree:
                for replica, copy in enumerate(copies[1:], start=1):
                    np.testing.assert_array_equal(
                        copy, copies[0], err_msg=f"{key}: replica {replica} differs from replica 0"
                    )
            weights[key] = copies[0]
    return weights


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """||actual - expected|| / ||expected|| (the plain difference when expected is 0)."""
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    difference = float(np.linalg.norm((actual - expected).ravel()))
    scale = float(np.linalg.norm(expected.ravel()))
    return difference / scale if scale > 0 else difference


def assert_close(
    actual: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], *, rtol: float, label: str
) -> None:
    """Asserts equal keys, shapes and a relative error (see above) <= rtol per entry.

    The error is measured per tensor, not per element: a weight whose exact
    gradient cancels to zero carries only rounding noise, and any two summation
    orders (1 device or N) disagree on it element by element.
    """
    if sorted(actual) != sorted(expected):
        raise AssertionError(f"{label}: different entries {sorted(actual)} vs {sorted(expected)}")
    for key in expected:
        want, got = np.asarray(expected[key]), np.asarray(actual[key])
        if want.shape != got.shape:
            raise AssertionError(f"{label}: {key} has shape {got.shape}, expected {want.shape}")
        error = relative_error(got, want)
        if not error <= rtol:
            raise AssertionError(
                f"{label}: {key} differs by {error:.3g} relative (tolerance {rtol:g}); "
                f"got {np.array2string(got.ravel()[:4])}..., expected "
                f"{np.array2string(want.ravel()[:4])}..."
            )


def train_run(
    build_trainer: Callable[[tf.distribute.Strategy], Trainer],
    strategy: tf.distribute.Strategy,
    *,
    num_steps: int,
) -> dict:
    """Trains a fresh Trainer on `strategy`; returns {"logs", "weights", "eval"} to compare."""
    trainer = build_trainer(strategy)
    if trainer.strategy is not strategy:
        raise AssertionError(f"build_trainer ignored the strategy it was given: {strategy!r}.")
    logs = trainer.train(num_steps)
    return {"logs": logs, "weights": loop_weights(trainer), "eval": trainer.state.last_eval_metrics}


def assert_runs_agree(
    run: Mapping[str, Mapping],
    reference: Mapping[str, Mapping],
    *,
    rtol: float = 1e-5,
    label: str,
    compare_logs: Iterable[str] | None = None,
) -> None:
    """Asserts two `train_run` results agree: per-step logs, every weight, eval metrics.

    Args:
        compare_logs: per-step `train_step` outputs to compare; all if None.
        rtol: tolerance on each tensor's relative error (see `assert_close`).
    """
    run_logs, reference_logs = run["logs"], reference["logs"]
    if compare_logs is None:
        # Each run built its model anew: its layers' automatic names differ, not their order.
        run_logs, reference_logs = health.by_position(run_logs), health.by_position(reference_logs)
    names = list(compare_logs) if compare_logs is not None else list(reference_logs)
    assert_close(
        {n: run_logs[n] for n in names},
        {n: reference_logs[n] for n in names},
        rtol=rtol,
        label=label + " logs",
    )
    assert_close(run["weights"], reference["weights"], rtol=rtol, label=label + " weights")
    assert_close(run["eval"], reference["eval"], rtol=rtol, label=label + " eval")


def assert_replica_parity(
    build_trainer: Callable[[tf.distribute.Strategy], Trainer],
    *,
    num_steps: int,
    replica_counts: Sequence[int] = (1, 2, 4),
    compare_logs: Iterable[str] | None = None,
    rtol: float = 1e-5,
    strategy_name: str = "mirrored",
) -> dict[int, dict]:
    """Trains one loop per replica count and asserts they agree.

    Args:
        build_trainer: strategy -> a fresh Trainer (same seed, same data) on it.
        num_steps: steps each loop trains.
        replica_counts: the counts compared; the first is the reference.
        compare_logs: per-step `train_step` outputs to compare; all if None.
        rtol: tolerance relative to each array's largest magnitude.
        strategy_name: the strategy of the counts above 1 (see `replica_strategy`).

    Returns:
        count -> {"logs": per-step logs, "weights": loop_weights, "eval": metrics}.

    Raises:
        AssertionError: naming the first entry that differs and by how much.
    """
    runs = {
        count: train_run(build_trainer, replica_strategy(count, strategy_name), num_steps=num_steps)
        for count in replica_counts
    }
    reference = replica_counts[0]
    for count in replica_counts[1:]:
        assert_runs_agree(
            runs[count],
            runs[reference],
            rtol=rtol,
            compare_logs=compare_logs,
            label=f"{count} vs {reference} replicas",
        )
    return runs


# A worker or ps task: a TensorFlow server of the cluster spec given as JSON, until killed
# or its parent (the chief) ends.
_SERVE = """
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import threading, time
parent = os.getppid()

def end_with_the_parent():
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)

threading.Thread(target=end_with_the_parent, daemon=True).start()
import tensorflow as tf
spec, job, index = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3])
tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job, task_index=index).join()
"""


def local_parameter_server(
    workers: int, servers: int
) -> tuple[dict[str, list[str]], dict[str, subprocess.Popen]]:
    """Starts `workers` worker and `servers` ps processes on free ports of 127.0.0.1.

    Returns the cluster spec (its chief is this process) and the processes by task
    name (`worker_1`), for the caller to kill. Connect with
    `parameter_server_strategy(spec)` once they may have started (it waits for them).
    """
    addresses = [f"127.0.0.1:{port}" for port in launch.free_ports(1 + workers + servers)]
    spec = {
        "chief": addresses[:1],
        "worker": addresses[1 : 1 + workers],
        "ps": addresses[1 + workers :],
    }
    tasks = [("worker", index) for index in range(workers)]
    tasks += [("ps", index) for index in range(servers)]
    processes = {f"{job}_{index}": serve_task(spec, job, index) for job, index in tasks}
    return spec, processes


def serve_task(spec: Mapping[str, list[str]], job: str, index: int) -> subprocess.Popen:
    """Starts task `index` of `job` in the cluster `spec` at its address: one process of
    `local_parameter_server`, or a killed one started again."""
    return subprocess.Popen(
        [sys.executable, "-c", _SERVE, json.dumps(dict(spec)), job, str(index)],
        stdin=subprocess.DEVNULL,
        # Not the chief's pipes: a reader of its output would wait for the servers too.
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def parameter_server_strategy(spec: Mapping[str, list[str]]) -> tf.distribute.Strategy:
    """This process as the chief of the cluster `spec`: its ParameterServerStrategy, which
    splits embedding tables over the servers as `loops.make_strategy` does.

    A process may connect to another cluster later (another shape, or the same tasks
    started again) through a spec that gives the chief a new address: its own server
    keeps the old one.
    """
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(dict(spec)), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    return tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=placement.TablePartitioner(len(spec.get("ps", [])))
    )
