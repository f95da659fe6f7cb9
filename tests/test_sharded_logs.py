"""Sharded feature logs: the same rows in every format give the same statistics and arrays, the
statistics pass is the same split over processes and in any shard order, the vectorized
preparation equals the row-by-row one, and a stream resumed at any batch reads only its window
and gives the uninterrupted stream's batches."""

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

from loops.input import (
    arrow_features,
    feature_streams,
    feature_tables,
    log_identity,
    log_streams,
    sharded_logs,
    streaming_fit,
)

ROWS = 3000
SPEC = {
    "label": "clicked",
    "columns": [
        {"name": "age", "kind": "numeric", "buckets": 8},
        {"name": "visits", "kind": "numeric", "normalize": "log", "fill": 0, "buckets": 4},
        {"name": "city", "kind": "categorical", "min_count": 3},
        {"name": "device", "kind": "categorical", "hash_buckets": 7},
        {"name": "site", "kind": "categorical", "max_vocabulary": 5},
        {"name": "city_x_site", "kind": "categorical", "cross": ["city", "site"]},
        {"name": "tags", "kind": "multi_hot", "pooling": "sum"},
    ],
}


def rows(count=ROWS, seed=0):
    """Columns of generated rows, as text and numbers a CSV or Parquet file holds."""
    rng = np.random.default_rng(seed)
    visits = [("" if v % 11 == 0 else str(int(v))) for v in rng.poisson(4, count)]
    return {
        "clicked": (rng.random(count) < 0.3).astype(np.int64),
        "age": np.round(rng.normal(40, 12, count), 3),
        "visits": visits,
        "city": [f"city{v}" for v in rng.zipf(1.6, count) % 40],
        "device": [f"d{v}" for v in rng.integers(0, 20, count)],
        "site": (rng.zipf(1.4, count) % 30).astype(np.int64),
        "tags": [
            "|".join(f"t{t}" for t in rng.integers(0, 9, k)) for k in rng.integers(0, 4, count)
        ],
    }


