"""Exact parameter-server training: each step's gradients computed by the workers, a slice
each, on the same weights, and the step applied once by the chief.

Under `parameter_server_mode="exact"` (the default for ParameterServerStrategy)
the chief reads step k's global batch from the same stream, at the same
position, as the synchronous strategies (`TrainInput`), and runs the
definition's `train_step` itself, eagerly (`ExactExecutor`). Each
`loops.Update` in it hands its replica function to `WorkerGradients`, which
cuts the batch into one slice per worker (`topology.replica_bounds`, so a
partial final batch is split as replicas split it), schedules one closure per
slice that only computes: the slice's loss divided by its own count, its logs,
its gradients and that count, read on the weights the parameter servers hold
at the step's start. A table's gradient leaves the worker as the slice's
unique ids and their rows (`TableGradients.sent_rows`), so what comes back
follows the batch, not the table (`WorkerGradients.fetched_bytes` counts it).
The chief fetches them and, in one traced function, weights each slice's
gradients and loss by its count and sums them in worker order in float64 (the
gradient accumulation of `loops.Update`, with a worker per micro-batch; a
table's rows concatenated and summed by id), and in the same function the
Update applies that sum once, from the chief, on the variables where they live
(a table through its sparse row update, as on one process). A closure
that TensorFlow retries after a worker failure changes no variable, so the
step's result does not depend on it.

A definition built on `loops.Update` trains unchanged. It must divide its loss
by one count (`loops.scale_to_global_batch`) and keep `grad_accum_steps=1`; an
Update whose loss is over the whole batch (`whole_batch_loss=True`, e.g. an
in-batch softmax) has its step computed whole, as one slice, by one worker.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from loops import placement, tf_private, topology
from loops.definition import executors
from loops.run.parameter_servers import sent_slices
from loops.tables import table_rows

# How often a slice whose worker was lost with its result is computed again, before the
# run stops (its error names the task).
MAX_REFETCHES = 3


class WorkerGradients:
    """Computes an Update's loss, logs and gradients on the workers, a slice each, and sums
    them: an `UpdateContext.slice_gradients`.

    Args:
        coordinator: the ClusterCoordinator of the ParameterServerStrategy.
    """

    def __init__(self, coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator):
        self._coordinator = coordinator
        self._strategy = coordinator.strategy
        self.num_workers = topology.parameter_server_workers(self._strategy)
        # The chief runs the apply through `strategy.run` on purpose (its ops run on the
        # servers that hold the variables); TensorFlow would warn about it on every step.
        tf_private.run_without_coordinator(self._strategy)
        # Per slice function: the tf.function scheduled, and which gradients it returns
        # (a remote function cannot return None: the variables without one are noted).
        self._scheduled: dict[Any, tuple[Any, sent_slices.SliceLayout]] = {}
        self.scheduled_closures = 0  # slices scheduled, in this process
        # Bytes of the slices' results fetched to the chief, in this process: their
        # losses, logs, counts, dense gradients and tables' rows and ids.
        self.fetched_bytes = 0
        self.recomputed_closures = 0  # of them, scheduled again after their worker was lost
        self._checked: set[Any] = set()  # slice functions found to change no variable
        self._device: str | None = None  # where the chief applies the sum, once known
        # The traced sum and apply, by (slice layout, gradients present, the Update's apply).
        self._summing: dict[tuple, Any] = {}
        # Each slice function's concrete functions, by the shapes and dtypes of a slice.
        self._concretes: dict[tuple, Any] = {}

    def __call__(
        self,
        compute: Callable[..., Any],
        args: Sequence[Any],
        *,
        slices: int | None = None,
        then: Callable[..., Any],
    ) -> Any:
        """What `then(loss, logs, gradients)` returns of the slices' sum, traced in the same
        function as the sum (one call on the chief a step: each traced call costs the chief
        its own handling of the arguments)."""
        arguments = self._sliced(args, self.num_workers if slices is None else slices)
        function, layout = self._function(compute)
        if compute not in self._checked:
            check_only_computes(function.get_concrete_function(*arguments[0]))
            self._checked.add(compute)
        remote = [
            self._coordinator.schedule(self._concrete(function, slice_args), args=slice_args)
            for slice_args in arguments
        ]
        self.scheduled_closures += len(remote)
        results = [self._fetched(value, function, a) for value, a in zip(remote, arguments)]
        self.fetched_bytes += sum(np.asarray(part).nbytes for part in tf.nest.flatten(results))
        if self._device is None:  # the chief's, where its own ops run (fetched: NumPy)
            self._device = tf.zeros([]).device
        summed_then = self._summed_then(layout.key, tuple(layout.present), then)
        return summed_then(results)

    def _summed_then(self, key: tuple, present: tuple, then: Callable[..., Any]) -> Any:
        """The traced sum and `then` of one slice layout and one Update's apply, made once.

        Only the fetched tensors are its arguments: the layout (dozens of Python values) is
        held by the function, where as arguments each would be checked on every call
        (benchmarks/RESULTS.md, "Parameter-server modes")."""
        known = self._summing.get((key, present, then))
        if known is None:
            device = self._device

            def summed_then(results: list[Any]) -> Any:
                with tf.device(device):  # the chief's
                    loss, logs, kept = _summed(results, key)
                    gradients = [kept.pop(0) if has else None for has in present]
                    return then(loss, logs, gradients)

            known = self._summing[(key, present, then)] = tf.function(
                summed_then, reduce_retracing=True
            )
        return known

    @staticmethod
    def _sliced(args: Sequence[Any], slices: int) -> list[tuple[Any, Any, Any]]:
        """Each slice's (args, the step's rows, its first row): the batch's tensors of rank >= 1
        cut along their first axis as `topology.replica_bounds` splits rows, on the host (a
        NumPy view a slice: no TensorFlow op a slice on the chief)."""
        parts = tf.nest.flatten(args)
        batched = [isinstance(part, tf.Tensor) and part.shape.rank != 0 for part in parts]
        if not any(batched):
            raise ValueError(
                "parameter_server_mode='exact' cuts a step's batch into one slice per worker "
                "along the first axis of the tensors in the Update's args, and these args hold "
                "no tensor of rank >= 1. Pass the step's batch in args, or "
                "--parameter_server_mode=async."
            )
        hosted = [part.numpy() if cut else part for part, cut in zip(parts, batched)]
        rows = len(hosted[batched.index(True)])
        base, extra = divmod(rows, slices)
        arguments = []
        for worker in range(slices):
            start = worker * base + min(worker, extra)
            end = start + base + (1 if worker < extra else 0)
            sliced = [part[start:end] if cut else part for part, cut in zip(hosted, batched)]
            arguments.append(
                (tf.nest.pack_sequence_as(args, sliced), np.int32(rows), np.int32(start))
            )
        return arguments

    def _concrete(self, function: Any, slice_args: tuple) -> Any:
        """`function`'s concrete function for a slice of these shapes, dtypes and Python
        values, kept: the coordinator takes one as it is, where it would look a tf.function's
        up again on every closure."""
        signature = (function, tuple(_traced_as(leaf) for leaf in tf.nest.flatten(slice_args)))
        concrete = self._concretes.get(signature)
        if concrete is None:
            concrete = self._concretes[signature] = function.get_concrete_function(*slice_args)
        return concrete

    @property
    def slice_traces(self) -> int:
        """How often the slices' functions were traced, in this process: once a loss and
        slice shape (each trace costs the workers tens of milliseconds)."""
        return sum(
            function.experimental_get_tracing_count() for function, _ in self._scheduled.values()
        )

    @property
    def apply_traces(self) -> int:
        """How often the chief's sum-and-apply functions were traced, in this process: once
        a slice layout and Update, and again once the fetched shapes vary."""
        return sum(function.experimental_get_tracing_count() for function in self._summing.values())

    def _fetched(self, value, function, arguments) -> Any:
        """The result of a slice's closure, computed again where the worker that held it was
        lost before it came back (TensorFlow reruns only closures that failed, and a result
        stays on its worker until fetched); a lost server's error is raised at once."""
        for _ in range(MAX_REFETCHES):
            try:
                return value.fetch()
            except (tf.errors.UnavailableError, tf.errors.CancelledError) as error:
                if "/job:ps" in error.message or "/job:worker" not in error.message:
                    raise
            value = self._coordinator.schedule(function, args=arguments)
            self.recomputed_closures += 1
        return value.fetch()

    def _function(self, compute: Callable[..., Any]) -> tuple[Any, sent_slices.SliceLayout]:
        if compute not in self._scheduled:
            strategy = self._strategy
            layout = sent_slices.SliceLayout()

            def on_worker(sliced, step_rows, first_row):
                loss, logs, gradients, count = strategy.run(
                    compute, args=(step_rows, first_row, *sliced)
                )
                return layout.packed(loss, count, logs, gradients)

            self._scheduled[compute] = (tf.function(on_worker), layout)
        return self._scheduled[compute]


