"""Executors: run a loop's train steps and eval passes (compiled, eager, or scheduled on
parameter-server workers) under one contract.

Every executor feeds a train step exactly `batches_per_step` batches through
the same stand-in iterator, flattens its typed outputs (`loops.core.outputs`) the
same way, counts the global step, ends an inner loop right after a step that a
`loops.Flag` output (`nonfinite`) marks when asked to, and reports whether the
weights are still finite. They differ only in where and how the steps run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

from loops import placement, tf_private, topology
from loops.core import outputs
from loops.input import distributed_input
from loops.model_dir.checkpoints import FinitenessCheck

# The framework's own functions have no Python control flow on tensors below the traced
# entry points, so AutoGraph calls them as written (it spent over half the tracing time
# rewriting them); a user's step and loss are still converted where they are called, and
# so are the kinds', which are written as a user writes a step (`for t in tf.range(...)`) and
# call hooks a user's subclass may override. The kinds' library (losses and metrics, pure
# functions that call no user code) is left as written too: its rule, added last, is checked
# first (over a second of a retrieval run's tracing went to rewriting it).
tf_private.leave_unconverted_by_autograph("loops", except_in=("loops.kinds",))
tf_private.leave_unconverted_by_autograph("loops.kinds.library")


class StepsRun(NamedTuple):
    """What an inner loop did."""

    logs: dict[str, np.ndarray]  # output columns (`outputs.columns`), a row per step run
    kinds: dict[str, type]  # output name -> Mean | Ratio | Sum | Last
    reached: int  # the global step after it
    weights_finite: bool  # whether every checkpointed float variable is finite after it


class StepDefinition(NamedTuple):
    """The parts of a loop an executor runs."""

    name: str  # for errors: the loop's class name
    strategy: tf.distribute.Strategy
    placement: placement.Placement
    train_step: Callable[[Any], Mapping[str, outputs.Output]]
    eval_step: Callable[[Any], Mapping[str, outputs.Output]]
    batches_per_step: int
    global_step: tf.Variable
    finiteness: FinitenessCheck
    has_convolution: bool = False  # whether its models hold one (`has_convolution`)


def has_convolution(root: Any) -> bool:
    """Whether a Keras convolution layer (Conv1D-3D, transposed, depthwise, separable) is among
    the objects `root` tracks: the one kind of op oneDNN gets wrong on an empty replica."""
    return any(
        isinstance(item, keras.layers.Layer) and "Conv" in type(item).__name__
        for item in tf.train.TrackableView(root).descendants()
    )


class Executor:
    """Runs steps in traced `tf.function`s; the base of the eager and scheduled executors.

    Args:
        definition: the steps to run and the state they count on.
        stop_on_nonfinite: end an inner loop right after a step that a
            `loops.Flag` output marks (Update's `nonfinite`), where the run's
            policy acts on it (all but "skip").
    """

    def __init__(self, definition: StepDefinition, *, stop_on_nonfinite: bool):
        self.definition = definition
        self.stop_on_nonfinite = stop_on_nonfinite
        self.train_kinds: dict[str, type] | None = None
        self.eval_kinds: dict[str, type] | None = None
        # The traced functions, once run (tests count their traces).
        self.train_function: Any = None
        self.eval_function: Any = None
        self._train_call: Any = None
        # One tf.function for the eval step: the trace that finds its output names is the
        # one the eval pass calls (a new tf.function each time traced the step twice).
        self.eval_step_function = tf.function(self.flat_eval_step)

    # ---- The contract, the same in every mode. ----

    def flat_train_step(self, *batches) -> dict[str, tf.Tensor]:
        """One train step fed the batches dequeued for it, its outputs as columns.

        With no batches (a loop without train data) the step gets None.
        """
        definition = self.definition
        train_step = _as_traced_calls_it(definition.train_step)
        if not batches:
            step_outputs = train_step(None)
        else:
            queue = _DequeuedBatches(batches, definition.name)
            step_outputs = train_step(queue)
            queue.check_all_taken()
        flat, self.train_kinds = outputs.columns(step_outputs, "train_step")
        return flat

    def flat_eval_step(self, batch) -> dict[str, tf.Tensor]:
        flat, self.eval_kinds = outputs.columns(
            _as_traced_calls_it(self.definition.eval_step)(self._replica_eval_batch(batch)),
            "eval_step",
            arrays=True,
        )
        return flat

    def _replica_eval_batch(self, batch):
        """An eval batch as the eval step takes it: a global batch read whole (where the
        replicas share the host's memory: `distributed_input.eval_dataset`) cut into the
        replicas' slices as a train step's is; a distributed one as it came."""
        strategy = self.definition.strategy
        if not self.definition.placement.global_batches_in_host_memory:
            return batch
        if any(
            isinstance(part, tf.distribute.DistributedValues) for part in tf.nest.flatten(batch)
        ):
            return batch
        return distributed_input.replica_batches(batch, strategy)

    def dequeue(self, iterator) -> tuple:
        """The batches of one step (none without an iterator)."""
        if iterator is None:
            return ()
        return tuple(
            distributed_input.next_batch(iterator, self.definition.strategy)
            for _ in range(self.definition.batches_per_step)
        )

    def eval_output_names(self, element_spec) -> set[str]:
        """The outputs an evaluation reports as metrics (its numbers, not its arrays), found
        by tracing the eval step (nothing runs)."""
        traced = self.eval_step_function.get_concrete_function(element_spec)
        columns = traced.structured_outputs
        return {name for name in self.eval_kinds or () if columns[name].shape.rank == 0}

    def results_extra(self) -> dict[str, Any]:
        """What results.json holds about how the steps ran, beside the run's own entries."""
        return {}

    # ---- Running. ----

    def run(self, iterator, steps: int) -> StepsRun:
        """Runs up to `steps` train steps (fewer after a non-finite one under "stop")."""
        with _explains_empty_replicas(self.definition):
            return self._run(iterator, steps)

    def evaluate(self, iterator) -> dict[str, Any]:
        """One pass over a finite eval iterator; the outputs aggregated over its batches
        (a number each, an array for an array Sum or a Highest)."""
        with _explains_empty_replicas(self.definition):
            totals = self._eval_totals(iterator)
        if self.eval_kinds is None:  # no batch at all
            return {}
        return outputs.finish_totals(
            self.eval_kinds, {name: value.numpy() for name, value in totals.items()}
        )

    def _run(self, iterator, steps: int) -> StepsRun:
        if self._train_call is None:
            self.train_function = self._make_train_function(iterator)
            # Calling the traced function itself skips tf.function's argument
            # matching on every call (benchmarks/RESULTS.md).
            self._train_call = self.train_function.get_concrete_function(
                iterator, tf.TensorSpec([], tf.int32)
            )
        assert self._train_call is not None  # traced just above
        logs, reached, weights_finite = self._train_call(iterator, tf.constant(steps, tf.int32))
        return StepsRun(
            {name: value.numpy() for name, value in logs.items()},
            dict(self.train_kinds or {}),
            int(reached),
            bool(weights_finite),
        )

    def _eval_totals(self, iterator) -> dict[str, tf.Tensor]:
        if self.eval_function is None:
            self.eval_function = tf.function(self._eval_pass)
        return self.eval_function(iterator)

    def _eval_pass(self, iterator) -> dict[str, tf.Tensor]:
        step_function = self.eval_step_function.get_concrete_function(iterator.element_spec)
        kinds = dict(self.eval_kinds or {})
        totals = outputs.start_totals(kinds, step_function.structured_outputs)
        optional = iterator.get_next_as_optional()
        while optional.has_value():
            totals = outputs.accumulate(kinds, totals, step_function(optional.get_value()))
            optional = iterator.get_next_as_optional()
        return totals

    def _traced_step(self, iterator):
        # The step is traced once on its own to learn the outputs' names and
        # dtypes (the TensorArrays must exist before the loop); the loop then
        # calls this same trace instead of tracing the step a second time.
        if iterator is None:
            return tf.function(self.flat_train_step).get_concrete_function()
        return tf.function(self.flat_train_step).get_concrete_function(
            *_input_specs(self.dequeue, iterator)
        )

    def _make_train_function(self, iterator):
        definition = self.definition
        step_function = self._traced_step(iterator)
        output_spec = step_function.structured_outputs
        # Tracing the step set its kinds: the flags are the outputs of kind Flag.
        stop_flags = outputs.flag_names(self.train_kinds or {}) if self.stop_on_nonfinite else []
        # The logs go into TensorArrays, a row a step: numbers and booleans
        # all into one of float64 (exactly: see `_packed`), anything else one
        # per dtype. One write a step instead of one per log or per dtype
        # (BUILD.md, Decisions, "One TensorArray holds a step's logs"). Keyed
        # by the array's dtype name: loop variables are nested dicts, whose
        # keys nest sorts.
        groups: dict[str, list[str]] = {}
        for name, value in output_spec.items():
            groups.setdefault(_array_dtype(value.dtype).name, []).append(name)
        global_step = definition.global_step

        def inner_loop(iterator, steps):
            arrays = {
                key: tf.TensorArray(tf.as_dtype(key), size=steps, element_shape=[len(names)])
                for key, names in groups.items()
            }

            # Each step dequeues its own batches: carrying step i + 1's batches
            # as a loop variable, dequeued while step i computes, no longer
            # paid once the read is one synchronous kernel (BUILD.md,
            # Decisions, "Each step dequeues its own batches"); the
            # distributed iterator, where used, buffers ahead by itself.
            def body(i, arrays, stopped):
                logs = step_function(*self.dequeue(iterator))
                global_step.assign_add(1)
                arrays = {
                    key: arrays[key].write(i, tf.stack([_packed(logs[name]) for name in names]))
                    for key, names in groups.items()
                }
                if stop_flags:
                    stopped = tf.reduce_any(tf.stack([logs[name] > 0 for name in stop_flags]))
                return i + 1, arrays, stopped

            # The stop is part of the loop's condition: a Python `break` here
            # becomes conds around the rest of the body, a cost every step
            # (BUILD.md, Decisions, "Each step dequeues its own batches").
            _, arrays, _ = tf.while_loop(
                lambda i, arrays, stopped: tf.logical_and(i < steps, tf.logical_not(stopped)),
                body,
                (tf.constant(0), arrays, tf.constant(False)),
            )
            # Rows after an early stop are never written; the host drops them.
            # The step reached and whether the weights are finite come back with
            # the logs: separate reads from the host cost a device sync each.
            logs = {}
            for key, names in groups.items():
                rows = arrays[key].stack()
                for column, name in enumerate(names):
                    logs[name] = _unpacked(rows[:, column], output_spec[name].dtype)
            return logs, global_step.read_value(), definition.finiteness.all_finite()

        return tf.function(inner_loop)


def _as_traced_calls_it(step: Callable[..., Any]) -> Callable[..., Any]:
    """A definition's step as a trace calls it: converted by AutoGraph where the code calling
    it is; as written when it runs eagerly (the eager and exact executors), where Python
    control flow on tensors needs no conversion and a conversion each step would cost the
    chief milliseconds a step (AutoGraph re-makes the converted function on every call)."""
    if not tf.inside_function():
        return step
    return tf_private.converted_as_the_caller_is(step)


class EagerExecutor(Executor):
    """Runs every step and eval batch as plain Python calls, for debugging with print and pdb."""

    def _run(self, iterator, steps: int) -> StepsRun:
        rows = []
        for _ in range(steps):
            rows.append(
                {
                    name: value.numpy()
                    for name, value in self.flat_train_step(*self.dequeue(iterator)).items()
                }
            )
            self.definition.global_step.assign_add(1)
            flags = outputs.flag_names(self.train_kinds or {})
            if self.stop_on_nonfinite and any(rows[-1][name] > 0 for name in flags):
                break
        logs = {name: np.array([row[name] for row in rows]) for name in rows[0]}
        return StepsRun(
            logs,
            dict(self.train_kinds or {}),
            int(self.definition.global_step.numpy()),
            not self.definition.finiteness.nonfinite_names(),
        )

    def _eval_totals(self, iterator) -> dict[str, tf.Tensor]:
        totals = None
        optional = iterator.get_next_as_optional()
        while optional.has_value():
            flat = self.flat_eval_step(optional.get_value())
            kinds = self.eval_kinds or {}
            totals = outputs.accumulate(kinds, totals or outputs.start_totals(kinds, flat), flat)
            optional = iterator.get_next_as_optional()
        return totals or {}


class ScheduledExecutor(Executor):
    """Schedules each train step on a parameter-server worker, which applies it at once
    (`parameter_server_mode="async"`); the coordinator evaluates.

    The coordinator reads each step's batches from the train stream at the
    run's position and schedules the step with them, once: every batch of an
    epoch is trained on (a step TensorFlow retries after a worker failure runs
    again on the same batches), and a resume continues at the first batch not
    yet scheduled. The steps run on whatever weights their worker reads and
    apply their updates in the order they finish: not reproducible. Each
    scheduled call adds 1 to the global step on the parameter servers, so the
    global step counts the steps that completed, and 1 to a count of step runs,
    so that the runs beyond the steps scheduled are the retries. An inner
    loop waits for all of them and returns their logs in the order they were
    scheduled. A step a `loops.Flag` output marks does not stop the others
    already scheduled.

    Args:
        coordinator: the ClusterCoordinator of the ParameterServerStrategy.
    """

    def __init__(
        self,
        definition: StepDefinition,
        *,
        coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator,
    ):
        super().__init__(definition, stop_on_nonfinite=False)
        self.coordinator = coordinator
        self._step_function = None
        self.scheduled_steps = 0  # by this executor, in this process
        with definition.strategy.scope():  # on a parameter server: every worker adds to it
            self._step_runs = tf.Variable(0, dtype=tf.int64, trainable=False, name="step_runs")

    def results_extra(self) -> dict[str, Any]:
        runs = int(self._step_runs.numpy())
        return {
            "parameter_server": {
                "mode": placement.ASYNC,
                "scheduled_steps": self.scheduled_steps,
                "step_runs": runs,
                "retried_steps": runs - self.scheduled_steps,
            }
        }

    def _run(self, iterator, steps: int) -> StepsRun:
        definition = self.definition
        if self._step_function is None:

            def counted_step(*batches):
                logs = self.flat_train_step(*batches)
                definition.global_step.assign_add(1)
                self._step_runs.assign_add(1)
                return logs

            self._step_function = tf.function(counted_step)
        remote_logs = [
            self.coordinator.schedule(self._step_function, args=self.dequeue(iterator))
            for _ in range(steps)
        ]
        self.scheduled_steps += steps
        self.coordinator.join()
        rows = [self.coordinator.fetch(logs) for logs in remote_logs]
        logs = {name: np.array([row[name] for row in rows]) for name in rows[0]}
        return StepsRun(
            logs,
            dict(self.train_kinds or {}),
            int(definition.global_step.numpy()),
            not definition.finiteness.nonfinite_names(),
        )


def _array_dtype(dtype: tf.DType) -> tf.DType:
    """The dtype of the TensorArray that keeps logs of `dtype`: float64 for numbers and booleans."""
    return tf.float64 if dtype.is_floating or dtype.is_integer or dtype == tf.bool else dtype


def _packed(value: tf.Tensor) -> tf.Tensor:
    """`value` as its TensorArray keeps it, exactly: a number or boolean as float64 (64-bit
    integers' bits carried, the rest widened), anything else as it is."""
    if _wide_integer(value.dtype):  # beyond 2**53, a cast would round
        return tf.bitcast(value, tf.float64)
    return tf.cast(value, _array_dtype(value.dtype))


def _unpacked(column: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """The inverse of `_packed`: a column of a TensorArray back in the log's own dtype."""
    if _wide_integer(dtype):
        return tf.bitcast(column, dtype)
    return tf.cast(column, dtype)


def _wide_integer(dtype: tf.DType) -> bool:
    return dtype.is_integer and dtype.size == 8


def _input_specs(dequeue: Callable, iterator) -> tuple:
    """The type specs of what `dequeue(iterator)` returns in a tf.function (traced, not run)."""
    specs: list = []

    def probe(iterator):
        specs.extend(
            tf.nest.map_structure(tf.type_spec_from_value, batch) for batch in dequeue(iterator)
        )
        return tf.constant(0)

    tf.function(probe).get_concrete_function(iterator)
    return tuple(specs)


class _DequeuedBatches:
    """Stands in for the train iterator inside a step: hands out the batches dequeued for it."""

    def __init__(self, batches, loop_name: str):
        self._batches = list(batches)
        self._taken = 0
        self._loop_name = loop_name

    def __iter__(self):
        return self

    def __next__(self):
        if self._taken == len(self._batches):
            raise ValueError(
                f"{self._loop_name}.train_step called next(iterator) more than "
                f"batches_per_step = {len(self._batches)} times; set the class attribute "
                "batches_per_step to the number of batches one step takes."
            )
        self._taken += 1
        return self._batches[self._taken - 1]

    def get_next(self):
        return next(self)

    def check_all_taken(self) -> None:
        if self._taken != len(self._batches):
            raise ValueError(
                f"{self._loop_name}.train_step took {self._taken} batches but "
                f"batches_per_step = {len(self._batches)}; set batches_per_step to the number "
                "of batches one step takes (it also sets where a resumed run restarts)."
            )


@contextlib.contextmanager
def _explains_empty_replicas(definition: StepDefinition):
    """Adds a likely cause to an InvalidArgumentError of a multi-replica step of a model with
    a convolution under oneDNN.

    TensorFlow's oneDNN convolution gives an input with no rows an output of
    the input's shape (BUILD.md fact 17), so a replica left without examples
    (a batch with fewer rows than replicas) fails later with an error that
    names neither, and in several forms (a collective's shape mismatch, a
    convolution's "input depth must be evenly divisible", a matmul's sizes).
    The error itself is kept; a note says what to change if that was the cause.
    A model without a convolution gets no note: its own ops failed.
    """
    try:
        yield
    except tf.errors.InvalidArgumentError as error:
        replicas = definition.strategy.num_replicas_in_sync
        if replicas > 1 and definition.has_convolution and topology.onednn_enabled():
            error.add_note(
                f"loops: if a batch had fewer rows than the {replicas} replicas, a replica held "
                "none, and TensorFlow's oneDNN convolutions give an empty input an output of the "
                f"wrong shape (BUILD.md fact 17). Give every batch of your train_data at least "
                f"{replicas} rows (tf.data's .batch(global_batch_size, drop_remainder=True), or "
                "an endless stream of full batches: .repeat() before .batch), or set "
                "TF_ENABLE_ONEDNN_OPTS=0 before TensorFlow is imported."
            )
        raise
