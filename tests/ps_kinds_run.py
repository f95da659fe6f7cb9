"""Trains the rating, retrieval, LM, GAN and click-through kinds under the exact parameter-server
mode in one local cluster, and each on one replica and on 2 mirrored replicas; prints the
differences as JSON (and trains the first three in the asynchronous mode, which the GAN
refuses).

Usage: `python ps_kinds_run.py WORKERS SERVERS STEPS`. This process is the chief of a
cluster of WORKERS workers and SERVERS servers on 127.0.0.1, started once for every
kind. The references train first: a process connected to a cluster keeps its eager
context remote. The recommenders' tables are `loops.EmbeddingTable`s (split over the
servers) on one replica and in the cluster, and `keras.layers.Embedding`s trained by
Adagrad rows on the mirrored replicas (which an EmbeddingTable refuses), all from the
same initial values. The click-through models (wide & deep, DCN-v2, DLRM over numeric,
categorical and multi-hot columns, empty bags included) build every table as a
`loops.EmbeddingTable` of its own row-wise Adagrad, placed by each strategy: whole on one
replica, split over the 2 mirrored replicas and over the servers. 21 rows in batches of 8:
step 3 reads a partial batch of 5 (the GAN, two batches a step, reads it in step 2).
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import loops  # noqa: E402
from conftest import make_trainer  # noqa: E402  (4 CPUs)
from loops import (
    keras_private,  # noqa: E402
    testing,  # noqa: E402
)
from loops.tables import embedding_tables  # noqa: E402
from loops_data import ctr_data  # noqa: E402
from loops_models import ctr as ctr_models  # noqa: E402
from loops_models import gan as gan_models  # noqa: E402

USERS, ITEMS, DIM, ROWS, BATCH = 7, 9, 4, 21, 8
VOCAB, LENGTH = 12, 6
RATE = 0.05


def interactions():
    rng = np.random.default_rng(4)
    users = rng.integers(0, USERS, ROWS).astype(np.int32)
    items = rng.integers(0, ITEMS, ROWS).astype(np.int32)
    ratings = rng.integers(1, 6, ROWS).astype(np.float32)
    return users, items, ratings


def batches(arrays):
    return lambda: tf.data.Dataset.from_tensor_slices(arrays).batch(BATCH)


def table(rows, own, name):
    """An EmbeddingTable (own Adagrad, split over the servers) or a keras Embedding, set to
    the same initial rows after the model is built (`set_tables`)."""
    if own:
        return loops.EmbeddingTable(rows, DIM, keras.optimizers.Adagrad(RATE), name=name)
    return keras.layers.Embedding(rows, DIM, name=name)


def set_tables(model):
    """Every table of `model` to its fixed initial rows (an EmbeddingTable's depend on its
    shard count otherwise)."""
    for layer in layers(model):
        if isinstance(layer, loops.EmbeddingTable):
            layer.embeddings.assign(initial_rows(layer.rows, layer.name))
        elif isinstance(layer, keras.layers.Embedding):
            layer.embeddings.assign(initial_rows(layer.input_dim, layer.name))
    return model


def layers(model):
    return keras_private.nested_layers(model, include_self=False)


def initial_rows(rows, name):
    rng = np.random.default_rng(len(name) * 100 + rows)
    return rng.uniform(-0.5, 0.5, (rows, DIM)).astype(np.float32)


def rating_model(own):
    users = keras.Input((), dtype="int32")
    items = keras.Input((), dtype="int32")
    user_rows = table(USERS, own, "user_table")(users)
    item_rows = table(ITEMS, own, "item_table")(items)
    joined = keras.ops.concatenate([user_rows * item_rows, user_rows, item_rows], axis=-1)
    head = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(1))
    scores = keras.ops.squeeze(head(joined), -1)
    return set_tables(keras.Model([users, items], scores))


def tower(rows, own, name):
    ids = keras.Input((), dtype="int32")
    found = table(rows, own, name + "_table")(ids)
    # No bias: an item bias moves every logit of a row alike, its gradient 0 up to rounding,
    # which Adam would turn into updates that differ with the summation order.
    dense = keras.layers.Dense(
        DIM, use_bias=False, kernel_initializer=keras.initializers.GlorotUniform(2)
    )
    return set_tables(keras.Model(ids, dense(found), name=name))


def lm_model():
    tokens = keras.Input((None,), dtype="int32")
    embedded = keras.layers.Embedding(
        VOCAB, DIM, embeddings_initializer=keras.initializers.RandomUniform(seed=3)
    )(tokens)
    hidden = keras.layers.Dense(8, "tanh", kernel_initializer=keras.initializers.GlorotUniform(4))
    logits = keras.layers.Dense(VOCAB, kernel_initializer=keras.initializers.GlorotUniform(5))
    return keras.Model(tokens, logits(hidden(embedded)))


def adam():
    return keras.optimizers.Adam(RATE, epsilon=1e-3)


def rating(strategy, data=None, **settings):
    """The rating model on `interactions()`, or on `data` (its train_data and eval_data)."""
    if data is None:
        rows = batches(interactions())
        data = {"train_data": rows, "eval_data": rows}
    own = strategy.num_replicas_in_sync == 1
    return make_trainer(
        loops.RatingLoop,
        model_fn=lambda: rating_model(own),
        optimizer_fn=adam,
        table_optimizer_fn=None if own else lambda: keras.optimizers.Adagrad(RATE),
        strategy=strategy,
        progress=testing.quiet_progress(),
        **data,
        **settings,
    )


def retrieval(strategy, **settings):
    users, items, _ = interactions()
    own = strategy.num_replicas_in_sync == 1
    seen = np.full((USERS, 1), -1, np.int32)
    held_out = np.arange(USERS, dtype=np.int32)[:, None] % ITEMS
    return make_trainer(
        loops.RetrievalLoop,
        user_model_fn=lambda: tower(USERS, own, "users"),
        item_model_fn=lambda: tower(ITEMS, own, "items"),
        optimizer_fn=adam,
        table_optimizer_fn=None if own else lambda: keras.optimizers.Adagrad(RATE),
        num_items=ITEMS,
        global_batch_size=BATCH,
        item_frequencies=np.bincount(items, minlength=ITEMS) + 1,
        temperature=0.5,
        top_k=(3,),
        strategy=strategy,
        train_data=batches((users, items)),
        eval_data=batches((np.arange(USERS, dtype=np.int32), seen, held_out)),
        progress=testing.quiet_progress(),
        **settings,
    )


def lm(strategy, **settings):
    rng = np.random.default_rng(6)
    tokens = rng.integers(0, VOCAB, (ROWS, LENGTH + 1)).astype(np.int32)
    lengths = rng.integers(2, LENGTH + 2, ROWS).astype(np.int32)  # padding differs by row
    return make_trainer(
        loops.LanguageModelLoop,
        model_fn=lm_model,
        optimizer_fn=adam,
        sequence_length=LENGTH,
        sample_prompts=(),
        strategy=strategy,
        train_data=batches((tokens, lengths)),
        progress=testing.quiet_progress(),
        **settings,
    )


def gan(strategy, **settings):
    angles = np.random.default_rng(7).uniform(0, 2 * np.pi, ROWS)
    points = np.stack([np.cos(angles), np.sin(angles)], axis=1).astype(np.float32)
    # Adam's epsilon 1e-3: a critic gradient that is 0 up to rounding stays a tiny update.
    return make_trainer(
        loops.GANLoop,
        generator_fn=lambda: gan_models.ring_generator(noise_dim=4, hidden_units=(8,), seed=4),
        discriminator_fn=lambda: gan_models.ring_discriminator(hidden_units=(8,), seed=4),
        generator_optimizer_fn=lambda: keras.optimizers.Adam(0.01, beta_1=0.5, epsilon=1e-3),
        discriminator_optimizer_fn=lambda: keras.optimizers.Adam(0.02, epsilon=1e-3),
        gan_loss="wgan_gp",
        n_critic=2,
        num_eval_samples=10,
        strategy=strategy,
        train_data=lambda: tf.data.Dataset.from_tensor_slices(points).batch(BATCH),
        ema_decay=0.9,
        seed=11,
        progress=testing.quiet_progress(),
        **settings,
    )


def click_through(builder):
    """The CTRLoop of `builder`'s model (loops_models.ctr) on a small click log."""
    log = ctr_data.click_log(ROWS, seed=10, cardinality=6, bag_cardinality=7, longest_bag=3)
    log = log.only(["I1", "I2", "C1", "C2", "tags", "history"])
    features = ctr_models.CTRFeatures(**log.description())

    def build(strategy, **settings):
        data = lambda: ctr_data.one_pass(log, BATCH)  # noqa: E731
        return ctr_trainer(builder, features, strategy, data, data, **settings)

    return build


