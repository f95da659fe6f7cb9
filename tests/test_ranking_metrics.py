"""Recall@K, NDCG@K and AUC against NumPy references, exact on 1, 2 and 4 replicas with a
partial final batch that leaves a replica empty."""

import math

import numpy as np
import pytest
import tensorflow as tf

import loops
from loops.input.interaction_logs import Interactions
from loops.kinds.library import ranking_metrics

USERS, ITEMS, K = 19, 12, 4


def ranking_data():
    """Users' scores with ties (rounded), held-out items (some users none), seen items."""
    rng = np.random.default_rng(11)
    scores = np.round(rng.normal(size=(USERS, ITEMS)), 1).astype(np.float32)
    relevant = rng.random((USERS, ITEMS)) < 0.2
    seen = rng.random((USERS, ITEMS)) < 0.3
    relevant[np.arange(USERS), np.arange(USERS) % ITEMS] = True  # one relevant item each...
    seen[np.arange(USERS), np.arange(USERS) % ITEMS] = False
    relevant[3] = False  # a user with nothing held out is not counted
    relevant[5] = [True] * 2 + [False] * (ITEMS - 2)  # ...nor one whose items were all seen:
    seen[5, :2] = True
    return scores, relevant, seen


def numpy_means(scores, relevant, seen, k):
    """Per-user loops over the users, in float64: mean Recall@K, NDCG@K and the users counted."""
    recalls, ndcgs = [], []
    for score, wanted, excluded in zip(scores, relevant, seen):
        wanted = wanted & ~excluded
        if not wanted.any():
            continue
        ranked = sorted(
            (item for item in range(ITEMS) if not excluded[item]),
            key=lambda item: (-score[item], item),
        )[:k]
        hits = [wanted[item] for item in ranked]
        recalls.append(sum(hits) / wanted.sum())
        dcg = sum(1 / math.log2(rank + 2) for rank, hit in enumerate(hits) if hit)
        ideal = sum(1 / math.log2(rank + 2) for rank in range(min(k, wanted.sum())))
        ndcgs.append(dcg / ideal)
    return np.mean(recalls), np.mean(ndcgs), len(recalls)


def distributed_sums(strategy, data, step_fn):
    """Runs step_fn on every replica's rows of each batch of 8; SUM-reduces and totals."""
    batches = loops.distribute(strategy, lambda: tf.data.Dataset.from_tensor_slices(data).batch(8))

    @tf.function
    def step(batch):
        sums = strategy.run(step_fn, args=batch)
        return tf.nest.map_structure(
            lambda value: strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None), sums
        )

    totals = None
    for batch in batches:
        sums = [float(value) for value in step(batch)]
        totals = sums if totals is None else [a + b for a, b in zip(totals, sums)]
    return totals


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_recall_and_ndcg_equal_numpy_on_every_replica_count(replicas):
    scores, relevant, seen = ranking_data()
    recall, ndcg, users = numpy_means(scores, relevant, seen, K)
    assert users == USERS - 2
    strategy = loops.testing.replica_strategy(replicas)

    def step_fn(scores, relevant, seen):
        return ranking_metrics.ranking_sums(scores, relevant, k=K, exclude=seen)

    # 19 users in batches of 8: the last batch holds 3, so one replica of 4 holds none.
    total_recall, total_ndcg, counted = distributed_sums(
        strategy, (scores, relevant, seen), step_fn
    )
    assert counted == users
    assert total_recall / counted == pytest.approx(recall, rel=1e-12)
    assert total_ndcg / counted == pytest.approx(ndcg, rel=1e-12)


def test_ties_rank_the_lower_item_first_and_seen_items_never_count():
    scores = np.array([[1.0, 2.0, 2.0, 0.0]], np.float32)
    relevant = np.array([[False, False, True, True]])
    seen = np.array([[False, True, False, False]])
    # Items 1 and 2 tie; without exclusion item 1 is first and the top 1 misses item 2.
    unseen = ranking_metrics.ranking_sums(scores, relevant, k=1)
    assert [float(v) for v in unseen] == [0.0, 0.0, 1.0]
    # Item 1 seen: item 2 is first: one of two relevant items, the best possible first hit.
    excluded = ranking_metrics.ranking_sums(scores, relevant, k=1, exclude=seen)
    assert [float(v) for v in excluded] == [0.5, 1.0, 1.0]
    at3 = ranking_metrics.ranking_sums(scores, relevant, k=3, exclude=seen)
    ideal = 1 + 1 / math.log2(3)
    assert float(at3.recall) == 1.0
    assert float(at3.ndcg) == pytest.approx((1 + 1 / math.log2(4)) / ideal, rel=1e-12)


