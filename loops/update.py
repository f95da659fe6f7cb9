"""The one update path every step uses: from each replica's share of a loss to applied weights.

A step describes only its loss; `Update` does the rest the same way for the
classifier, both GAN networks, PPO and DQN: the model's regularization
losses added once, a float16 loss scale, the gradients, a finiteness check
that covers every replica, clipping by the global norm of the summed
gradient, and applying (or leaving out) the update as the loop's
`on_nonfinite` policy says.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import keras
import tensorflow as tf

from loops import outputs, reduction

# A replica function's result: its share of the loss (already divided by the
# real global count, `loops.scale_to_global_batch`) and scalars to sum over replicas.
ReplicaLoss = Callable[..., "tuple[tf.Tensor, Mapping[str, tf.Tensor]]"]


class UpdateResult(NamedTuple):
    """What one update did, in cross-replica context."""

    sums: dict[str, tf.Tensor]  # "loss" and the replica function's logs, summed over replicas
    nonfinite: tf.Tensor  # 1.0 when the loss or a gradient was not finite on some replica
    outputs: dict[str, outputs.Output]  # "nonfinite" (and "loss_scale", "overflow") as step outputs


class Update:
    """Gradients and their application for one optimizer and the variables it trains.

    Create it in `build` (after building the optimizer) and call it in
    `train_step`, in cross-replica context:

        self.update = loops.Update(self, self.optimizer, self.model, clip_norm=1.0)
        ...
        result = self.update(self._replica_loss, args=(inputs, labels))
        return {"loss": loops.Mean(result.sums["loss"]), **result.outputs}

    Args:
        loop: the loop whose strategy runs the replicas and whose
            `on_nonfinite` policy (`Loop.apply_update`) decides what a
            non-finite update leads to.
        optimizer: a built Keras optimizer.
        trained: a Keras model (its trainable variables, and its
            regularization losses added once to the loss), or a function
            returning the variables to train.
        clip_norm: clip the summed gradient to this global norm; None does not.
        loss_scale: a `loops.mixed_precision.DynamicLossScale` for float16
            models; its overflows are skipped and reported as `overflow`.
    """

    def __init__(
        self,
        loop,
        optimizer: keras.optimizers.Optimizer,
        trained: keras.Model | Callable[[], Sequence[tf.Variable]],
        *,
        clip_norm: float | None = None,
        loss_scale: Any = None,
    ):
        check_clip_norm(clip_norm)
        self._loop = loop
        self.optimizer = optimizer
        self._trained = trained
        self.clip_norm = clip_norm
        self.loss_scale = loss_scale

    def variables(self) -> list[tf.Variable]:
        if isinstance(self._trained, keras.Model):
            return list(self._trained.trainable_variables)
        return list(self._trained())

    def __call__(self, replica_loss: ReplicaLoss, args: Sequence = ()) -> UpdateResult:
        """Runs `replica_loss(*args)` on every replica under a tape and applies the update."""
        strategy = self._loop.strategy
        logs, gradients, finite = strategy.run(
            functools.partial(self._replica_gradients, replica_loss), args=tuple(args)
        )
        nonfinite = self._loop.apply_update(finite, self._replica_apply, gradients)
        sums = reduction.sum_over_replicas(strategy, logs)
        if self.loss_scale is None:
            return UpdateResult(
                sums, nonfinite, {outputs.NONFINITE: outputs.Sum(tf.cast(nonfinite, tf.int32))}
            )
        scale = self.loss_scale.update(skipped=nonfinite, loss=sums["loss"])
        return UpdateResult(
            sums,
            nonfinite,
            {
                outputs.NONFINITE: outputs.Sum(tf.cast(scale["nonfinite"], tf.int32)),
                "loss_scale": outputs.Last(scale["loss_scale"]),
                "overflow": outputs.Sum(tf.cast(scale["overflow"], tf.int32)),
            },
        )

    def _replica_gradients(self, replica_loss: ReplicaLoss, *args):
        variables = self.variables()
        with tf.GradientTape() as tape:
            loss, logs = replica_loss(*args)
            if isinstance(self._trained, keras.Model) and self._trained.losses:
                # Every replica adds it, so each adds its 1/num_replicas share.
                loss += tf.nn.scale_regularization_loss(tf.add_n(self._trained.losses))
            # Scaling up keeps small float16 gradients from flushing to zero.
            target = loss if self.loss_scale is None else self.loss_scale.scale_loss(loss)
        gradients = tape.gradient(target, variables)
        if self.loss_scale is not None:
            gradients = self.loss_scale.unscale(gradients)
        finite = reduction.all_finite([loss, *gradients])
        return {"loss": loss, **logs}, gradients, finite

    def _replica_apply(self, gradients) -> None:
        reduction.apply_gradients(
            self.optimizer, gradients, self.variables(), clip_norm=self.clip_norm
        )


def check_clip_norm(clip_norm: float | None) -> None:
    """Raises ValueError unless clip_norm is None or > 0 (loops check it before building)."""
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be > 0 (or None for no clipping), got {clip_norm!r}.")
