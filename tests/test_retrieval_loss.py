"""The retrieval loss: in-batch softmax over the whole global batch, logQ-corrected, accidental
hits removed; against NumPy and equal on 1, 2 and 4 replicas with a replica left empty."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from loops.kinds.library import retrieval_loss

NUM_ITEMS = 6
GLOBAL_BATCH = 8
TEMPERATURE = 0.5


class TwoTowers(loops.Loop):
    """A user tower over features, an item tower over ids; the loss under test."""

    def __init__(self, log_q, remove_accidental_hits=True):
        self.log_q = log_q
        self.remove_accidental_hits = remove_accidental_hits

    def build(self):
        init = keras.initializers.GlorotUniform
        self.users = keras.Sequential(
            [keras.Input((5,)), keras.layers.Dense(4, kernel_initializer=init(seed=1))]
        )
        self.items = keras.Sequential(
            [
                keras.Input((), dtype="int32"),
                keras.layers.Embedding(NUM_ITEMS, 4, embeddings_initializer=init(seed=2)),
            ]
        )
        self.optimizer = keras.optimizers.SGD(0.5)
        self.optimizer.build(self.variables())
        self.update = loops.Update(self, self.optimizer, self.variables, whole_batch_loss=True)

    def variables(self):
        return self.users.trainable_variables + self.items.trainable_variables

    def checkpoint_items(self):
        return {"users": self.users, "items": self.items, "optimizer": self.optimizer}

    def replica_loss(self, features, items):
        loss = retrieval_loss.retrieval_loss(
            self.users(features, training=True),
            self.items(items, training=True),
            items,
            global_batch_size=GLOBAL_BATCH,
            log_q=tf.gather(self.log_q, items) if self.log_q is not None else None,
            temperature=TEMPERATURE,
            remove_accidental_hits=self.remove_accidental_hits,
        )
        return loss, {}

    def train_step(self, iterator):
        result = self.update(self.replica_loss, args=next(iterator))
        return {"loss": loops.Mean(result.sums["loss"]), **result.outputs}


def rows(count=19):
    """Features and items; item 0 and 1 are frequent, so batches hold accidental hits."""
    rng = np.random.default_rng(7)
    features = rng.normal(size=(count, 5)).astype(np.float32)
    items = rng.choice(NUM_ITEMS, size=count, p=[0.35, 0.25, 0.15, 0.1, 0.1, 0.05])
    return features, items.astype(np.int32)


LOG_Q = retrieval_loss.item_log_probabilities(np.bincount(rows()[1], minlength=NUM_ITEMS))


def build(strategy, **kwargs):
    # 19 rows in batches of 8: the third batch holds 3 rows, one replica of 4 holds none.
    return loops.Trainer(
        TwoTowers(LOG_Q),
        strategy=strategy,
        train_data=lambda: tf.data.Dataset.from_tensor_slices(rows()).batch(GLOBAL_BATCH),
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
        **kwargs,
    )


def numpy_loss(queries, candidates, items, log_q, remove_accidental_hits=True):
    """The mean loss of one global batch on one device, in float64."""
    logits = queries.astype(np.float64) @ candidates.T.astype(np.float64) / TEMPERATURE
    if log_q is not None:
        logits -= log_q[items][None, :]
    if remove_accidental_hits:
        hit = (items[:, None] == items[None, :]) & ~np.eye(len(items), dtype=bool)
        logits[hit] = -np.inf
    top = logits.max(axis=1, keepdims=True)
    log_sum = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return float(np.mean(log_sum - np.diag(logits)))


def test_the_first_batch_loss_equals_numpy_with_log_q_and_hits_removed():
    features, items = rows()
    features, items = features[:GLOBAL_BATCH], items[:GLOBAL_BATCH]
    assert len(set(items.tolist())) < GLOBAL_BATCH  # the batch has accidental hits
    for log_q, remove in ((LOG_Q, True), (None, True), (LOG_Q, False)):
        trainer = loops.Trainer(
            TwoTowers(log_q, remove),
            strategy=loops.testing.replica_strategy(1),
            train_data=lambda: tf.data.Dataset.from_tensor_slices(rows()).batch(GLOBAL_BATCH),
            progress=loops.testing.quiet_progress(),
        )
        towers = trainer.definition
        queries, candidates = towers.users(features).numpy(), towers.items(items).numpy()
        expected = numpy_loss(queries, candidates, items, log_q, remove)
        logs = trainer.train(1)
        np.testing.assert_allclose(logs["loss"][0], expected, rtol=1e-6)
    # Each part changes the number: the reference above could tell them apart.
    assert numpy_loss(queries, candidates, items, LOG_Q, True) != pytest.approx(
        numpy_loss(queries, candidates, items, LOG_Q, False), rel=1e-3
    )
    assert numpy_loss(queries, candidates, items, LOG_Q, True) != pytest.approx(
        numpy_loss(queries, candidates, items, None, True), rel=1e-3
    )


def test_negatives_from_the_whole_batch_train_alike_on_1_2_and_4_replicas():
    runs = loops.testing.assert_replica_parity(build, num_steps=6, replica_counts=(1, 2, 4))
    losses = runs[4]["logs"]["loss"]
    assert losses[-1] < losses[0]


def test_item_log_probabilities_are_the_log_shares_of_the_rows():
    np.testing.assert_allclose(
        retrieval_loss.item_log_probabilities(np.array([3, 1, 0])),
        np.log([0.75, 0.25, 0.125]),
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match=r"^item_counts must be a non-empty vector of counts"):
        retrieval_loss.item_log_probabilities(np.array([0, 0]))


def test_bad_shapes_and_temperatures_are_refused_while_tracing():
    strategy = loops.testing.replica_strategy(2)
    ids = tf.constant([1, 2])

    def call(queries, candidates, item_ids, **kwargs):
        return strategy.run(
            lambda: retrieval_loss.in_batch_softmax(
                queries, candidates, item_ids, global_batch_size=8, **kwargs
            )
        )

    with pytest.raises(ValueError, match=r"^queries are 4 wide and candidates 3; make both"):
        call(tf.ones([2, 4]), tf.ones([2, 3]), ids)
    with pytest.raises(ValueError, match=r"^item_ids must be a vector, one entry a row, got"):
        call(tf.ones([2, 4]), tf.ones([2, 4]), tf.ones([2, 1], tf.int32))
    with pytest.raises(ValueError, match=r"^temperature must be > 0, got 0.0; 1.0 leaves"):
        call(tf.ones([2, 4]), tf.ones([2, 4]), ids, temperature=0.0)