def test_a_list_longer_than_the_items_is_refused():
    with pytest.raises(ValueError, match=r"^k=5 is more than the 4 items scored; pass k <= 4\.$"):
        ranking_metrics.ranking_sums(tf.zeros([2, 4]), tf.zeros([2, 4]), k=5)
    with pytest.raises(ValueError, match=r"^k must be a whole number >= 1 \(the length"):
        ranking_metrics.ranking_sums(tf.zeros([2, 4]), tf.zeros([2, 4]), k=0)


def test_the_items_mask_of_a_logs_users_marks_their_items():
    log = Interactions(
        users=np.array([1, 0, 1, 1], np.int32),
        items=np.array([2, 0, 0, 2], np.int32),
        ratings=np.ones(4, np.float32),
        timestamps=np.arange(4, dtype=np.int64),
        num_users=3,
        num_items=4,
        user_ids=np.arange(3),
        item_ids=np.arange(4),
    )
    table = log.items_by_user()
    np.testing.assert_array_equal(table, [[0, -1, -1], [2, 0, 2], [-1, -1, -1]])
    mask = ranking_metrics.items_mask(table, 4).numpy()
    np.testing.assert_array_equal(mask, [[1, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]])


def numpy_auc(scores, labels):
    """Every positive-negative pair, in a loop: 1 when the positive scores higher, 1/2 on a tie."""
    positives = [s for s, label in zip(scores, labels) if label]
    negatives = [s for s, label in zip(scores, labels) if not label]
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


@pytest.mark.parametrize("replicas", [1, 2, 4])
def test_auc_gathered_from_every_replica_equals_the_pairwise_count(replicas):
    rng = np.random.default_rng(2)
    scores = np.round(rng.random(19), 1).astype(np.float32)  # ties within and across labels
    labels = (rng.random(19) < scores).astype(np.float32)
    strategy = loops.testing.replica_strategy(replicas)
    batches = loops.distribute(
        strategy, lambda: tf.data.Dataset.from_tensor_slices((scores, labels)).batch(8)
    )
    collector = ranking_metrics.ScoreCollector()
    for batch_scores, batch_labels in batches:
        collector.add(strategy, batch_scores, batch_labels)
    gathered, _ = collector.arrays()
    np.testing.assert_array_equal(gathered, scores.astype(np.float64))  # global row order
    assert collector.auc() == numpy_auc(scores, labels)
    collector.reset()
    assert math.isnan(collector.auc())


def test_auc_edges():
    assert ranking_metrics.auc([0.1, 0.9], [0, 1]) == 1.0
    assert ranking_metrics.auc([0.5, 0.5], [0, 1]) == 0.5
    assert math.isnan(ranking_metrics.auc([0.1, 0.9], [1, 1]))
    with pytest.raises(ValueError, match=r"^auc got 2 scores and 3 labels; pass one label"):
        ranking_metrics.auc([0.1, 0.9], [1, 0, 1])


def test_the_metric_agrees_with_the_numpy_baselines_on_a_split_log():
    from loops.input import interaction_baselines, interaction_logs
    from loops_data.interactions import generated_log

    log = generated_log(num_users=300, num_items=120, num_interactions=6000, seed=3)
    train, test = interaction_logs.split(log, how="random", test_fraction=0.2, seed=1)
    popularity = interaction_baselines.popularity_scores(train)  # many ties
    expected = interaction_baselines.ranking_metrics(popularity, train, test, k=10)
    seen = ranking_metrics.items_mask(train.items_by_user(), log.num_items)
    held_out = ranking_metrics.items_mask(test.items_by_user(), log.num_items)
    scores = tf.tile(tf.constant(popularity, tf.float32)[tf.newaxis], [log.num_users, 1])
    sums = ranking_metrics.ranking_sums(scores, held_out, k=10, exclude=seen)
    assert int(sums.users) == expected["users"] > 250
    assert float(sums.recall / sums.users) == pytest.approx(expected["recall@10"], rel=1e-12)
    assert float(sums.ndcg / sums.users) == pytest.approx(expected["ndcg@10"], rel=1e-12)