def ctr_trainer(builder, features, strategy, train_data, eval_data, **settings):
    """The CTRLoop of `builder`'s model over `features`, its tables by row-wise Adagrad."""
    return make_trainer(
        loops.CTRLoop,
        model_fn=lambda: ctr_models.build_model(
            builder,
            features,
            embedding_dim=DIM,
            hidden_units=6,
            hidden_layers=1,
            seed=3,
            table_optimizer_fn=lambda: loops.RowwiseAdagrad(0.5),
        ),
        optimizer_fn=adam,
        strategy=strategy,
        train_data=train_data,
        eval_data=eval_data,
        progress=testing.quiet_progress(),
        **settings,
    )


def streamed_click_through(strategy, **settings):
    """DCN-v2 on a click log of 3 Parquet shards streamed (`loops.input.feature_streams`):
    shuffled full batches of its training rows, its test rows evaluated (a partial batch)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loops.input import feature_streams, feature_tables, sharded_logs, streaming_fit
    from loops_data.ctr_tables import features_of

    folder = os.path.abspath("streamed_log")
    if not os.path.isdir(folder):
        log = ctr_data.click_log(90, seed=12, numeric_columns=2, categorical_columns=2,
                                 multi_hot_columns=1, cardinality=6, bag_cardinality=5)  # fmt: skip
        columns = {"clicked": log.labels.astype(np.int64), "I1": log.columns["I1"]}
        columns["C1"] = [f"v{value}" for value in log.columns["C1"]]
        columns["tags"] = ["|".join(str(v) for v in bag if v >= 0) for bag in log.columns["tags"]]
        os.makedirs(folder)
        for shard in range(3):
            part = pa.table(columns).slice(shard * 30, 30)
            pq.write_table(part, f"{folder}/part-{shard}.parquet", row_group_size=10)
    spec = feature_tables.FeatureSpec.from_json({"label": "clicked", "columns": [
        {"name": "I1", "kind": "numeric", "buckets": 4},
        {"name": "C1", "kind": "categorical"},
        {"name": "tags", "kind": "multi_hot"},
    ]})  # fmt: skip
    log = sharded_logs.ShardedLog.open(folder)
    split = streaming_fit.Split(0.3)
    fitted = streaming_fit.fit_log(spec, log, split.bands()["train"])
    rows = feature_streams.FeatureLog(log, fitted, split)
    features = ctr_models.CTRFeatures(**features_of(fitted))
    return ctr_trainer(
        "dcn_v2",
        features,
        strategy,
        rows.train_batches(global_batch_size=BATCH, seed=4, window_blocks=2),
        rows.eval_batches("test", global_batch_size=BATCH),
        **settings,
    )


def streamed_rating(strategy, **settings):
    """The rating model on an interaction log of 3 Parquet shards streamed
    (`loops.input.interaction_streams`): shuffled full batches of its training rows (every
    user and item among its 90 rows), its test rows evaluated (a partial last batch)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loops.input import interaction_streams, sharded_logs, streaming_fit

    folder = os.path.abspath("streamed_interactions")
    if not os.path.isdir(folder):
        rng = np.random.default_rng(6)
        columns = {
            "user": np.concatenate([np.arange(USERS), rng.integers(0, USERS, 90 - USERS)]),
            "item": np.concatenate([np.arange(ITEMS), rng.integers(0, ITEMS, 90 - ITEMS)]),
            "rating": rng.integers(1, 6, 90).astype(np.float32),
        }
        os.makedirs(folder)
        for shard in range(3):
            part = pa.table(columns).slice(shard * 30, 30)
            pq.write_table(part, f"{folder}/part-{shard}.parquet", row_group_size=10)
    log = sharded_logs.ShardedLog.open(folder)
    rows = interaction_streams.InteractionLog(log, streaming_fit.Split(0.3))
    assert (rows.fitted.num_users, rows.fitted.num_items) == (USERS, ITEMS)
    data = {
        "train_data": rows.train_batches(
            with_ratings=True, global_batch_size=BATCH, seed=4, window_blocks=2
        ),
        "eval_data": rows.eval_batches("test", global_batch_size=BATCH),
    }
    return rating(strategy, data, **settings)