def _traced_as(leaf: Any) -> tuple:
    """What a trace of a slice's function sees of one leaf of its arguments: a tensor's or
    array's shape and dtype, a Python value itself (a trace holds it as a constant)."""
    if isinstance(leaf, (tf.Tensor, np.ndarray, np.generic)):
        return (tuple(leaf.shape), leaf.dtype)
    return (type(leaf), leaf)


# Ops that change a variable's value: a slice's closure must run none (it may run twice).
_WRITES = ("Assign", "ResourceScatter", "ResourceApply", "ResourceSparseApply", "ScatterNd")


def check_only_computes(concrete: Any) -> None:
    """Raises ValueError when a slice's traced function changes a variable.

    The exact mode rests on closures that only compute: TensorFlow may run one
    twice after a worker failure, and the chief applies the step once. A layer
    that writes in its forward pass (BatchNormalization's moving statistics, a
    Keras SeedGenerator's state, a metric) would write once per slice and per
    retry, from several workers at once.
    """
    graph_def = concrete.graph.as_graph_def()
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    writes = [node for node in nodes if node.op.startswith(_WRITES)]
    if not writes:
        return
    # A written variable is a captured handle: named from the variables the trace watched.
    handles = {id(variable.handle): variable.name for variable in concrete.graph.variables}
    names = {
        internal.name.split(":")[0]: handles.get(id(external), internal.name)
        for external, internal in concrete.graph.captures
    }
    written = sorted({names.get(node.input[0].split(":")[0], node.input[0]) for node in writes})
    raise ValueError(
        "parameter_server_mode='exact' has each worker compute its slice of a step without "
        "changing any variable (a closure may run twice; the chief applies the step once), "
        f"and this Update's step writes {', '.join(written[:5])} in its forward pass "
        f"({writes[0].op}; e.g. BatchNormalization's moving statistics or Keras' stateful "
        "Dropout). Use layers that write nothing in training (no batch norm; "
        "loops.core.replica_random.StatelessDropout), or --strategy=multi_worker_mirrored."
    )


