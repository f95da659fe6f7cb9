"""The one update path every step uses: from each replica's share of a loss to applied weights.

A step describes only its loss; `Update` does the rest the same way for the
classifier, both GAN networks, PPO and DQN: the model's regularization
losses added once, a float16 loss scale, the gradients, a finiteness check
that covers every replica, clipping by the global norm of the summed
gradient, and applying (or leaving out) the update as the loop's
`on_nonfinite` policy says; with gradient accumulation, all of it over the
sum of K micro-batches' gradients. It also measures the step's health
(`loops.core.health`): the gradient's global norm, clipping, update sizes.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import keras
import tensorflow as tf

from loops.core import (
    compilation,
    embedding_tables,
    health,
    keras_private,
    micro_batches,
    mixed_precision,
    outputs,
    reduction,
    table_rows,
    update_context,
)
from loops.core.gradients import all_finite
from loops.core.health import Totals, UpdateHealth
from loops.core.table_updates import TableGradients, check_own_tables
from loops.core.update_context import UpdateContext
from loops.core.weight_average import WeightAverage
from loops.topology import replica_bounds
from loops.vocabulary.whole_numbers import check_whole

# A replica function's result: its share of the loss (already divided by the
# real global count, `loops.scale_to_global_batch`) and scalars to sum over replicas.
ReplicaLoss = Callable[..., "tuple[tf.Tensor, Mapping[str, tf.Tensor]]"]


class UpdateResult(NamedTuple):
    """What one update did, in cross-replica context."""

    sums: dict[str, tf.Tensor]  # "loss" and the replica function's logs, summed over replicas
    skipped: tf.Tensor  # 1.0 when the update was left out on every replica
    # 1.0 when the loss or a gradient was not finite on some replica for a reason a
    # loss scale does not explain: what the loop's on_nonfinite policy acts on.
    nonfinite: tf.Tensor
    overflow: tf.Tensor  # 1.0 when it was skipped as a float16 loss-scale overflow
    loss_scale: tf.Tensor | None  # the loss scale it used; None without one
    # The gradient's global norm, whether it was clipped, the update/weight ratios;
    # None when the run's health_every is None.
    health: UpdateHealth | None = None

    @property
    def outputs(self) -> dict[str, outputs.Output]:
        """ "nonfinite", the health metrics (and "loss_scale", "overflow") as step outputs."""
        return update_outputs([self])

    def health_totals(self) -> Totals:
        """Its health as sums to add over a step's updates (`loops.core.health.add`); {}
        without health metrics."""
        if self.health is None:
            return {}
        counted = None if self.loss_scale is None else 1.0 - self.overflow
        return health.totals(self.health, counted)


def update_outputs(results: Sequence[UpdateResult], prefix: str = "") -> dict[str, outputs.Output]:
    """The step outputs of a step's updates of one optimizer, in order.

    `nonfinite` is 1 when any of them was not finite; under a loss scale,
    `<prefix>loss_scale` is the scale the last one used and
    `<prefix>overflow` counts the overflows. With health metrics,
    `health/<prefix>grad_norm`, `health/<prefix>update_ratio` (and
    `health/<prefix>clipped` with a clip norm) are Means over the updates, and
    `health/<prefix>update_ratio.<layer>` each layer's, counted on the steps
    that are multiples of `health_every` (`loops.core.health`).
    """
    step_outputs: dict[str, outputs.Output] = any_bad(*results)
    totals: Totals = {}
    for result in results:
        totals = health.add(totals, result.health_totals())
    step_outputs.update(health.step_outputs(totals, prefix))
    if results[-1].loss_scale is not None:
        overflows = tf.add_n([result.overflow for result in results])
        step_outputs[prefix + "loss_scale"] = outputs.Last(results[-1].loss_scale)
        step_outputs[prefix + "overflow"] = outputs.Sum(tf.cast(overflows, tf.int32))
    return step_outputs


def any_bad(*results: UpdateResult | tf.Tensor) -> dict[str, outputs.Output]:
    """A step's bad-step flag over all its updates: `{"nonfinite": loops.Flag(1)}` when any of
    them was not finite, else `Flag(0)`.

    Args:
        results: the step's `UpdateResult`s, or flags already combined from
            some (a loop's running `tf.maximum` of `result.nonfinite`).
    """
    flags = tf.stack(
        [result.nonfinite if isinstance(result, UpdateResult) else result for result in results]
    )
    return {outputs.NONFINITE: outputs.Flag(tf.cast(tf.reduce_max(flags), tf.int32))}


class Update:
    """Gradients and their application for one optimizer and the variables it trains.

    Create it in `build` (after building the optimizer) and call it in
    `train_step`, in cross-replica context:

        self.update = loops.Update(self, self.optimizer, self.model, clip_norm=1.0)
        ...
        result = self.update(self._replica_loss, args=(inputs, labels))
        return {"loss": loops.Mean(result.sums["loss"]), **result.outputs}

    Code that trains without a definition gives it a context it made itself,
    in the strategy's scope (tests/test_update_context.py):

        context = loops.UpdateContext(
            strategy=strategy,
            global_step=tf.Variable(0, dtype=tf.int64, trainable=False),
            nonfinite=loops.NonFiniteUpdates(strategy, skips=False),
            options=loops.UpdateOptions(grad_accum_steps=2),
        )
        update = loops.Update(context, optimizer, model)

    `result.outputs` holds `nonfinite`, the health metrics (`health/grad_norm`,
    `health/update_ratio`, ...: `update_outputs`) and, under a float16 loss
    scale, `loss_scale` and `overflow`; a step of several updates combines
    theirs with `update_outputs`.

    The replica function gets `args` and returns its share of the loss,
    divided by the real global count of what it sums over
    (`loops.global_count`, `loops.scale_to_global_batch`), and a dict of
    scalars that are sums over its examples (counts, sums of a metric).

    It is given its context (`loops.UpdateContext`): the strategy that runs
    the replicas, the global step, how a non-finite update is applied or left
    out (the run's `on_nonfinite`), where it registers what it creates, and
    five settings (`UpdateContext.options`), so that every step has them;
    a Trainer gives its run's:
    - `mixed_precision="mixed_float16"`: a dynamic loss scale
      (`loops.mixed_precision.DynamicLossScale`, `self.loss_scale`), whose
      overflows are skipped and reported as `overflow`. The Trainer saves and
      restores it with its checkpoints (`UpdateContext.update_states`): a definition
      lists only its own objects in `checkpoint_items`.
    - `grad_accum_steps=K`: each replica's share of the step is cut into K
      micro-batches along the first axis of every tensor of rank >= 1 in
      `args` (scalars and Python values are passed whole to every call), the
      replica function runs once per micro-batch, and the gradients are
      added up weighted by each micro-batch's normalizer: the global count
      its loss was divided by with `loops.scale_to_global_batch` (examples,
      a sum of weights, tokens). The update is that of the whole batch at
      once, on any replica count, with 1/K of the activations in memory. A
      loss function whose normalizer is not one count is refused with an
      error (`micro_batches.MicroBatch.normalizer`). Its logs are summed over the
      micro-batches, and random draws keyed by example
      (`loops.replica_random`) do not change with K. A loss that is not a
      sum over examples (`whole_batch_loss=True`) is refused under K > 1.
    - `ema_decay`: a moving average of the trained variables
      (`loops.core.weight_average.WeightAverage`, `self.average`), updated after
      each applied update; the loop checkpoints it and evaluates and exports
      with it. `average=False` leaves this update's variables out (the GAN's
      discriminator, which neither evaluation nor export uses).
    - `jit_compile`: each replica's forward and backward pass through the
      trained model compiled with XLA (`loops.core.compilation`); refused
      with a sentence where it cannot compile.
    - `health_every`: the health metrics (`loops.core.health`), the
      per-layer update ratios reported every `health_every` steps; None:
      none, and no all-reduce of the gradient beyond the optimizer's own.

    Embedding tables (`loops.core.table_updates`): a variable whose gradient
    is an `IndexedSlices` (a plain `keras.layers.Embedding`) is trained by
    `table_optimizer` (else `optimizer`). Where that optimizer has an exact
    row update (SGD without momentum, Adagrad: `loops.core.row_updates`), the
    gradient stays sparse: duplicate ids summed, the rows all-gathered across
    replicas (uneven and empty replicas included), only the touched rows of
    the table and of the optimizer's own slots read and written, and the
    model's Embedding layers look their rows up with a sparse read; a step
    then costs what its batch touches, not the table. Clipping and the
    health norm count each row once, which is the dense gradient's norm;
    accumulation stays sparse; a float16 loss scale unscales the rows; a
    moving average (`ema_decay`) of a sparse table is refused. Another
    optimizer (Adam) trains tables densely, with a note once. Pass the model
    itself as `trained` for the sparse read: given a function of variables,
    the layers keep Keras' whole-table read, which TensorFlow copies once
    rows were scattered (correct, and as slow as a dense update).
    A `loops.EmbeddingTable` in the model (its variables are not Keras
    weights) trains too: its shards' rows, counted by the non-finite check,
    clipping and health like the rest, applied by its own row optimizer
    (`table_optimizer` may only be that same optimizer), whose `iterations`
    the Update counts. It trains on one replica or under parameter servers;
    on several synchronous replicas, or with a moving average, the Update is
    refused with the fix (`table_updates.check_own_tables`).

    Args:
        context: the `UpdateContext` it runs in; or, in a definition's
            `build`, the definition (`self`, a `loops.Loop` bound by its
            Trainer), whose context (`update_context`) it takes at once.
        optimizer: a built Keras optimizer.
        trained: a Keras model (its trainable variables, and its
            regularization losses added once to the loss), or a function
            returning the variables to train.
        clip_norm: clip the summed gradient to this global norm; None does not.
        average: keep a moving average of the trained variables when the
            context's options have an `ema_decay`.
        whole_batch_loss: the loss of an example depends on other examples
            of the step (contrastive negatives from the whole batch, a
            ranking loss, batch statistics), so it is not a sum over
            examples: micro-batches would each see only their own rows.
            The loss function then takes the other replicas' rows with
            `loops.gather_global_rows` (exact on any replica count), and
            `grad_accum_steps` > 1 is refused.
        table_optimizer: a built Keras optimizer for the embedding tables (e.g.
            Adagrad, with Adam as `optimizer` for the rest): each optimizer
            counts the steps and keeps the slots of its own variables; a
            definition checkpoints both. None: `optimizer` trains the tables.
        max_table_lookups: on several replicas, the most ids one replica looks
            up in one table in one step (its examples times ids each): the
            rows gathered across replicas have a shape fixed when traced. Only
            needed where that count is not static (batches of varying size)
            and a table has more than 65,536 rows (a smaller one gathers its
            row count).

    Raises:
        ValueError: a bad clip_norm, whole_batch_loss under grad_accum_steps > 1, or
            jit_compile where it cannot compile (`compilation.check_can_compile`).
        TypeError: a context that is neither an `UpdateContext` nor a definition.
    """

    def __init__(
        self,
        context: UpdateContext | update_context.Bound,
        optimizer: keras.optimizers.Optimizer,
        trained: keras.Model | Callable[[], Sequence[tf.Variable]],
        *,
        clip_norm: float | None = None,
        average: bool = True,
        whole_batch_loss: bool = False,
        table_optimizer: keras.optimizers.Optimizer | None = None,
        max_table_lookups: int | None = None,
    ):
        self.context = context = update_context.of(context)
        options = context.options
        check_clip_norm(clip_norm)
        check_whole_batch_loss(whole_batch_loss, options.grad_accum_steps)
        self.jit_compile: bool = options.jit_compile
        if self.jit_compile:
            compilation.check_can_compile(trained, context.strategy)
            compilation.compile_calls(trained)
        self.whole_batch_loss = whole_batch_loss
        check_slices_can_compute(context, whole_batch_loss, options.grad_accum_steps)
        self._slice_functions: dict[ReplicaLoss, Callable[..., tuple]] = {}
        self._applied_sums: Callable[..., UpdateResult] | None = None
        self.optimizer = optimizer
        self._trained = trained
        self.clip_norm = clip_norm
        self.grad_accum_steps = options.grad_accum_steps
        self.health_every: int | None = options.health_every
        self.loss_scale = None
        if mixed_precision.needs_loss_scale(options.mixed_precision):
            growth_steps = options.loss_scale_growth_steps or mixed_precision.DEFAULT_GROWTH_STEPS
            self.loss_scale = mixed_precision.DynamicLossScale(growth_steps=growth_steps)
            context.update_states.add(self.loss_scale)
        averaged = average and options.ema_decay is not None
        self._set_up_tables(trained, optimizer, table_optimizer, max_table_lookups, averaged)
        self.average: WeightAverage | None = None
        if average and options.ema_decay is not None:
            averages = context.weight_averages
            self.average = WeightAverage(
                self.variables(),
                decay=options.ema_decay,
                name=f"update_{len(averages.updates)}",
            )
            averages.add(self.average)

    def _set_up_tables(self, trained, optimizer, table_optimizer, max_table_lookups, averaged):
        """The embedding tables' gradients (`TableGradients`), checked before any step."""
        # The model's loops.EmbeddingTable layers: their variables are not Keras weights.
        self._own_tables = (
            embedding_tables.tables_in(trained) if isinstance(trained, keras.Model) else []
        )
        replicas = self.context.strategy.num_replicas_in_sync
        check_own_tables(self._own_tables, replicas, table_optimizer, averaged=averaged)
        if max_table_lookups is not None:
            check_whole("max_table_lookups", max_table_lookups, note=" (ids a replica looks up)")
        self.tables = TableGradients(
            optimizer,
            table_optimizer,
            averaged=averaged,
            max_lookups=max_table_lookups,
            own_tables=self._own_tables,
        )
        self.table_optimizer = table_optimizer
        if isinstance(trained, keras.Model) and self.tables.sparse:
            for layer in keras_private.embedding_layers(trained):
                keras_private.read_rows_sparsely(layer, table_rows.lookup)

    def variables(self) -> list[tf.Variable]:
        if isinstance(self._trained, keras.Model):
            shards = [shard for table in self._own_tables for shard in table.shards]
            return [*self._trained.trainable_variables, *shards]
        return list(self._trained())

    def __call__(self, replica_loss: ReplicaLoss, args: Sequence = ()) -> UpdateResult:
        """Runs `replica_loss(*args)` on every replica under a tape and applies the update."""
        if self.context.slice_gradients is None:
            return self._applied(functools.partial(self._replica_gradients, replica_loss), args)
        # Computed on the parameter-server workers and summed, applied once here, on the
        # chief, in one traced function (issue 44).
        loss, logs, gradients = self.context.slice_gradients(
            self._slice_function(replica_loss), tuple(args)
        )
        if self._applied_sums is None:
            self._applied_sums = tf.function(self._apply_sums, reduce_retracing=True)
        return self._applied_sums(loss, logs, gradients, device=loss.device)

    def _apply_sums(self, loss, logs, gradients, *, device: str) -> UpdateResult:
        """Applies the slices' summed loss, logs and gradients as one replica's; traced.

        Its inputs are placed on `device`, the chief's: a traced tensor without a device
        has an empty one, and a reduce in the strategy's replica context (the
        optimizer's) sends a tensor to its own device (TensorFlow's
        `_batch_reduce_destination`), which must not be empty.
        """
        with tf.device(device):
            loss, logs, gradients = tf.nest.map_structure(tf.identity, (loss, logs, gradients))
            return self._applied(lambda: self._checked(loss, logs, gradients), ())

    def _applied(self, replica_gradients: Callable[..., tuple], args: Sequence) -> UpdateResult:
        """Runs `replica_gradients(*args)` (a replica's logs, gradients, finiteness, summed
        gradient and norm) on every replica and applies the update as the policy says."""
        strategy = self.context.strategy
        variables = self.variables()
        ratio_step = before = None
        if self.health_every is not None:
            ratio_step = health.is_ratio_step(self.context.global_step, self.health_every)
            before = health.read_weights(variables, ratio_step)
        logs, gradients, finite, summed, norm = strategy.run(replica_gradients, args=tuple(args))
        if self.clip_norm is None:
            # The optimizer sums the replicas' gradients itself, as it would without
            # health metrics: `summed` only gives their norm.
            skipped = self.context.nonfinite.apply(finite, self._replica_apply, gradients)
        else:
            skipped = self.context.nonfinite.apply(finite, self._replica_apply_summed, summed, norm)
        update_health = None
        if before is not None:
            update_health = health.measure(
                variables,
                before,
                strategy.experimental_local_results(norm)[0],
                clip_norm=self.clip_norm,
                ratio_step=ratio_step,
            )
        sums = reduction.sum_over_replicas(strategy, logs)
        if self.average is not None:
            self.average.update(applied=1.0 - skipped)
        if self.loss_scale is None:
            return UpdateResult(sums, skipped, skipped, tf.zeros_like(skipped), None, update_health)
        scale = self.loss_scale.update(skipped=skipped, loss=sums["loss"])
        return UpdateResult(
            sums,
            skipped,
            scale["nonfinite"],
            scale["overflow"],
            scale["loss_scale"],
            update_health,
        )

    def empty_health_totals(self) -> Totals:
        """Zero health totals of this Update's metrics, where a `tf.range` loop of its updates
        starts adding `UpdateResult.health_totals()`; {} without health metrics."""
        if self.health_every is None:
            return {}
        return health.empty_totals(self.variables(), clipped=self.clip_norm is not None)

    def _replica_gradients(self, replica_loss: ReplicaLoss, *args):
        if self.grad_accum_steps == 1:
            loss, logs, gradients = self._loss_and_gradients(replica_loss, args)
        else:
            loss, logs, gradients = self._accumulated(replica_loss, args)
        return self._checked(loss, logs, gradients)

    def _checked(self, loss, logs, gradients):
        """A replica's loss, logs and gradients with the finiteness flag and the summed
        gradient's norm (when clipping or health needs it); replica context."""
        # A table's rows, summed over duplicates and replicas, where its optimizer has
        # an exact row update; else dense: Keras' own Adam squares each row of an
        # IndexedSlices before summing duplicates, which changes with the split. (In the
        # exact parameter-server mode, the workers' rows summed by the chief.)
        gradients = self.tables.prepared(gradients, self.variables())
        finite = all_finite([loss, *gradients])
        summed = norm = None
        if self.clip_norm is not None or self.health_every is not None:
            # The norm of the replicas' sum, which clipping and the health metrics
            # share, the same on every replica whatever their number.
            summed = self.tables.summed(gradients)
            norm = tf.linalg.global_norm(summed)
        return {"loss": loss, **logs}, gradients, finite, summed, norm

    def _slice_function(self, replica_loss: ReplicaLoss) -> Callable[..., tuple]:
        """The function `context.slice_gradients` runs on each slice, the same object for the
        same `replica_loss` (so that it is traced once)."""
        if replica_loss not in self._slice_functions:
            self._slice_functions[replica_loss] = functools.partial(
                self._slice_gradients, replica_loss
            )
        return self._slice_functions[replica_loss]

    def _slice_gradients(self, replica_loss: ReplicaLoss, step_rows, first_row, *args):
        """One slice's loss (divided by its own count), logs, gradients and that count: a
        micro-batch of the step computed elsewhere (`UpdateContext.slice_gradients`)."""
        micro_batch = micro_batches.MicroBatch(step_rows, first_row=first_row)
        with micro_batch.computing():
            loss, logs, gradients = self._loss_and_gradients(replica_loss, args)
        try:
            count = micro_batch.normalizer(1)
        except ValueError as error:
            raise ValueError(
                "parameter_server_mode='exact' sums the workers' gradients weighted by the "
                f"count each slice's loss is divided by, and: {error}"
            ) from None
        # A table's as its rows, each id once, for the transfer to the chief, which sums
        # the slices' and trains them as one replica's (`TableGradients.sent_rows`).
        gradients = self.tables.sent_rows(gradients)
        return loss, logs, gradients, tf.cast(count, tf.float32)

    def _loss_and_gradients(self, replica_loss: ReplicaLoss, args: Sequence):
        variables = self.variables()
        compiled = compilation.compiling() if self.jit_compile else contextlib.nullcontext()
        with tf.GradientTape() as tape, compiled:
            loss, logs = replica_loss(*args)
            if isinstance(self._trained, keras.Model) and self._trained.losses:
                # Every replica adds it, so each adds its 1/num_replicas share.
                loss += tf.nn.scale_regularization_loss(tf.add_n(self._trained.losses))
            # Scaling up keeps small float16 gradients from flushing to zero.
            target = loss if self.loss_scale is None else self.loss_scale.scale_loss(loss)
        gradients = tape.gradient(target, variables)
        if self.loss_scale is not None:
            gradients = self.loss_scale.unscale(gradients)
        return loss, dict(logs), gradients

    def _accumulated(self, replica_loss: ReplicaLoss, args: Sequence):
        """The loss, logs and gradients of the whole share, computed micro-batch by micro-batch.

        Each micro-batch's loss is divided by its own global count c_k; the
        share's is sum_k c_k * loss_k / sum_k c_k, and so are its gradients.
        The micro-batches are unrolled (their all-reduces cannot sit in a
        `tf.while_loop` under MirroredStrategy), and each one's input waits
        for the previous one's gradients, so that one micro-batch's
        activations are alive at a time.
        """
        parts = tf.nest.flatten(args)
        batched = [isinstance(part, tf.Tensor) and part.shape.rank != 0 for part in parts]
        if not any(batched):
            raise ValueError(
                f"grad_accum_steps={self.grad_accum_steps} splits a step's examples into "
                "micro-batches along the first axis of the tensors in the Update's args, and "
                "these args hold no tensor of rank >= 1. Pass the step's batch in args, or "
                "set grad_accum_steps=1."
            )
        rows = tf.shape(parts[batched.index(True)])[0]
        context = tf.distribute.get_replica_context()
        step_rows = context.all_reduce(tf.distribute.ReduceOp.SUM, rows)
        replica_start, _ = replica_bounds(
            step_rows, context.replica_id_in_sync_group, context.num_replicas_in_sync
        )
        size = -(-rows // self.grad_accum_steps)  # ceil: the last micro-batches may be short
        total = weighted_loss = None
        summed_logs: dict[str, tf.Tensor] = {}
        weighted: list[tf.Tensor | None] = []
        for index in range(self.grad_accum_steps):
            start = tf.minimum(index * size, rows)
            stop = tf.minimum(start + size, rows)
            with tf.control_dependencies([g for g in weighted if g is not None]):
                sliced = [
                    tf.identity(part[start:stop]) if cut else part
                    for part, cut in zip(parts, batched)
                ]
            micro_batch = micro_batches.MicroBatch(step_rows, first_row=replica_start + start)
            with micro_batch.computing():
                loss, logs, gradients = self._loss_and_gradients(
                    replica_loss, tf.nest.pack_sequence_as(args, sliced)
                )
            count = tf.cast(micro_batch.normalizer(self.grad_accum_steps), tf.float32)
            scaled = [_times(g, count) for g in gradients]
            if total is None:
                total, weighted_loss, summed_logs, weighted = count, count * loss, logs, scaled
                continue
            total += count
            weighted_loss += count * loss
            summed_logs = {name: summed_logs[name] + logs[name] for name in summed_logs}
            weighted = [_plus(w, g) for w, g in zip(weighted, scaled)]
        return (
            tf.math.divide_no_nan(weighted_loss, total),
            summed_logs,
            [_divided(w, total) for w in weighted],
        )

    def _replica_apply(self, gradients) -> None:
        self.tables.apply(gradients, self.variables(), dense_share=None)

    def _replica_apply_summed(self, summed, norm) -> None:
        if self.clip_norm is not None:
            # A table's rows count once each in the norm, as in the dense gradient's.
            summed, _ = tf.clip_by_global_norm(summed, self.clip_norm, use_norm=norm)
        share = 1.0 / tf.distribute.get_replica_context().num_replicas_in_sync
        self.tables.apply(summed, self.variables(), dense_share=share)


def _times(gradient, factor):
    """A gradient (dense, a table's IndexedSlices, or None) times a scalar, sparse kept."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        return table_rows.scaled(gradient, factor)
    return factor * gradient


def _divided(gradient, total):
    """A gradient divided by a count (0 where the count is 0); a table's stays sparse."""
    if gradient is None:
        return None
    if isinstance(gradient, tf.IndexedSlices):
        values = tf.math.divide_no_nan(gradient.values, tf.cast(total, gradient.values.dtype))
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    return tf.math.divide_no_nan(gradient, total)


def _plus(first, second):
    """The sum of two micro-batches' gradients of one variable; a table's stays sparse.

    None is no rows: a shard of an EmbeddingTable that one micro-batch did not look up.
    """
    if first is None or second is None:
        return second if first is None else first
    if isinstance(first, tf.IndexedSlices):
        return table_rows.concatenated(first, second)
    return first + second


def check_clip_norm(clip_norm: float | None) -> None:
    """Raises ValueError unless clip_norm is None or > 0 (loops check it before building)."""
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 (or None for no clipping), got {clip_norm!r}.")


def check_slices_can_compute(
    context: UpdateContext, whole_batch_loss: bool, grad_accum_steps: int
) -> None:
    """Raises ValueError for an update that slices computed apart cannot give exactly."""
    if context.slice_gradients is None:
        return
    if whole_batch_loss:
        raise ValueError(
            "parameter_server_mode='exact' computes each worker's slice of a step apart, and "
            "this Update's loss is over the whole batch (whole_batch_loss=True): a slice "
            "cannot see the other slices' rows. Pass --parameter_server_mode=async, or "
            "--strategy=mirrored or multi_worker_mirrored."
        )
    if grad_accum_steps > 1:
        raise ValueError(
            f"grad_accum_steps={grad_accum_steps} under parameter_server_mode='exact': each "
            "worker already computes a slice of the step; pass --grad_accum_steps=1, or "
            "more workers."
        )


def check_whole_batch_loss(whole_batch_loss: bool, grad_accum_steps: int) -> None:
    """Raises ValueError for a loss over the whole batch cut into micro-batches."""
    if whole_batch_loss and grad_accum_steps > 1:
        raise ValueError(
            f"grad_accum_steps={grad_accum_steps} cuts each replica's share of a step "
            "into micro-batches, and this Update's loss is over the whole batch "
            "(whole_batch_loss=True): each micro-batch would see only its own rows "
            "(its own negatives, its own statistics), which is another loss. Set "
            "grad_accum_steps=1 (--grad_accum_steps=1) and lower the global batch size "
            "if memory is short."
        )
