"""The Placement: its answers for each strategy and mode, and no branch on a strategy elsewhere."""

import ast
import os
import types

import pytest
import tensorflow as tf

import loops
from loops import placement, tf_private, topology
from loops.placement import Placement

FRAMEWORK = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "loops")
# Where the strategy's kind may be asked by name: the placement itself, the ground floor it
# reads, and the wing and the command line that make a strategy from its name.
OWNERS = ("placement.py", "topology.py", "cluster/", "cli/")
# Modules outside OWNERS that still branch on the strategy or the mode, each with its reason.
EXCEPTIONS: dict[str, str] = {}
# What a branch on the strategy's kind compares: its names and the parameter-server modes,
# or the sets of them `loops.vocabulary.choices` declares.
KIND_WORDS = {*loops.STRATEGY_NAMES, "exact", "async"}
KIND_SETS = {
    "STRATEGY_NAMES",
    "ONE_PROCESS_STRATEGIES",
    "LOCAL_REPLICA_STRATEGIES",
    "CLUSTER_STRATEGIES",
    "PARAMETER_SERVER_MODES",
    "EXACT",
    "ASYNC",
}


def _names(node: ast.AST) -> set[str]:
    return {
        sub.id if isinstance(sub, ast.Name) else sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, (ast.Name, ast.Attribute))
    }


def branch_sites(source: str) -> list[int]:
    """Lines of `source` that branch on the strategy's kind or the parameter-server mode:
    a comparison on `strategy_name(...)`, a strategy name, a mode or a set of them, or an
    isinstance on a strategy class (or on a tuple of them named in the module)."""
    tree = ast.parse(source)
    strategy_tuples = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(n.endswith("Strategy") for n in _names(node.value))
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            constants = [sub for part in parts for sub in ast.walk(part)]
            words = {sub.value for sub in constants if isinstance(sub, ast.Constant)}
            names = set().union(*(_names(part) for part in parts))
            if "strategy_name" in names or names & KIND_SETS or words & KIND_WORDS:
                lines.append(node.lineno)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance":
            classes = _names(node.args[1])
            if any(n.endswith("Strategy") for n in classes) or classes & strategy_tuples:
                lines.append(node.lineno)
    return sorted(lines)


def test_the_scan_finds_each_form_of_branch_on_the_strategy():
    source = "\n".join(
        [
            "APART = (tf.distribute.MirroredStrategy,)",
            "a = topology.strategy_name(strategy) == 'x'",
            "b = name != 'mirrored'",
            "c = mode == EXACT",
            "d = name in ONE_PROCESS_STRATEGIES",
            "e = isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)",
            "f = isinstance(strategy, APART)",
            "g = placement.steps_out_of_order and rows == 2",
            "h = isinstance(strategy, dict)",
        ]
    )
    assert branch_sites(source) == [2, 3, 4, 5, 6, 7]


def test_no_module_but_the_placement_branches_on_the_strategy_or_the_mode():
    found = {}
    for directory, _, files in os.walk(FRAMEWORK):
        for file in files:
            path = os.path.join(directory, file)
            module = os.path.relpath(path, FRAMEWORK).replace(os.sep, "/")
            if not file.endswith(".py") or module.startswith(OWNERS):
                continue
            with open(path, encoding="utf-8") as source:
                lines = branch_sites(source.read())
            if lines:
                found[module] = lines
    assert found.keys() == EXCEPTIONS.keys(), (
        f"{found}: ask loops.placement.Placement instead of the strategy's name or the mode"
    )
    with open(os.path.join(FRAMEWORK, "placement.py"), encoding="utf-8") as source:
        assert len(branch_sites(source.read())) >= 5  # where they are now


ANSWERS = (
    "kind",
    "variables_on_servers",
    "variables_apart_from_replicas",
    "exact_parameter_server",
    "steps_out_of_order",
    "parameter_server_mode",
    "one_process",
    "in_a_cluster",
    "loop_run_alone",
    "workers_stop_together",
    "global_batches_in_host_memory",
    "per_replica_input_pipelines",
    "num_replicas_in_sync",
    "num_workers",
    "num_parameter_servers",
)


def answers(where: Placement) -> dict:
    return {name: getattr(where, name) for name in ANSWERS}


def expected(kind, replicas, workers=1, servers=0, **differences) -> dict:
    """The answers of a one-process strategy with `replicas`, with `differences`."""
    plain = dict.fromkeys(ANSWERS, False)
    plain.update(kind=kind, parameter_server_mode=None, one_process=True, loop_run_alone=True)
    plain.update(num_replicas_in_sync=replicas, num_workers=workers, num_parameter_servers=servers)
    return {**plain, **differences}


