"""Recommender logs as shards: the streaming pass numbers ids as the file reader does, streamed
rows train both recommenders as the same rows held in memory, 1, 2 and 4 replicas give the same
numbers on streamed batches, the baseline's passes equal the in-memory fit, and
loops-recommender on shards killed mid-epoch resumes to the uninterrupted run's weights on the
same layout and on another."""

import dataclasses
import json
import os
import signal

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import loops
from conftest import binary_run, final_weights, run_module
from loops.input import interaction_baselines, interaction_logs, interaction_streams
from loops.input.sharded_logs import ShardedLog
from loops.input.streaming_fit import Split
from loops_data import interactions as generated
from loops_data import recommender_data
from loops_data.in_memory import batches_in_memory
from loops_models import recommender


def log_table(rows=1500, seed=3):
    """A generated log with text item ids and user ids spread over int64."""
    log = generated.generated_log(num_users=60, num_items=60, num_interactions=rows, seed=seed)
    return pa.table(
        {
            "user_id": log.user_ids[log.users] * 1_000_003 - 7,
            "item": [f"film {v}" for v in log.items],
            "rating": log.ratings,
            "timestamp": log.timestamps,
        }
    )


def write_shards(folder, table, shards=3, group=97, file_format="parquet"):
    os.makedirs(folder, exist_ok=True)
    step = -(-table.num_rows // shards)
    for shard in range(shards):
        part = table.slice(shard * step, step)
        if file_format == "parquet":
            pq.write_table(part, os.path.join(folder, f"day-{shard}.parquet"), row_group_size=group)
        else:
            frame = part.to_pydict()
            with open(os.path.join(folder, f"day-{shard}.tsv"), "w") as stream:
                stream.write("\t".join(frame) + "\n")
                for row in zip(*frame.values(), strict=True):
                    stream.write("\t".join(str(v) for v in row) + "\n")
    return str(folder)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("interactions") / "log", log_table())


def streamed(folder, split=(0.2, 0.1), file_format=None):
    log = ShardedLog.open(folder, file_format=file_format)
    return interaction_streams.InteractionLog(log, Split(*split))


def test_the_pass_numbers_ids_as_the_file_reader_and_each_format_streams_the_same_rows(
    shards, tmp_path
):
    table = log_table()
    csv_path = tmp_path / "whole.csv"
    frame = table.to_pydict()
    csv_path.write_text(
        "user,item,rating,timestamp\n"
        + "".join(f"{u},{i},{r},{t}\n" for u, i, r, t in zip(*frame.values(), strict=True))
    )
    whole = interaction_logs.read_interactions(csv_path)
    tsv = write_shards(tmp_path / "tsv", table, shards=2, file_format="tsv")
    runs = {"parquet": streamed(shards), "tsv": streamed(tsv)}
    for name, rows in runs.items():
        np.testing.assert_array_equal(rows.fitted.user_ids, whole.user_ids, err_msg=name)
        np.testing.assert_array_equal(rows.fitted.item_ids, whole.item_ids, err_msg=name)
        assert rows.fitted.user_ids.dtype == np.int64 and rows.fitted.item_ids.dtype.kind == "U"
        # Every row, whatever part it fell in, has the indices of the file reader's.
        everything = interaction_streams.InteractionLog(rows.log, Split(0.0))
        blocks = list(everything.blocks("train"))
        for position, array in enumerate((whole.users, whole.items, whole.ratings)):
            np.testing.assert_array_equal(np.concatenate([b[position] for b in blocks]), array)
    parts = runs["parquet"].fitted.rows
    assert sum(parts.values()) == table.num_rows and min(parts.values()) > 50, parts
    # The training rows' item counts and rating sum, from the pass, equal the held pairs'.
    train = runs["parquet"].pairs("train")
    np.testing.assert_array_equal(runs["parquet"].fitted.item_counts(), train.item_counts())
    assert len(train) == parts["train"] and runs["parquet"].fitted.num_users == 60