# Raw ids of the users and items: whole numbers of any size, and strings.
RAW_USERS = np.array([5, 2**40, -3, 77, 1_000_003, 8, 12], np.int64)
RAW_ITEMS = np.array([f"item-{index * 7}" for index in range(ITEMS)])


def dynamic_rating(strategy, **settings):
    """The rating model over 4 `loops.DynamicTable`s of 4 rows (7 users and 9 items compete
    for them: the steps admit, evict and refuse), each trained by its Adagrad rows."""
    from loops_models import recommender

    rows = batches(interactions())
    return make_trainer(
        loops.RatingLoop,
        model_fn=lambda: recommender.rating_model(
            num_users=USERS,
            num_items=ITEMS,
            embedding_dim=DIM,
            hidden_units=(6,),
            l2=0.01,
            seed=3,
            table_optimizer_fn=lambda: keras.optimizers.Adagrad(RATE),
            user_ids=RAW_USERS,
            item_ids=RAW_ITEMS,
            dynamic={"capacity": 4, "admit_after": 1},
        ),
        optimizer_fn=adam,
        num_items=ITEMS,
        strategy=strategy,
        train_data=rows,
        eval_data=rows,
        global_batch_size=BATCH,  # bounds the ids a mirrored replica exchanges
        progress=testing.quiet_progress(),
        **settings,
    )


