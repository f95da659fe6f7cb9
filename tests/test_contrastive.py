"""A loss over the whole batch: SimCLR's NT-Xent with negatives from every replica.

`TwoViewContrastive` is what a researcher writes, on the public API only: each
replica embeds its rows of both views, gathers every replica's embeddings in
global row order (`loops.gather_global_rows`), and scores its own anchors
against all of them, its global row offset (`loops.global_row_offset`) naming
the positive and the anchor itself. The sum over replicas is then the loss of
the whole global batch on one device, on any replica count, with replicas
left empty by a partial final batch.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops

TEMPERATURE = 0.5


class TwoViewContrastive(loops.Loop):
    """NT-Xent over two views of each example; every other row of the global batch is a negative."""

    def build(self):
        init = keras.initializers.GlorotUniform
        self.model = keras.Sequential(
            [
                keras.Input((6,)),
                keras.layers.Dense(8, activation="tanh", kernel_initializer=init(seed=1)),
                keras.layers.Dense(4, kernel_initializer=init(seed=2)),
            ]
        )
        self.optimizer = keras.optimizers.SGD(0.5)
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(self, self.optimizer, self.model, whole_batch_loss=True)

    def checkpoint_items(self):
        return {"model": self.model, "optimizer": self.optimizer}

    def replica_loss(self, view1, view2):
        rows = tf.shape(view1)[0]
        local = [tf.math.l2_normalize(self.model(v, training=True), axis=1) for v in (view1, view2)]
        # [global rows, 4] each; the size fixes the shape of the compiled gather.
        everyone = [loops.gather_global_rows(z, global_batch_size=8) for z in local]
        total = tf.shape(everyone[0])[0]
        candidates = tf.concat(everyone, axis=0)  # view 1 of every row, then view 2
        anchors = tf.concat(local, axis=0)
        mine = loops.global_row_offset(rows) + tf.range(rows)
        itself = tf.concat([mine, total + mine], axis=0)
        positive = tf.concat([total + mine, mine], axis=0)
        logits = tf.matmul(anchors, candidates, transpose_b=True) / TEMPERATURE
        logits -= 1e9 * tf.one_hot(itself, 2 * total)  # an anchor is not its own negative
        per_anchor = tf.reduce_logsumexp(logits, axis=1) - tf.gather(logits, positive, batch_dims=1)
        count = loops.global_count(2 * rows)  # anchors on ALL replicas
        return loops.scale_to_global_batch(per_anchor, count), {}

    def train_step(self, iterator):
        result = self.update(self.replica_loss, args=next(iterator))
        return {"loss": loops.Mean(result.sums["loss"]), **result.outputs}


def views(count=19):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(count, 6)).astype(np.float32)
    view1 = x + 0.1 * rng.normal(size=x.shape).astype(np.float32)
    view2 = x + 0.1 * rng.normal(size=x.shape).astype(np.float32)
    return view1, view2


def build(strategy, **kwargs):
    # 19 rows in batches of 8: the third batch holds 3 rows, one replica of 4 holds none.
    return loops.Trainer(
        TwoViewContrastive(),
        strategy=strategy,
        train_data=lambda: tf.data.Dataset.from_tensor_slices(views()).batch(8),
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
        **kwargs,
    )


def nt_xent(embed, view1, view2):
    """The loss of one global batch on one device, in NumPy."""
    z = np.concatenate([embed(view1), embed(view2)]).astype(np.float64)
    z /= np.linalg.norm(z, axis=1, keepdims=True)
    logits = z @ z.T / TEMPERATURE
    np.fill_diagonal(logits, -np.inf)
    rows = len(view1)
    positive = np.concatenate([np.arange(rows, 2 * rows), np.arange(rows)])
    top = logits.max(axis=1, keepdims=True)
    log_sum = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return float(np.mean(log_sum - logits[np.arange(2 * rows), positive]))


def test_negatives_from_the_whole_batch_give_the_same_numbers_on_1_2_and_4_replicas():
    runs = loops.testing.assert_replica_parity(build, num_steps=6, replica_counts=(1, 2, 4))
    losses = runs[4]["logs"]["loss"]
    assert losses[-1] < losses[0]
    # Step 1 of 4 replicas is the loss of the whole first batch of 8 on one device.
    fresh = build(loops.testing.replica_strategy(1))
    view1, view2 = views()
    expected = nt_xent(lambda v: fresh.definition.model(v).numpy(), view1[:8], view2[:8])
    np.testing.assert_allclose(losses[0], expected, rtol=1e-5)


def test_accumulation_of_a_whole_batch_loss_is_refused_before_any_step():
    with pytest.raises(ValueError) as refused:
        build(loops.testing.replica_strategy(2), grad_accum_steps=2)
    assert str(refused.value).startswith(
        "grad_accum_steps=2 cuts each replica's share of a step into micro-batches, and this "
        "Update's loss is over the whole batch (whole_batch_loss=True)"
    )
    assert "Set grad_accum_steps=1 (--grad_accum_steps=1)" in str(refused.value)


def test_the_row_helpers_refuse_cross_replica_context_and_scalars():
    strategy = loops.testing.replica_strategy(2)
    with pytest.raises(ValueError, match="called in cross-replica context; call them inside"):
        with strategy.scope():
            loops.global_row_offset(3)
    with pytest.raises(ValueError, match="got a scalar; pass a tensor whose first axis"):
        strategy.run(lambda: loops.gather_global_rows(tf.constant(1.0), global_batch_size=8))
    with pytest.raises(ValueError, match="global_batch_size must be a whole number >= 1"):
        strategy.run(lambda: loops.gather_global_rows(tf.ones([2, 3]), global_batch_size=0))