def rating_definition(num_users, num_items, initial_bias):
    return loops.RatingLoop(
        model_fn=lambda: recommender.rating_model(
            num_users=num_users,
            num_items=num_items,
            embedding_dim=4,
            hidden_units=(6,),
            initial_bias=initial_bias,
            seed=3,
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(0.05),
        num_items=num_items,
    )


def retrieval_definition(num_users, num_items, frequencies):
    return loops.RetrievalLoop(
        user_model_fn=lambda: recommender.id_tower(
            num_ids=num_users, embedding_dim=4, seed=1, name="user_tower"
        ),
        item_model_fn=lambda: recommender.id_tower(
            num_ids=num_items, embedding_dim=4, seed=2, name="item_tower"
        ),
        optimizer_fn=lambda: keras.optimizers.Adam(0.05),
        num_items=num_items,
        global_batch_size=32,
        item_frequencies=frequencies,
        top_k=(5,),
    )


def trainer(strategy, definition, train_data, eval_data):
    return loops.Trainer(
        definition,
        strategy=strategy,
        train_data=train_data,
        eval_data=eval_data,
        steps_per_loop=4,
        progress=loops.testing.quiet_progress(),
    )


@pytest.mark.parametrize("model", ["rating", "retrieval"])
def test_streamed_rows_train_both_recommenders_as_the_same_rows_held_in_memory(shards, model):
    rows = streamed(shards)
    fitted = rows.fitted
    retrieval = model == "retrieval"
    ordered = rows.rows("train", with_ratings=not retrieval)
    stream = interaction_streams.log_streams.ordered_log_batches(
        ordered, global_batch_size=32, signature=interaction_streams.signature(not retrieval)
    )
    held = [block for block in rows.blocks("train")]
    arrays = tuple(np.concatenate([b[k] for b in held]) for k in range(2 if retrieval else 3))
    if retrieval:
        split = recommender_data.SplitLog(None, rows.pairs("train"), None, rows.pairs("test"))
        eval_data = split.trainer_data("retrieval", global_batch_size=16, seed=0)["eval_data"]

        def build():
            return retrieval_definition(fitted.num_users, fitted.num_items, fitted.item_counts())
    else:
        eval_data = rows.eval_batches("test", global_batch_size=50)

        def build():
            return rating_definition(fitted.num_users, fitted.num_items, fitted.mean_rating())

    runs = {}
    for name, train_data in {
        "streamed": lambda: stream().repeat(),
        "memory": lambda: batches_in_memory(arrays, 32).repeat(),
    }.items():
        run = trainer(loops.testing.replica_strategy(1), build(), train_data, eval_data)
        logs = run.train(12)
        runs[name] = {"logs": logs, "weights": loops.testing.loop_weights(run),
                      "eval": run.state.last_eval_metrics}  # fmt: skip
        run.close()
    loops.testing.assert_runs_agree(runs["streamed"], runs["memory"], rtol=1e-6, label="memory")
    if not retrieval:
        assert runs["streamed"]["eval"]["pairs"] == fitted.rows["test"]


def test_streamed_shuffled_batches_give_the_same_numbers_on_1_2_and_4_replicas(shards):
    rows = streamed(shards)
    fitted = rows.fitted
    # Eval batches of 24 over the validation rows: the last one partial.
    assert fitted.rows["validation"] % 24, fitted.rows

    def build(strategy):
        return trainer(
            strategy,
            rating_definition(fitted.num_users, fitted.num_items, fitted.mean_rating()),
            rows.train_batches(with_ratings=True, global_batch_size=32, seed=9, window_blocks=2),
            rows.eval_batches("validation", global_batch_size=24),
        )

    runs = loops.testing.assert_replica_parity(build, num_steps=12)
    assert runs[4]["eval"]["pairs"] == fitted.rows["validation"]
    assert np.all(np.isfinite(runs[1]["logs"]["loss"]))


def test_the_baselines_from_passes_equal_the_in_memory_fits(shards):
    rows = streamed(shards)
    blocks = {part: list(rows.blocks(part)) for part in ("train", "test")}

    def held(part):  # the part's rows in memory, as the file reader holds them
        ratings = np.concatenate([b[2] for b in blocks[part]])
        return dataclasses.replace(
            rows.pairs(part), ratings=ratings, timestamps=np.zeros(len(ratings), np.int64)
        )

    train, test = held("train"), held("test")
    whole = interaction_baselines.fit_bias_baseline(train)
    passes = interaction_baselines.fit_bias_baseline_over(
        lambda: iter(blocks["train"]), num_users=train.num_users, num_items=train.num_items
    )
    assert passes.mean == pytest.approx(whole.mean, rel=1e-12)
    np.testing.assert_allclose(passes.user_bias, whole.user_bias, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(passes.item_bias, whole.item_bias, rtol=1e-9, atol=1e-12)
    expected = whole.rmse(test)
    assert interaction_baselines.bias_rmse(passes, blocks["test"]) == pytest.approx(
        expected, rel=1e-9
    )
    assert 0.5 < expected < 2.0


def test_a_time_split_of_a_stream_cuts_the_log_in_time_at_the_fractions_it_is_given(shards):
    rows = interaction_streams.InteractionLog(ShardedLog.open(shards), Split(0.2, 0.1), how="time")
    cuts, counts = rows.cuts, rows.fitted.rows
    times = np.sort(np.asarray(log_table()["timestamp"]))
    # Fewer rows than the sketch's points: the cuts are the exact quantiles' timestamps.
    assert cuts.test_from == times[int(0.8 * len(times))], cuts
    assert counts["test"] == int(np.sum(times >= cuts.test_from)) == round(0.2 * len(times))
    assert counts["validation"] == int(np.sum((times >= cuts.validation_from)
                                             & (times < cuts.test_from)))  # fmt: skip
    assert abs(counts["validation"] - 0.1 * (len(times) - counts["test"])) <= 1, counts
    for part, (low, high) in cuts.ranges().items():
        found = rows.rows(part)
        read = [interaction_streams.timestamps(found.part.read(b), "timestamp")
                for b in range(len(rows.log.blocks))]  # fmt: skip
        joined = np.concatenate(read)
        assert len(joined) == counts[part] == int(found.counts().sum()), part
        assert (low is None or joined.min() >= low) and (high is None or joined.max() < high)
    # The streamed batches of a time split resume at any batch as a hash split's do.
    batches = rows.train_batches(with_ratings=True, global_batch_size=32, seed=4)
    first = [b for _, b in zip(range(30), batches.batches_from(0), strict=False)]
    again = [b for _, b in zip(range(10), batches.batches_from(20), strict=False)]
    for one, two in zip(first[20:], again, strict=True):
        for a, b in zip(one, two, strict=True):
            np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_a_resume_reads_the_ids_its_run_numbered_and_another_split_numbers_anew(shards, tmp_path):
    from loops_data import recommender_streams

    data = {"data": shards, "format": None, "split": "time", "test_fraction": 0.2,
            "validation_fraction": 0.1, "shuffle_window": 2}  # fmt: skip
    first = recommender_streams.read_streamed(data)
    assert first.rows.log.opened  # the cut pass and the id pass read the blocks
    (tmp_path / recommender_streams.IDS_FILE).write_text(first.ids_file())
    again = recommender_streams.read_streamed(data, model_dir=str(tmp_path))
    assert again.rows.log.opened == []  # no block read: the saved pass is taken
    assert again.rows.cuts == first.rows.cuts
    assert again.rows.fitted.to_json() == first.rows.fitted.to_json()
    np.testing.assert_array_equal(again.rows.fitted.user_ids, first.rows.fitted.user_ids)
    assert again.rows.fitted.item_ids.dtype.kind == "U"
    other = recommender_streams.read_streamed(
        {**data, "test_fraction": 0.3}, model_dir=str(tmp_path)
    )
    assert other.rows.log.opened and other.rows.fitted.rows["test"] > first.rows.fitted.rows["test"]


def test_a_streamed_log_refuses_what_it_cannot_do_and_names_the_fix(shards, tmp_path):
    from loops_data import recommender_streams

    data = {"data": shards, "split": "random"}
    with pytest.raises(ValueError, match="--user_history holds"):
        recommender_streams.check_streamable(data, {"user_history": True})
    with pytest.raises(ValueError, match="--continue_from=old grows"):
        recommender_streams.check_streamable(data, {}, "old")
    # The binary refuses it before any work: no model_dir made, no traceback.
    done = run_module(
        "loops.bin.recommender", f"--data={shards}", "--model=rating", "--user_history",
        f"--model_dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "--user_history holds every user's training items" in done.stderr
    assert not (tmp_path / "run").exists()
    no_user = tmp_path / "no_user"
    no_user.mkdir()
    pq.write_table(pa.table({"item": [1, 2], "rating": [1.0, 2.0]}), no_user / "a.parquet")
    with pytest.raises(ValueError, match="has no user column .*name it user or user_id or userid"):
        streamed(str(no_user))
    pq.write_table(pa.table({"user": [1, 2], "item": [1, 2]}), no_user / "a.parquet")
    with pytest.raises(ValueError, match="has no timestamp column .* pass --split=random"):
        interaction_streams.InteractionLog(ShardedLog.open(str(no_user)), Split(0.5), how="time")
    bad = tmp_path / "bad"
    bad.mkdir()
    pq.write_table(
        pa.table({"user": [1, None, 3], "item": ["a", "b", "c"], "rating": [1.0, 2.0, 3.0]}),
        bad / "a.parquet",
    )
    with pytest.raises(ValueError, match=r"a\.parquet row 1: the user id is empty"):
        streamed(str(bad))
    pq.write_table(
        pa.table({"user": [1, 2, 3], "item": ["a", "b", "c"], "rating": [1.0, float("nan"), 3.0]}),
        bad / "a.parquet",
    )
    with pytest.raises(ValueError, match=r"row 1: the rating nan is not a finite number"):
        streamed(str(bad))


# ---- loops-recommender on shards, killed mid-epoch (SIGKILL) and resumed. ----


def recommender_run(model_dir, shards, *extra, kill_after=None):
    flags = [
        f"--data={shards}",
        f"--model_dir={model_dir}",
        "--model=rating",
        "--train_steps=40",
        "--steps_per_loop=5",
        "--checkpoint_every=5",
        "--eval_every=40",
        "--global_batch_size=32",
        "--shuffle_window=2",
        "--embedding_dim=4",
        "--table_optimizer=adagrad",
        "--seed=1",
        *extra,
    ]
    return binary_run("loops.bin.recommender", flags, kill_after=kill_after)


def test_loops_recommender_on_shards_killed_mid_epoch_resumes_bit_identical_here_and_moved(
    tmp_path, shards
):
    runs = {
        "whole": recommender_run(tmp_path / "whole", shards),
        # Killed as its first call after the checkpoint of step 15 starts: about 1,080
        # training rows are 34 batches, so the kill is mid-epoch and the resume mid-window.
        "killed": recommender_run(tmp_path / "same", shards, kill_after=15),
        "moved": recommender_run(tmp_path / "moved", shards, kill_after=15),
    }
    assert runs["whole"].returncode == 0, runs["whole"].stderr[-3000:]
    for name in ("killed", "moved"):
        assert runs[name].returncode == -signal.SIGKILL, runs[name].stderr[-3000:]
    step = int(tf.train.latest_checkpoint(str(tmp_path / "same" / "checkpoints")).rsplit("-")[-1])
    assert step == 15
    # The killed run's id pass, kept beside its checkpoints, is what the resume reads.
    kept = json.loads((tmp_path / "same" / "streamed_ids.json").read_text())
    assert kept["fitted"]["rows"] == streamed(shards).fitted.rows
    same = recommender_run(tmp_path / "same", shards)
    moved = recommender_run(tmp_path / "moved", shards, "--num_replicas=2")
    for done in (same, moved):
        assert done.returncode == 0, done.stderr[-3000:]
    expected = final_weights(tmp_path / "whole")
    assert len(expected) >= 6
    for name, array in final_weights(tmp_path / "same").items():
        np.testing.assert_array_equal(array, expected[name], err_msg=name)
    for name, array in final_weights(tmp_path / "moved").items():
        np.testing.assert_allclose(array, expected[name], rtol=1e-5, atol=1e-7, err_msg=name)
    results = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert results["data"]["source"].endswith(f"3 shards, {log_table().num_rows} rows (streamed)")
    counts = streamed(shards).fitted.rows
    assert results["test"]["pairs"] == results["data"]["test_interactions"] == counts["test"]
    assert results["test"]["rmse"] < results["test"]["bias_baseline_rmse"] + 0.5
    ids = json.loads((tmp_path / "whole" / "ids.json").read_text())
    assert len(ids["users"]) == 60 and ids["items"][0] == "film 0"


def test_format_and_a_time_split_are_taken_as_documented_by_the_binary(tmp_path):
    # One TSV shard named by --format (without it a single .tsv streams too), cut in time.
    write_shards(tmp_path / "tsv", log_table(), shards=1, file_format="tsv")
    done = run_module(
        "loops.bin.recommender", f"--data={tmp_path / 'tsv' / 'day-0.tsv'}", "--format=tsv",
        "--split=time", "--model=rating", "--train_steps=2", "--eval_every=2",
        "--global_batch_size=32", "--embedding_dim=4", "--table_optimizer=adagrad",
        "--validation_fraction=0", f"--model_dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["global_step"] == 2
    assert results["data"]["source"].endswith(", tsv, 1 shards, 1198 rows (streamed)")
    assert results["data"]["split"].startswith("by a cut in time: test the rows whose timestamp")
    assert results["data"]["test_interactions"] == round(0.2 * 1198)
    kept = json.loads((tmp_path / "run" / "streamed_ids.json").read_text())
    assert kept["cuts"]["column"] == "timestamp"
