"""Where a run's variables live and its steps run: one `Placement`, read once from the strategy.

The input, the core and the run ask a `Placement` what they need to know of
where they run (whether the variables live on parameter servers, whether the
steps run out of order, whether a global batch can stay in host memory, how a
table's rows are split ...) instead of branching on a strategy's name. The
Trainer builds one from its strategy, its `parameter_server_mode` and its global
batch size, and hands it to every part: the definition (`self.placement`), its
Updates (`UpdateContext.placement`), the tables it builds (`in_force`, around the
build) and the executors; the input, handed a strategy (`loops.distribute`), reads
one from it, since it asks nothing the mode or the global batch changes. Code that
trains without a Trainer makes its own with
`Placement.of(strategy, mode)`; the mode is always said, never assumed.

Under `tf.distribute.ParameterServerStrategy` the variables live on the `ps`
tasks, the `worker` tasks only run functions the coordinator (the `chief`
task, which runs the Trainer) schedules on them, and the chief reads each
step's batches from the train stream at the run's position (`TrainInput`).
`parameter_server_mode` says how a step is applied:
- "exact" (the default): the workers compute the gradients of the step's
  slices on the same weights and the chief applies their sum once
  (`loops.run.parameter_servers.exact_parameter_server`): the losses and weights of one process,
  exact resume mid-stream, recovery from divergence, a retried closure
  changing nothing.
- "async": each step runs whole on one worker, which applies it at once on
  whatever weights it read (`executors.ScheduledExecutor`): every batch is
  scheduled once and a resume continues at the first batch not yet scheduled,
  but the order of the updates, and so the numbers, are not reproducible.
The processes of such a cluster that are no chief serve it
(`loops.cluster.parameter_server.serve_unless_chief`).

Embedding tables are split by rows over the servers (`TablePartitioner`, which
the strategy is made with), over the replicas of a MirroredStrategy or a
MultiWorkerMirroredStrategy of several replicas (one block per replica device,
each worker making and holding only its own replicas' blocks), and lie whole
everywhere else (`Placement.table_row_blocks`).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import operator
import threading
from collections.abc import Iterator

import tensorflow as tf

from loops import topology
from loops.vocabulary import choices

EXACT = "exact"
ASYNC = "async"
# `Placement.kind` of each parameter-server mode; the other kinds are the strategy's name.
_PARAMETER_SERVER_KINDS = {EXACT: "parameter_server_exact", ASYNC: "parameter_server_async"}
# The kinds whose replicas all compute each step together, one copy of each variable a replica.
_SYNCHRONOUS_REPLICAS = ("mirrored", "multi_worker_mirrored")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where the variables of a run under `strategy` live and where its steps run.

    Build it with `Placement.of`. Counts that ask the strategy (replicas,
    workers, servers) are read on first use, so a placement of a strategy that
    is not connected yet answers every question but those.

    Attributes:
        strategy: what the steps run under.
        kind: the strategy's --strategy name ("default", "one_device",
            "mirrored", "central_storage", "multi_worker_mirrored", "tpu"), or
            "parameter_server_exact" / "parameter_server_async" by the mode.
        global_batch_size: the most examples a step's batch holds over all
            replicas (None: not known), which bounds the ids a replica looks up
            in a table in a step where the batch has no static size
            (`derived_lookups`): the same figure for the Update and the tables.
    """

    strategy: tf.distribute.Strategy = dataclasses.field(repr=False, compare=False)
    kind: str
    global_batch_size: int | None = dataclasses.field(default=None, compare=False)

    @classmethod
    def of(
        cls,
        strategy: tf.distribute.Strategy,
        parameter_server_mode: str,
        *,
        global_batch_size: int | None = None,
    ) -> Placement:
        """The placement of a run under `strategy` in `parameter_server_mode` ("exact" or
        "async"; only a ParameterServerStrategy reads it) with `global_batch_size`.

        Raises:
            ValueError: `parameter_server_mode` is neither "exact" nor "async".
        """
        if parameter_server_mode not in _PARAMETER_SERVER_KINDS:
            raise ValueError(
                f"parameter_server_mode must be one of {', '.join(_PARAMETER_SERVER_KINDS)}, "
                f"got {parameter_server_mode!r}."
            )
        name = topology.strategy_name(strategy)
        if name == "parameter_server":
            name = _PARAMETER_SERVER_KINDS[parameter_server_mode]
        return cls(strategy, name, global_batch_size)

    # ---- The step's size. ----

    @property
    def examples_per_replica(self) -> int | None:
        """The most examples one replica's share of a step holds: the global batch size over
        the replicas, rounded up (a partial batch splits unevenly); None where not known."""
        if self.global_batch_size is None:
            return None
        return -(-int(self.global_batch_size) // self.num_replicas_in_sync)

    def derived_lookups(self, ids_each: int | None) -> int | None:
        """The most ids one replica looks up in a table in a step: `examples_per_replica`
        times `ids_each` example; None where either is not known."""
        examples = self.examples_per_replica
        if examples is None or ids_each is None:
            return None
        return examples * ids_each

    @property
    def strategy_name(self) -> str:
        """The strategy's --strategy name, for messages and records."""
        return topology.strategy_name(self.strategy)

    # ---- Where the variables live. ----

    @property
    def variables_on_servers(self) -> bool:
        """The variables live on parameter servers; this process is the coordinator that
        schedules functions on the workers (a `ClusterCoordinator`) and runs the Trainer."""
        return self.kind in _PARAMETER_SERVER_KINDS.values()

    @property
    def variables_apart_from_replicas(self) -> bool:
        """The variables live on another device than the replicas that compute the step
        (central storage's CPU, or parameter servers)."""
        return self.kind == "central_storage" or self.variables_on_servers

    # ---- Where and how a step runs. ----

    @property
    def exact_parameter_server(self) -> bool:
        """The workers compute each step's slices and the chief applies their sum once."""
        return self.kind == _PARAMETER_SERVER_KINDS[EXACT]

    @property
    def steps_out_of_order(self) -> bool:
        """Each step runs whole on a worker and applies at once: the steps run out of order,
        at no position a checkpoint records (the asynchronous parameter-server mode)."""
        return self.kind == _PARAMETER_SERVER_KINDS[ASYNC]

    @property
    def parameter_server_mode(self) -> str | None:
        """The mode ("exact" or "async") where the variables live on servers; else None."""
        return {kind: mode for mode, kind in _PARAMETER_SERVER_KINDS.items()}.get(self.kind)

    @property
    def one_process(self) -> bool:
        """The run is this process alone (no cluster): its saves can run in a background
        thread, since no other worker takes part in their collectives."""
        return self.kind in choices.ONE_PROCESS_STRATEGIES

    @property
    def in_a_cluster(self) -> bool:
        """The run is one task of a cluster of processes, any of which may be lost."""
        return self.strategy_name in choices.CLUSTER_STRATEGIES

    @property
    def loop_run_alone(self) -> bool:
        """This process alone decides each inner loop's length: no other worker or server
        has to agree on it (in the exact parameter-server mode the chief runs the loop)."""
        alone = self.num_workers == 1 and not self.variables_on_servers
        return alone or self.exact_parameter_server

    @property
    def workers_stop_together(self) -> bool:
        """Synchronous workers must agree to stop (a preemption signal to one of them stops
        them all at the same step); under parameter servers the coordinator decides alone."""
        return not self.variables_on_servers and self.num_workers > 1

    # ---- How the input reaches the replicas. ----

    @property
    def global_batches_in_host_memory(self) -> bool:
        """Every replica reads this host's memory (the default strategy, or MirroredStrategy
        over its CPUs): a global batch can be read as one tensor and cut inside the step."""
        if self.kind == "default":
            return True
        return self.kind == "mirrored" and self._replicas_on_cpus

    @property
    def per_replica_input_pipelines(self) -> bool:
        """The replicas are two or more logical CPUs of one host under MirroredStrategy,
        which reads fastest with a pipeline per replica (`loops.distribute`)."""
        if self.kind != "mirrored" or self.num_replicas_in_sync < 2:
            return False
        return len(self.strategy.extended.worker_devices) >= 2 and self._replicas_on_cpus

    @property
    def _replicas_on_cpus(self) -> bool:
        return all(
            tf.DeviceSpec.from_string(device).device_type == "CPU"
            for device in self.strategy.extended.worker_devices
        )

    # ---- Counts the strategy knows, read on first use. ----

    @functools.cached_property
    def num_replicas_in_sync(self) -> int:
        """The replicas that compute each step together (1 under parameter servers)."""
        return int(self.strategy.num_replicas_in_sync)

    @functools.cached_property
    def num_workers(self) -> int:
        """Worker (and chief) tasks of the cluster; 1 outside a cluster."""
        return topology.num_workers(self.strategy)

    @functools.cached_property
    def num_parameter_servers(self) -> int:
        """The `ps` tasks of the cluster; 0 where the variables live on no server."""
        return num_parameter_servers(self.strategy)

    # ---- Embedding tables. ----

    @property
    def tables_split_over_replicas(self) -> bool:
        """A table's rows are split into one block per replica, each held and updated by the
        replica on that device alone (MirroredStrategy or MultiWorkerMirroredStrategy of
        several replicas)."""
        return self.kind in _SYNCHRONOUS_REPLICAS and self.num_replicas_in_sync > 1

    @property
    def tables_split_over_workers(self) -> bool:
        """A table's blocks are held by several processes, each making and holding only its
        own replicas' (`first_table_block` on): a checkpoint gathers them from every worker."""
        return self.tables_split_over_replicas and self.num_workers > 1

    @property
    def table_block_devices(self) -> tuple[str, ...]:
        """The device of each block this process holds, from `first_table_block` on, where the
        replicas hold them; empty where the blocks are placed otherwise (by the strategy's
        partitioner)."""
        if not self.tables_split_over_replicas:
            return ()
        return tuple(self.strategy.extended.worker_devices)

    @property
    def whole_table_device(self) -> str | None:
        """Where a whole table is made as one plain variable: the one replica's device of a
        MirroredStrategy or MultiWorkerMirroredStrategy of one replica, whose own variables
        would be mirrored copies (which have no sparse reads); None where the strategy's own
        variable is the table (one process, one device, parameter servers)."""
        if self.kind not in _SYNCHRONOUS_REPLICAS or self.num_replicas_in_sync > 1:
            return None
        return self.strategy.extended.worker_devices[0]

    @functools.cached_property
    def first_table_block(self) -> int:
        """The first block of `table_row_blocks` this process holds where the replicas hold
        them: its first replica's number in the sync group (0 in one process)."""
        if not self.tables_split_over_workers:
            return 0
        return topology.worker_index(self.strategy) * len(self.table_block_devices)

    def table_split(self, rows: int, *, placed: bool = True) -> str:
        """How the rows of a table of `rows` rows lie here, known before any table is made
        (results.json's `split`): a placed table (`loops.EmbeddingTable`) in "replicas" (one
        block a replica), "servers" (one block a server) or "whole" (one copy); a table not
        placed (a plain `keras.layers.Embedding`) "replicated" (a whole copy a replica) on
        several synchronous replicas, else "whole"."""
        if not placed:
            copies = self.num_replicas_in_sync > 1 and not self.variables_on_servers
            return "replicated" if copies else "whole"
        if self.tables_split_over_replicas:
            return "replicas"
        return "servers" if len(self.table_row_blocks(rows)) > 1 else "whole"

    def table_row_blocks(self, rows: int) -> tuple[tuple[int, int], ...]:
        """How a table of `rows` rows is split here: (first, one-past-last) row of each block.

        Over parameter servers, one block per server (fewer when the table has
        fewer rows), balanced as `topology.replica_bounds` splits a batch (the
        first `rows % servers` one row longer), as `TablePartitioner` has
        TensorFlow split it; over synchronous replicas, one block per replica
        of every worker, balanced the same way (empty ones when the table has
        fewer rows than replicas); elsewhere one block, the whole table.
        """
        if self.tables_split_over_replicas:
            blocks = self.num_replicas_in_sync
        elif self.variables_on_servers:
            blocks = min(self.num_parameter_servers, rows)
        else:
            blocks = 1
        base, extra = divmod(rows, max(blocks, 1))
        bounds = [0]
        for block in range(max(blocks, 1)):
            bounds.append(bounds[-1] + base + (1 if block < extra else 0))
        return tuple(zip(bounds[:-1], bounds[1:]))


def num_parameter_servers(strategy: tf.distribute.Strategy) -> int:
    """The `ps` tasks of the strategy's cluster; 0 outside parameter-server training."""
    if topology.strategy_name(strategy) != "parameter_server":
        return 0
    # The strategy keeps its resolver private; its start connected this task to every server.
    devices = tf.config.list_logical_devices("CPU")
    return len(
        {device.name.split("/device:")[0] for device in devices if "/job:ps/" in device.name}
    )


_splitting = threading.local()
# The placement a Trainer holds in force while its definition builds (`in_force`).
_IN_FORCE: contextvars.ContextVar[Placement | None] = contextvars.ContextVar(
    "placement_in_force", default=None
)


@contextlib.contextmanager
def in_force(where: Placement) -> Iterator[None]:
    """Inside (in this thread), `current` answers `where` for its strategy: the Trainer holds
    its placement in force while the definition builds, so that the tables made there take
    the run's placement (its mode and global batch), not one read again from the strategy."""
    token = _IN_FORCE.set(where)
    try:
        yield
    finally:
        _IN_FORCE.reset(token)


def current(strategy: tf.distribute.Strategy, parameter_server_mode: str) -> Placement:
    """The placement `in_force` for `strategy`; else `strategy`'s in `parameter_server_mode`
    with no global batch (a table built outside a Trainer, by code that said the mode)."""
    where = _IN_FORCE.get()
    if where is not None and where.strategy is strategy:
        return where
    return Placement.of(strategy, parameter_server_mode)


@contextlib.contextmanager
def rows_split_over_servers() -> Iterator[None]:
    """Inside, `TablePartitioner` splits the variables created (by this thread) by rows."""
    before = getattr(_splitting, "active", False)
    _splitting.active = True
    try:
        yield
    finally:
        _splitting.active = before


class TablePartitioner:
    """A `variable_partitioner` for ParameterServerStrategy that splits only embedding tables.

    A variable created inside `rows_split_over_servers()` (as `loops.EmbeddingTable`
    creates its table and its optimizer's slots) is split by rows into
    `num_shards` blocks, one per parameter server (fewer when it has fewer rows);
    every other variable stays whole on one server, as without a partitioner, so
    dense layers and Keras' optimizers see ordinary variables.
    """

    def __init__(self, num_shards: int):
        # Not loops.vocabulary's whole-number check: it is worded for a setting.
        if type(num_shards) is bool or _as_index(num_shards) < 1:
            raise ValueError(
                f"TablePartitioner(num_shards={num_shards!r}) needs a whole number >= 1: "
                "the count of parameter servers."
            )
        self.num_shards = num_shards

    def __call__(self, shape: tf.TensorShape, dtype: tf.DType) -> list[int]:
        del dtype  # rows are split the same way for every type
        whole = [1] * shape.rank
        if not getattr(_splitting, "active", False) or shape.rank == 0:
            return whole
        return [min(self.num_shards, max(1, shape[0]))] + whole[1:]


def _as_index(value: object) -> int:
    """`value` as an int where it is one (numpy integers included), else 0."""
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return 0