def _summed(results: list[Any], key: tuple) -> tuple[tf.Tensor, dict[str, tf.Tensor], list[Any]]:
    """The slices' packed results (`sent_slices`) as one replica's, traced on the chief
    (`WorkerGradients._summed_then`): the loss and gradients weighted by each slice's count
    over their total, the logs summed; in worker order, in float64. A table's rows are
    concatenated and summed by id."""
    slices = [sent_slices.unpacked(packs, shapes, key) for packs, shapes in results]
    counts = [tf.cast(result.count, tf.float64) for result in slices]
    total = functools.reduce(operator.add, counts)
    shares = [tf.math.divide_no_nan(count, total) for count in counts]

    def weighted_sum(values):
        return functools.reduce(
            operator.add,
            [share * tf.cast(value, tf.float64) for share, value in zip(shares, values)],
        )

    loss = tf.cast(weighted_sum([result.loss for result in slices]), tf.float32)
    logs = {
        name: tf.cast(
            functools.reduce(operator.add, [tf.cast(r.logs[name], tf.float64) for r in slices]),
            value.dtype,
        )
        for name, value in slices[0].logs.items()
    }
    kept: list[Any] = []
    for index in range(len(slices[0].gradients)):
        sent = [result.gradients[index] for result in slices]
        if not isinstance(sent[0], tuple):
            kept.append(tf.cast(weighted_sum(sent), sent[0].dtype))
            continue
        values = tf.concat(
            [share * tf.cast(part[0], tf.float64) for share, part in zip(shares, sent)], 0
        )
        ids = tf.concat([part[1] for part in sent], 0)
        summed = table_rows.unique_rows(tf.IndexedSlices(values, ids, sent[0][2]))
        kept.append(
            tf.IndexedSlices(tf.cast(summed.values, sent[0][0].dtype), summed.indices, sent[0][2])
        )
    return loss, logs, kept


class ExactExecutor(executors.EagerExecutor):
    """Runs each train step on the chief, whose Updates compute on the workers
    (`WorkerGradients`) and apply once; evaluates on the chief in a `tf.function`.

    Its input is the plain iterator of global batches `TrainInput` positions.

    Args:
        worker_gradients: what the definition's Updates compute on (their
            context's `slice_gradients`, a `WorkerGradients`), whose counts
            results.json reports.
    """

    def __init__(
        self,
        definition: executors.StepDefinition,
        *,
        stop_on_nonfinite: bool,
        worker_gradients: object,
    ):
        super().__init__(definition, stop_on_nonfinite=stop_on_nonfinite)
        self.worker_gradients = worker_gradients

    def results_extra(self) -> dict[str, Any]:
        counts = self.worker_gradients
        if not isinstance(counts, WorkerGradients):
            return {"parameter_server": {"mode": placement.EXACT}}
        return {
            "parameter_server": {
                "mode": placement.EXACT,
                "scheduled_closures": counts.scheduled_closures,
                "recomputed_closures": counts.recomputed_closures,
            }
        }

    def _eval_totals(self, iterator) -> dict[str, tf.Tensor]:
        return executors.Executor._eval_totals(self, iterator)