CTR_MODELS = tuple(f"ctr {builder}" for builder in ctr_models.MODELS)
KINDS = {
    "rating": rating,
    "retrieval": retrieval,
    "lm": lm,
    "gan": gan,
    **{kind: click_through(kind.removeprefix("ctr ")) for kind in CTR_MODELS},
    "ctr streamed": streamed_click_through,
    "rating streamed": streamed_rating,
    "rating dynamic": dynamic_rating,
}
COUNTED = {
    "rating": "pairs",
    "retrieval": "interactions",
    "lm": "tokens",
    "gan": "num_examples",
    **dict.fromkeys(CTR_MODELS, "examples"),
    "ctr streamed": "examples",
    "rating streamed": "pairs",
    "rating dynamic": "pairs",
}
ASYNCHRONOUS = ("rating", "retrieval", "lm")


def weights(trainer):
    """The model's weights in layer order, each table whole (whatever its shards); a GAN's
    checkpointed variables (both networks, their optimizers, the moving average), as a
    click-through model's (its tables whole, their slots too)."""
    model = getattr(trainer.definition, "model", None)
    dynamic = model is not None and any(
        isinstance(table, loops.DynamicTable) for table in embedding_tables.tables_in(model)
    )
    if dynamic:  # and each dynamic table's map (its ids, rows, counts, counters, step)
        from loops.tables import id_map

        return {
            **testing.loop_weights(trainer),
            **{
                f"map_{table.name}_{field}": np.asarray(getattr(table, f"map_{field}"))
                for table in embedding_tables.tables_in(model)
                for field in id_map.FIELDS
            },
        }
    if isinstance(trainer.definition, loops.GANLoop | loops.CTRLoop):
        return testing.loop_weights(trainer)
    found = []
    for layer in layers(trainer.definition.model):
        if isinstance(layer, loops.EmbeddingTable):
            found.append(tf.convert_to_tensor(layer.embeddings).numpy())
        elif not isinstance(layer, keras.Model):
            found.extend(np.asarray(variable) for variable in layer.weights)
    return {str(index): value for index, value in enumerate(found)}


def train_run(build, strategy, steps, **settings):
    trainer = build(strategy, **settings)
    logs = trainer.train(steps)
    names = sorted(name for name in logs if not name.startswith("health"))
    model = getattr(trainer.definition, "model", None)
    tables = [] if model is None else embedding_tables.tables_in(model)
    return {
        "logs": {name: np.asarray(logs[name]) for name in names},
        "weights": weights(trainer),
        "eval": trainer.state.last_eval_metrics,
        # How many blocks each loops.EmbeddingTable is split into, by table.
        "table_shards": sorted({len(table.shards) for table in tables}),
    }


def largest_difference(run, reference):
    parts = [run["weights"], {f"log {k}": v for k, v in run["logs"].items()}]
    wanted = [reference["weights"], {f"log {k}": v for k, v in reference["logs"].items()}]
    return max(
        testing.relative_error(got[key], want[key])
        for got, want in zip(parts, wanted)
        for key in want
    )


