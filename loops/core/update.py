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

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import keras
import tensorflow as tf

from loops import tf_private
from loops.core import (
    compilation,
    health,
    mixed_precision,
    outputs,
    reduction,
    update_context,
)
from loops.core.gradients import all_finite
from loops.core.health import Totals, UpdateHealth
from loops.core.replica_gradients import ReplicaGradients, ReplicaLoss
from loops.core.table_updates import update_tables
from loops.core.update_context import UpdateContext
from loops.core.weight_average import WeightAverage
from loops.tables import dynamic_tables, table_rows


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
    row update (SGD without momentum, Adagrad: `loops.tables.row_updates`), the
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
    the Update counts. It trains on one replica, under parameter servers, and
    split over the replicas of a MirroredStrategy (each replica applies its
    own block's rows; clipping and health count each block's rows once); on
    the synchronous replicas of another strategy (central storage, several
    workers), or with a moving average, the Update is refused with the fix
    (`table_updates.check_own_tables`).

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
            `grad_accum_steps` > 1 is refused. In the exact parameter-server
            mode one worker computes the whole step (one slice).
        table_optimizer: a built Keras optimizer for the embedding tables (e.g.
            Adagrad, with Adam as `optimizer` for the rest): each optimizer
            counts the steps and keeps the slots of its own variables; a
            definition checkpoints both. None: `optimizer` trains the tables.
        max_table_lookups: on several replicas, the most ids one replica looks
            up in one table in one step (its examples times ids each): the
            rows gathered across replicas have a shape fixed when traced. Only
            needed where that count is not static (batches of varying size)
            and a table has more than 65,536 rows (a smaller one gathers its
            row count). It also sizes the ids the lookups of the model's
            `loops.EmbeddingTable`s split over the replicas exchange.

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
            compilation.check_can_compile(trained, context.placement)
            compilation.compile_calls(trained)
        self.whole_batch_loss = whole_batch_loss
        check_slices_can_compute(context, options.grad_accum_steps)
        self.optimizer = optimizer
        self._trained = trained
        self.clip_norm = clip_norm
        self.grad_accum_steps = options.grad_accum_steps
        self.health_every: int | None = options.health_every
        self.loss_scale = _loss_scale(context)
        averaged = average and options.ema_decay is not None
        self.tables = update_tables(
            trained,
            optimizer,
            table_optimizer,
            replicas=context.strategy.num_replicas_in_sync,
            averaged=averaged,
            max_lookups=max_table_lookups,
        )
        self.table_optimizer = table_optimizer
        self.gradients = ReplicaGradients(
            trained,
            self.variables,
            tables=self.tables,
            loss_scale=self.loss_scale,
            jit_compile=self.jit_compile,
            grad_accum_steps=self.grad_accum_steps,
        )
        self.average = _weight_average(context, self.variables()) if averaged else None
        # One bound method for good: the traced function it is given keys its traces on it.
        self._apply_summed = self._apply_sums
        self._chief_decisions = dynamic_tables.ChiefDecisions(context.strategy)

    def variables(self) -> list[tf.Variable]:
        if isinstance(self._trained, keras.Model):
            shards = [shard for table in self.tables.own_tables for shard in table.shards]
            return [*self._trained.trainable_variables, *shards]
        return list(self._trained())

    def __call__(self, replica_loss: ReplicaLoss, args: Sequence = ()) -> UpdateResult:
        """Runs `replica_loss(*args)` on every replica under a tape and applies the update."""
        if self.context.slice_gradients is None:
            replica_loss = tf_private.converted_as_the_caller_is(replica_loss)
            return self._applied(functools.partial(self._replica_gradients, replica_loss), args)
        # On the parameter-server workers, summed and applied once here, on the chief (issue
        # 44), as one traced function; a loss over the whole batch is one slice. The slice
        # function is kept by the loss as given: a new one would be traced again each step.
        compute = self.gradients.slice_function(replica_loss, tf_private.converted_as_the_caller_is)
        with self._chief_decisions.taken(self.tables.own_tables, compute, tuple(args)):
            return self.context.slice_gradients(
                compute,
                tuple(args),
                slices=1 if self.whole_batch_loss else None,
                then=self._apply_summed,
            )

    def _apply_sums(self, loss, logs, gradients) -> UpdateResult:
        """Applies the slices' summed loss, logs and gradients as one replica's; traced,
        under the chief's device (`slice_gradients` places it): a traced tensor without a
        device has an empty one, and a reduce in the strategy's replica context (the
        optimizer's) sends a tensor to its own device (TensorFlow's
        `_batch_reduce_destination`), which must not be empty."""
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
        # The most ids a replica looks up in a table, for a batch of no static size: the
        # Trainer's global batch size's share times the most ids an example of it holds.
        self.tables.derived_lookups = self.context.placement.derived_lookups(
            table_rows.ids_per_example(args)
        )
        return self._checked(*self.gradients(replica_loss, args))

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
            norm = self.tables.global_norm(summed, self.variables())
        return {"loss": loss, **logs}, gradients, finite, summed, norm

    def _replica_apply(self, gradients) -> None:
        self.tables.apply(gradients, self.variables(), dense_share=None)

    def _replica_apply_summed(self, summed, norm) -> None:
        if self.clip_norm is not None:
            # A table's rows count once each in the norm, as in the dense gradient's.
            summed, _ = tf.clip_by_global_norm(summed, self.clip_norm, use_norm=norm)
        share = 1.0 / tf.distribute.get_replica_context().num_replicas_in_sync
        self.tables.apply(summed, self.variables(), dense_share=share)


def _loss_scale(context: UpdateContext) -> mixed_precision.DynamicLossScale | None:
    """The dynamic loss scale of an Update under mixed_float16, registered with the context's
    update states (checkpointed); None without one."""
    options = context.options
    if not mixed_precision.needs_loss_scale(options.mixed_precision):
        return None
    growth_steps = options.loss_scale_growth_steps or mixed_precision.DEFAULT_GROWTH_STEPS
    loss_scale = mixed_precision.DynamicLossScale(growth_steps=growth_steps)
    context.update_states.add(loss_scale)
    return loss_scale


def _weight_average(context: UpdateContext, variables: list[tf.Variable]) -> WeightAverage:
    """A moving average of an Update's variables at the context's `ema_decay`, registered with
    its weight averages (which the loop checkpoints, evaluates and exports with)."""
    averages = context.weight_averages
    decay = context.options.ema_decay
    assert decay is not None  # an Update averages only with an ema_decay
    average = WeightAverage(variables, decay=decay, name=f"update_{len(averages.updates)}")
    averages.add(average)
    return average


def check_clip_norm(clip_norm: float | None) -> None:
    """Raises ValueError unless clip_norm is None or > 0 (loops check it before building)."""
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 (or None for no clipping), got {clip_norm!r}.")


def check_slices_can_compute(context: UpdateContext, grad_accum_steps: int) -> None:
    """Raises ValueError for an update that slices computed apart cannot give exactly.

    A loss over the whole batch (`whole_batch_loss`) is not refused: its step is
    computed as one slice, by one worker (`Update.__call__`).
    """
    if context.slice_gradients is None:
        return
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