def write_parquet(columns, folder, shards=3, group=400):
    os.makedirs(folder, exist_ok=True)
    table = pa.table(columns)
    step = -(-table.num_rows // shards)
    for shard in range(shards):
        pq.write_table(
            table.slice(shard * step, step), f"{folder}/part-{shard}.parquet", row_group_size=group
        )
    return str(folder)


def write_text(columns, folder, delimiter, suffix, shards=3):
    os.makedirs(folder, exist_ok=True)
    names = list(columns)
    count = len(columns[names[0]])
    step = -(-count // shards)
    for shard in range(shards):
        with open(f"{folder}/part-{shard}{suffix}", "w") as stream:
            stream.write(delimiter.join(names) + "\n")
            for row in range(shard * step, min(count, (shard + 1) * step)):
                stream.write(delimiter.join(str(columns[n][row]) for n in names) + "\n")
    return str(folder)


def write_tfrecord(columns, folder, shards=3):
    os.makedirs(folder, exist_ok=True)
    names = list(columns)
    count = len(columns[names[0]])
    step = -(-count // shards)

    def feature(name, value):
        if name == "tags":
            values = [v.encode() for v in value.split("|")] if value else []
            return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
        if isinstance(value, (int, np.integer)):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
        if isinstance(value, (float, np.floating)):
            return tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[str(value).encode()]))

    for shard in range(shards):
        with tf.io.TFRecordWriter(f"{folder}/part-{shard}.tfrecord") as writer:
            for row in range(shard * step, min(count, (shard + 1) * step)):
                example = tf.train.Example(
                    features=tf.train.Features(
                        feature={n: feature(n, columns[n][row]) for n in names}
                    )
                )
                writer.write(example.SerializeToString())
    return str(folder)


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    base = tmp_path_factory.mktemp("logs")
    columns = rows()
    return {
        "parquet": write_parquet(columns, base / "parquet"),
        "csv": write_text(columns, base / "csv", ",", ".csv"),
        "tsv": write_text(columns, base / "tsv", "\t", ".tsv"),
        "tfrecord": write_tfrecord(
            {**columns, "age": columns["age"].astype(np.float32)}, base / "tfrecord"
        ),  # fmt: skip
    }


def spec():
    return feature_tables.FeatureSpec.from_json(SPEC)


def whole_table(columns):
    listed = {n: (v.tolist() if hasattr(v, "tolist") else list(v)) for n, v in columns.items()}
    return feature_tables.Table("whole", listed, "row", 0)


def test_the_statistics_pass_equals_fit_on_the_whole_table_in_every_text_and_parquet_format(
    logs,
):
    expected = feature_tables.fit(spec(), whole_table(rows()))
    for name in ("parquet", "csv", "tsv"):
        log = sharded_logs.ShardedLog.open(logs[name])
        assert log.format == name and log.num_rows == ROWS
        fitted = streaming_fit.fit_log(spec(), log, (0.0, 1.0))
        assert fitted.vocabularies == expected.vocabularies, name
        assert len(fitted.vocabularies["site"]) == 5
        for column, (center, deviation) in expected.scales.items():
            assert fitted.scales[column] == pytest.approx((center, deviation), rel=1e-12)


def test_a_tfrecord_log_of_examples_gives_the_parquet_logs_vocabularies(logs):
    parquet = streaming_fit.fit_log(spec(), sharded_logs.ShardedLog.open(logs["parquet"]), (0, 1))
    log = sharded_logs.ShardedLog.open(logs["tfrecord"])
    assert log.format == "tfrecord" and log.num_rows == ROWS
    assert set(log.columns) == set(SPEC_COLUMNS)
    fitted = streaming_fit.fit_log(spec(), log, (0, 1))
    assert fitted.vocabularies == parquet.vocabularies
    # The ages were written as float32: their mean moves in the 7th digit.
    assert fitted.scales["age"] == pytest.approx(parquet.scales["age"], rel=1e-6)
    assert fitted.scales["visits"] == parquet.scales["visits"]


SPEC_COLUMNS = ("clicked", "age", "visits", "city", "device", "site", "tags")


def test_the_pass_split_over_two_processes_and_shards_in_any_order_give_the_same_bits(
    logs, tmp_path, monkeypatch
):
    log = sharded_logs.ShardedLog.open(logs["parquet"])
    one = streaming_fit.fit_log(spec(), log, (0.2, 1.0))
    shares = [streaming_fit.fit_partials(spec(), log, (0.2, 1.0), part=(i, 2)) for i in (1, 0)]
    two = streaming_fit.fit_log(spec(), log, (0.2, 1.0), shares=shares)
    assert two.to_json() == one.to_json()
    # The same shards found by a glob, and listed from another folder in another order.
    by_glob = sharded_logs.ShardedLog.open(os.path.join(logs["parquet"], "part-*.parquet"))
    assert [s.name for s in by_glob.shards] == [s.name for s in log.shards]
    assert streaming_fit.fit_log(spec(), by_glob, (0.2, 1.0)).to_json() == one.to_json()
    with pytest.raises(ValueError, match="give each chunk of the log once"):
        streaming_fit.fit_log(spec(), log, (0.2, 1.0), shares=[shares[0], shares[0]])
    # Chunks of 2 blocks: the 9 blocks in 5 chunks, split 3 ways, merged in chunk order.
    monkeypatch.setattr(streaming_fit, "CHUNK_BLOCKS", 2)
    small = streaming_fit.fit_log(spec(), log, (0.2, 1.0))
    thirds = [streaming_fit.fit_partials(spec(), log, (0.2, 1.0), part=(i, 3)) for i in (2, 0, 1)]
    assert (
        streaming_fit.fit_log(spec(), log, (0.2, 1.0), shares=thirds).to_json() == small.to_json()
    )
    assert small.vocabularies == one.vocabularies


def test_the_vectorized_preparation_equals_the_row_by_row_one_bit_for_bit(logs):
    for name in ("parquet", "csv", "tfrecord"):
        log = sharded_logs.ShardedLog.open(logs[name])
        fitted = streaming_fit.fit_log(spec(), log, (0, 1))
        vectorized = arrow_features.Prepared(fitted)
        for block in range(len(log.blocks)):
            read = log.read(block)
            fast = vectorized.arrays(read.arrow)
            assert fast is not None, (name, block)
            slow = fitted.arrays(read.table(), part=True)
            assert fast[0].keys() == slow[0].keys()
            for column in slow[0]:
                np.testing.assert_array_equal(fast[0][column], slow[0][column], err_msg=column)
            np.testing.assert_array_equal(fast[1], slow[1])


def test_a_value_the_vectorized_path_cannot_read_is_refused_row_by_row_naming_its_line(tmp_path):
    columns = rows(200)
    columns["age"] = columns["age"].astype(str)
    columns["age"][137] = "forty"
    folder = write_text(columns, tmp_path / "bad", ",", ".csv", shards=2)
    log = sharded_logs.ShardedLog.open(folder)
    with pytest.raises(ValueError) as error:
        streaming_fit.fit_log(spec(), log, (0, 1))
    # Row 137 is the 38th row of the second shard: its line 39 below the header line.
    assert str(error.value) == (
        f"{folder}/part-1.csv line 39: numeric column 'age' holds 'forty', not a number; make "
        "it a categorical column, or correct the value."
    )


def test_a_split_is_a_function_of_each_rows_shard_name_and_row_number(logs):
    log = sharded_logs.ShardedLog.open(logs["parquet"])
    split = streaming_fit.Split(0.2, 0.1)
    counts = {
        part: sharded_logs.LogPart(log, *band).counts().sum()
        for part, band in split.bands().items()
    }
    assert sum(counts.values()) == ROWS
    assert abs(counts["test"] - 0.2 * ROWS) < 4 * np.sqrt(0.16 * ROWS), counts
    assert abs(counts["validation"] - 0.08 * ROWS) < 4 * np.sqrt(0.08 * ROWS), counts
    fractions = np.concatenate([sharded_logs.row_fractions(log, b) for b in range(len(log.blocks))])
    assert 0 <= fractions.min() and fractions.max() < 1
    # Every row's number is a function of its shard and row alone: the same with other blocks.
    other = sharded_logs.ShardedLog.open(logs["csv"], block_rows=333)
    again = np.concatenate([sharded_logs.row_fractions(other, b) for b in range(len(other.blocks))])
    renamed = [s.name.replace(".csv", ".parquet") for s in other.shards]
    assert renamed == [s.name for s in log.shards]
    assert not np.array_equal(again, fractions)  # the names differ, so do the draws
    same_names = sharded_logs.ShardedLog(
        "csv", other.root, [sharded_logs.Shard(s.path, r, 0, 0, 0) for s, r in
                            zip(other.shards, renamed)], other.blocks, other.columns
    )  # fmt: skip
    np.testing.assert_array_equal(
        np.concatenate(
            [sharded_logs.row_fractions(same_names, b) for b in range(len(other.blocks))]
        ),
        fractions,
    )


def stream(log, fitted, *, seed=5, window=3, batch=64, stats=None):
    rows_ = feature_streams.FeatureLog(log, fitted, streaming_fit.Split(0.2)).rows("train")
    return log_streams.shuffled_log_batches(
        rows_,
        global_batch_size=batch,
        seed=seed,
        signature=feature_streams.signature(fitted),
        window_blocks=window,
        stats=stats,
    )


def flat(batch):
    return [np.asarray(part) for part in tf.nest.flatten(batch)]


def test_a_stream_resumed_at_any_batch_reads_only_its_window_and_gives_the_same_batches(logs):
    log = sharded_logs.ShardedLog.open(logs["parquet"])
    fitted = streaming_fit.fit_log(spec(), log, (0.2, 1.0))
    train_rows = int(sharded_logs.LogPart(log, 0.2, 1.0).counts().sum())
    batches = stream(log, fitted)
    # 2.5 epochs of batches: epochs run into each other with no partial batch.
    count = int(2.5 * train_rows) // 64
    every = [flat(b) for b in batches.batches_from(0).take(count)]
    assert all(len(b[-1]) == 64 for b in every)
    labels = np.concatenate([b[-1] for b in every[: train_rows // 64]])
    for start in (1, 17, train_rows // 64, count - 3):
        log.opened.clear()
        stats = log_streams.StreamStats()
        resumed = stream(log, fitted, stats=stats).batches_from(start)
        first = flat(next(iter(resumed)))
        # The first batch was read from the blocks of one window (3 blocks), or two when it
        # crossed into the next; nothing before the position was read.
        assert stats.blocks_read <= 6, (start, stats)
        for got, want in zip(first, every[start]):
            np.testing.assert_array_equal(got, want)
        again = [flat(b) for b in resumed.take(3)]
        for got, want in zip(again, every[start : start + 3]):
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
    # An epoch is a permutation of the training rows: its labels are theirs, shuffled.
    truth = np.concatenate(
        [feature_streams.prepared(fitted)(sharded_logs.LogPart(log, 0.2, 1.0).read(b))[1]
         for b in range(len(log.blocks))]
    )  # fmt: skip
    assert labels.sum() == pytest.approx(truth[: len(labels)].sum(), abs=40)
    assert not np.array_equal(labels, truth[: len(labels)])


def test_a_stream_holds_one_window_and_one_batch_of_rows_at_most(tmp_path):
    columns = rows(200_000, seed=1)
    folder = write_parquet(columns, tmp_path / "big", shards=4, group=5000)
    log = sharded_logs.ShardedLog.open(folder)
    assert len(log.blocks) == 40
    fitted = streaming_fit.fit_log(spec(), log, (0.2, 1.0))
    stats = log_streams.StreamStats()
    taken = sum(
        len(b[-1]) for b in stream(log, fitted, window=4, batch=4096, stats=stats)
        .batches_from(0).take(60)
    )  # fmt: skip
    assert taken == 60 * 4096 > 200_000  # more than an epoch
    # A window of 4 blocks of 5,000 rows (4,000 of them training rows, about) and a batch.
    assert 0 < stats.most_rows_held <= 4 * 5000 + 4096, stats


def test_an_ordered_pass_reads_each_row_of_its_part_once_its_last_batch_partial(logs):
    log = sharded_logs.ShardedLog.open(logs["csv"])
    fitted = streaming_fit.fit_log(spec(), log, (0.2, 1.0))
    feature_log = feature_streams.FeatureLog(log, fitted, streaming_fit.Split(0.2))
    passed = list(feature_log.eval_batches("test", global_batch_size=100)())
    sizes = [len(labels) for _, labels in passed]
    assert sum(sizes) == feature_log.row_counts()["test"] and sizes[:-1] == [100] * (len(sizes) - 1)
    assert 0 < sizes[-1] <= 100


def test_a_changed_shard_changes_the_identity_and_is_named(logs, tmp_path):
    folder = shutil.copytree(logs["csv"], tmp_path / "copy")
    log = sharded_logs.ShardedLog.open(str(folder))
    before = log_identity.shards_record(log.root, log.identity())
    log.check_unchanged()
    with open(f"{folder}/part-2.csv", "a") as stream_:
        stream_.write(",".join(["1", "30", "2", "x", "d", "3", "t1"]) + "\n")
    after = sharded_logs.ShardedLog.open(str(folder))
    assert after.num_rows == ROWS + 1
    assert log_identity.shards_record(after.root, after.identity())["sha256"] != before["sha256"]
    with pytest.raises(ValueError, match=r"Shard .*part-2.csv of .* changed since the log was"):
        log.check_unchanged()
    os.remove(f"{folder}/part-1.csv")
    with pytest.raises(ValueError, match=r"Shard .*part-1.csv of .* is gone; restore it"):
        log.check_unchanged()


def test_an_empty_shard_adds_no_block_and_a_log_of_none_is_refused(logs, tmp_path):
    folder = shutil.copytree(logs["csv"], tmp_path / "with_empty")
    with open(f"{folder}/part-3.csv", "w") as stream_:
        stream_.write(",".join(SPEC_COLUMNS) + "\n")
    log = sharded_logs.ShardedLog.open(str(folder))
    assert len(log.shards) == 4 and log.num_rows == ROWS
    assert {block.shard for block in log.blocks} == {0, 1, 2}
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(f"{folder}/part-3.csv", empty / "only.csv")
    with pytest.raises(ValueError, match="holds 1 shards and no rows; a log needs rows"):
        sharded_logs.ShardedLog.open(str(empty))


def test_criteo_tsv_is_read_by_its_preset_and_bad_paths_and_formats_are_refused(tmp_path):
    rng = np.random.default_rng(3)
    lines = []
    for _ in range(50):
        numbers = [("" if rng.random() < 0.2 else str(rng.integers(0, 50))) for _ in range(13)]
        categories = [f"{rng.integers(0, 1 << 32):08x}" for _ in range(26)]
        lines.append("\t".join([str(rng.integers(0, 2)), *numbers, *categories]))
    path = tmp_path / "day_0.txt"
    path.write_text("\n".join(lines) + "\n")
    log = sharded_logs.ShardedLog.open(str(path), file_format="criteo")
    assert log.columns == sharded_logs.CRITEO_COLUMNS and log.num_rows == 50
    criteo = {
        "label": "label",
        "columns": [{"name": f"I{i}", "kind": "numeric", "fill": 0} for i in range(1, 14)]
        + [{"name": f"C{i}", "kind": "categorical"} for i in range(1, 27)],
    }
    fitted = streaming_fit.fit_log(feature_tables.FeatureSpec.from_json(criteo), log, (0, 1))
    assert fitted.vocabularies["C1"] == sorted(line.split("\t")[14] for line in lines)
    with pytest.raises(ValueError, match=r"are named \.txt: name the format"):
        sharded_logs.ShardedLog.open(str(path))
    with pytest.raises(ValueError, match="Unknown log format 'criteo_tsv'; give one of parquet"):
        sharded_logs.ShardedLog.open(str(path), file_format="criteo_tsv")
    with pytest.raises(ValueError, match="names no file: give a file, a directory of shards"):
        sharded_logs.ShardedLog.open(str(tmp_path / "nothing-*.parquet"))


def test_one_label_on_a_block_is_fine_and_one_label_in_the_whole_log_is_refused(tmp_path):
    columns = rows(1000)
    columns["clicked"] = np.zeros(1000, np.int64)
    columns["clicked"][:300] = 1  # the first shard's blocks hold positives alone
    folder = write_parquet(columns, tmp_path / "sorted", shards=2, group=250)
    fitted = streaming_fit.fit_log(spec(), sharded_logs.ShardedLog.open(folder), (0, 1))
    assert fitted.vocabularies["city"]
    columns["clicked"][:300] = 0
    folder = write_parquet(columns, tmp_path / "negatives", shards=2, group=250)
    with pytest.raises(ValueError, match=r"training rows \(1000\) hold one label alone"):
        streaming_fit.fit_log(spec(), sharded_logs.ShardedLog.open(folder), (0, 1))


def test_max_vocabulary_keeps_the_most_frequent_values_ties_by_value():
    column = feature_tables.Column("c", "categorical", {"max_vocabulary": 3, "min_count": 2})
    counts = {"b": 5, "a": 5, "c": 9, "d": 1, "e": 2}
    assert feature_tables.vocabulary_of(column, counts) == ["c", "a", "b"]
    with pytest.raises(ValueError, match="has max_vocabulary=0; give a whole number >= 1"):
        feature_tables.FeatureSpec.from_json(
            {"label": "y", "columns": [{"name": "c", "kind": "categorical", "max_vocabulary": 0}]}
        )
    assert json.loads(json.dumps(SPEC))  # the module's spec is plain JSON


def test_quantile_buckets_of_a_numeric_column_from_the_table_the_stream_and_the_export(logs):
    table = whole_table(rows())
    exact = feature_tables.fit(spec(), table)
    ages = np.sort(np.asarray(table.columns["age"], np.float64))
    # 8 buckets of equal counts (ages of 3 decimals: few ties); each boundary a bucket's
    # first value.
    assert exact.cardinalities()["age_bucket"] == 8
    columns, _ = exact.arrays(table)
    np.testing.assert_array_equal(
        columns["age_bucket"], np.searchsorted(exact.boundaries["age"], table.columns["age"],
                                               side="right"),
    )  # fmt: skip
    assert np.abs(np.bincount(columns["age_bucket"]) - ROWS / 8).max() <= 3
    assert set(exact.boundaries["age"]) <= set(ages)
    # Visits (log1p of Poisson counts, 0 on every 11th row as the fill): the heavy values are
    # buckets of their own, so the 4 buckets are uneven but all used.
    visits = np.bincount(columns["visits_bucket"])
    assert len(visits) == exact.cardinalities()["visits_bucket"] == 4 and visits.min() > 0
    # The stream's sketch: each boundary's rank within rows / SKETCH_POINTS of the exact one.
    log = sharded_logs.ShardedLog.open(logs["parquet"])
    streamed = streaming_fit.fit_log(spec(), log, (0, 1))
    ranks = np.searchsorted(ages, streamed.boundaries["age"])
    exact_ranks = np.searchsorted(ages, exact.boundaries["age"])
    assert len(ranks) == len(exact_ranks) == 7
    assert np.abs(ranks - exact_ranks).max() <= ROWS / streaming_fit.SKETCH_POINTS + 1
    # The export's graph gives the buckets the arrays give.
    from loops.model_dir.raw_features import RawFeatures

    prepared = RawFeatures(exact)(
        {
            "age": tf.constant(table.columns["age"], tf.float64),
            "visits": tf.constant([float(v or 0) for v in table.columns["visits"]], tf.float64),
            **{n: tf.constant([str(v) for v in table.columns[n]]) for n in
               ("city", "device", "site", "tags")},
        }
    )  # fmt: skip
    for name in ("age_bucket", "visits_bucket"):
        np.testing.assert_array_equal(prepared[name].numpy(), columns[name], err_msg=name)
    with pytest.raises(ValueError, match="has buckets=1; give a whole number >= 2"):
        feature_tables.FeatureSpec.from_json(
            {"label": "y", "columns": [{"name": "a", "kind": "numeric", "buckets": 1}]}
        )