MIRRORED_DYNAMIC = "dynamic_saved_by_2_mirrored"


def dynamic_resumed(build, strategy, exact, steps) -> dict:
    """The dynamic tables' run stopped one step before the end and continued on the cluster,
    from its own checkpoint and from 2 mirrored replicas' (`MIRRORED_DYNAMIC`): each to the
    uninterrupted `exact` run, its maps to the last bit; the largest differences."""
    build(strategy, model_dir="dynamic_on_servers").train(steps - 1)
    found = {}
    for name, model_dir in (("servers", "dynamic_on_servers"), ("mirrored", MIRRORED_DYNAMIC)):
        resumed = build(strategy, model_dir=model_dir)
        restored = int(resumed.global_step.numpy())
        resumed.train(steps)
        got = weights(resumed)
        for key in (key for key in exact["weights"] if "map_" in key):
            np.testing.assert_array_equal(got[key], exact["weights"][key], err_msg=f"{name} {key}")
        testing.assert_close(got, exact["weights"], rtol=1e-5, label=f"resumed from {name}")
        found[name] = {
            "restored_step": restored,
            "difference": largest_difference(
                {"weights": got, "logs": {}}, {"weights": exact["weights"], "logs": {}}
            ),
        }
    return found


def main(workers, servers, steps):
    spec, processes = testing.local_parameter_server(workers, servers)
    references = {
        kind: {
            name: train_run(build, testing.replica_strategy(replicas), steps)
            for name, replicas in (("1 replica", 1), ("2 mirrored", 2))
            # The GAN's mirrored parity is tests/test_gan.py's; its one replica suffices here.
            if kind != "gan" or replicas == 1
        }
        for kind, build in KINDS.items()
    }
    # Saved by 2 mirrored replicas one step before the end, for the cluster to continue.
    KINDS["rating dynamic"](testing.replica_strategy(2), model_dir=MIRRORED_DYNAMIC).train(
        steps - 1
    )
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(spec), task_type="chief", task_id=0, rpc_layer="grpc"
    )
    strategy = tf.distribute.experimental.ParameterServerStrategy(
        resolver, variable_partitioner=loops.TablePartitioner(servers)
    )
    report = {}
    for kind, build in KINDS.items():
        exact = train_run(build, strategy, steps)
        report[kind] = {
            "counted": exact["logs"][COUNTED[kind]].tolist(),
            "table_shards": exact["table_shards"],
        }
        if kind.startswith("ctr"):
            report[kind]["eval"] = {
                name: float(exact["eval"][name]) for name in ("examples", "auc")
            }
        for name, reference in references[kind].items():
            for key in (key for key in reference["weights"] if "map_" in key):
                # A dynamic table's map (ids, rows, counts, counters): equal to the last bit.
                np.testing.assert_array_equal(
                    exact["weights"][key], reference["weights"][key], err_msg=f"{name} {key}"
                )
            testing.assert_close(exact["weights"], reference["weights"], rtol=1e-5, label=name)
            testing.assert_close(exact["logs"], reference["logs"], rtol=1e-5, label=name)
            testing.assert_close(exact["eval"], reference["eval"], rtol=1e-5, label=name)
            report[kind][name] = largest_difference(exact, reference)
        report[kind]["loss"] = exact["logs"]["d_loss" if kind == "gan" else "loss"].tolist()
        if "ids_evicted" in exact["logs"]:
            report[kind]["ids"] = {
                name: exact["logs"][name].tolist()
                for name in ("ids_resident", "ids_evicted", "ids_refused")
            }
            report[kind]["map_keys"] = sum("map_" in key for key in exact["weights"])
            report[kind]["resumed"] = dynamic_resumed(build, strategy, exact, steps)
        if kind in ASYNCHRONOUS:
            asynchronous = train_run(build, strategy, steps, parameter_server_mode="async")
            report[kind]["async_loss"] = asynchronous["logs"]["loss"].tolist()
            report[kind]["async_counted"] = asynchronous["logs"][COUNTED[kind]].tolist()
    print("RESULT " + json.dumps(report), flush=True)
    for process in processes.values():
        process.kill()
    os._exit(0)  # the coordinator's threads would go on trying to reach the killed tasks


if __name__ == "__main__":
    main(*(int(argument) for argument in sys.argv[1:4]))