def test_the_one_process_strategies():
    def of(name, replicas=1):
        return answers(Placement.of(loops.make_strategy(name, replicas), "exact"))

    assert of("default") == expected("default", 1, global_batches_in_host_memory=True)
    assert of("one_device") == expected("one_device", 1)
    assert of("mirrored", 2) == expected(
        "mirrored", 2, global_batches_in_host_memory=True, per_replica_input_pipelines=True
    )
    assert of("central_storage", 2) == expected(
        "central_storage", 2, variables_apart_from_replicas=True
    )
    # MirroredStrategy splits a table over its replicas, the other strategies keep it whole.
    assert Placement.of(loops.make_strategy("mirrored", 2), "exact").table_row_blocks(10) == (
        (0, 5),
        (5, 10),
    )
    assert Placement.of(loops.make_strategy("central_storage", 2), "exact").table_row_blocks(
        10
    ) == ((0, 10),)


class Resolver:
    """A cluster of a chief and one worker, seen from the chief."""

    task_type, task_id = "chief", 0

    def cluster_spec(self):
        return tf.train.ClusterSpec({"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]})


def test_multi_worker_mirrored_workers_stop_together():
    # Only the class name and the resolver are read; a real one would start collectives.
    attributes = {"cluster_resolver": Resolver(), "num_replicas_in_sync": 2}
    strategy = type("CollectiveAllReduceStrategy", (), attributes)()
    assert answers(Placement.of(strategy, "exact")) == expected(
        "multi_worker_mirrored",
        2,
        workers=2,
        one_process=False,
        in_a_cluster=True,
        loop_run_alone=False,
        workers_stop_together=True,
    )
    # One replica a worker: a table's rows split over both, the chief holding the first block.
    assert Placement.of(strategy, "exact").table_row_blocks(5) == ((0, 3), (3, 5))
    assert Placement.of(strategy, "exact").tables_split_over_workers


def test_a_worker_holds_the_table_blocks_of_its_own_replicas():
    class Worker(Resolver):
        task_type, task_id = "worker", 0  # after the chief

    extended = types.SimpleNamespace(worker_devices=("/job:worker/task:0/device:CPU:0",))
    attributes = {"cluster_resolver": Worker(), "num_replicas_in_sync": 2, "extended": extended}
    worker = Placement.of(type("CollectiveAllReduceStrategy", (), attributes)(), "exact")
    assert worker.table_block_devices == extended.worker_devices
    assert worker.first_table_block == 1  # the chief's replica is number 0
    chief = Placement.of(
        type("CollectiveAllReduceStrategy", (), {**attributes, "cluster_resolver": Resolver()})(),
        "exact",
    )
    assert chief.first_table_block == 0


def test_parameter_servers_in_each_mode_and_their_tables_split_by_rows(monkeypatch):
    # Two workers and three servers; a real strategy would connect to them.
    monkeypatch.setattr(placement, "num_parameter_servers", lambda strategy: 3)
    attributes = {tf_private.PARAMETER_SERVER_WORKERS: 2, "num_replicas_in_sync": 1}
    strategy = type("ParameterServerStrategyV2", (), attributes)()
    on_servers = dict(
        variables_on_servers=True,
        variables_apart_from_replicas=True,
        one_process=False,
        in_a_cluster=True,
    )
    exact = Placement.of(strategy, "exact")
    assert answers(exact) == expected(
        "parameter_server_exact",
        1,
        workers=3,
        servers=3,
        **on_servers,
        exact_parameter_server=True,
        parameter_server_mode="exact",
    )
    assert answers(Placement.of(strategy, "async")) == expected(
        "parameter_server_async",
        1,
        workers=3,
        servers=3,
        **on_servers,
        steps_out_of_order=True,
        parameter_server_mode="async",
        loop_run_alone=False,
    )
    # As loops.TablePartitioner has TensorFlow split them: the first blocks one row longer.
    assert exact.table_row_blocks(20) == ((0, 7), (7, 14), (14, 20))
    assert exact.table_row_blocks(20) == tuple(
        tuple(int(bound) for bound in topology.replica_bounds(tf.constant(20), block, 3))
        for block in range(3)
    )
    assert exact.table_row_blocks(2) == ((0, 1), (1, 2))
    assert placement.TablePartitioner(3)(tf.TensorShape([2, 4]), tf.float32) == [1, 1]


def test_an_unknown_mode_is_refused_naming_it():
    with pytest.raises(
        ValueError, match=r"parameter_server_mode must be one of exact, async, got 'sync'\."
    ):
        Placement.of(tf.distribute.get_strategy(), "sync")


def test_the_trainer_reads_its_placement_once_and_hands_it_to_its_parts():
    strategy = loops.make_strategy("mirrored", 2)
    trainer = loops.Trainer(loops.Loop(), strategy=strategy, model_dir=None)
    assert trainer.placement == Placement(strategy, "mirrored")
    assert trainer.placement.strategy is strategy
    assert trainer.step_context.placement is trainer.placement
    assert trainer.controller.placement is trainer.placement
