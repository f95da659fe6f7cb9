"""loops-ctr with dynamic columns: a spec's "dynamic" entry is checked up front naming the
value and the fix; the column's values hash to 64-bit ids that its loops.DynamicTable admits,
the same on 1 process and 2 replicas, results.json reporting each table's counters; the export
serves any raw value through the table's map and flags the ids it knows."""

import json

import numpy as np
import pytest
import tensorflow as tf

from conftest import read_results, run_module
from loops.input import feature_tables


def spec_with(**dynamic_options):
    return {
        "label": "clicked",
        "columns": [
            {"name": "age", "kind": "numeric"},
            {"name": "user", "kind": "categorical", **dynamic_options},
        ],
    }


@pytest.mark.parametrize(
    "options, named",
    [
        ({"dynamic": 100}, "dynamic=100; give an object of capacity, admit_after"),
        ({"dynamic": {"capacity": 0}}, "dynamic capacity of 0"),
        ({"dynamic": {"admit_after": 2}}, "dynamic capacity of None"),
        ({"dynamic": {"capacity": 8, "evict": "lru"}}, "give an object of capacity"),
        ({"dynamic": {"capacity": 8, "admit_after": 0}}, "admit_after=0"),
        ({"dynamic": {"capacity": 8, "decay": 2}}, "decay=2"),
        (
            {"dynamic": {"capacity": 8}, "hash_buckets": 100},
            "is dynamic .* and has hash_buckets: remove it",
        ),
    ],
)
def test_a_bad_dynamic_entry_is_refused_naming_the_column_and_the_fix(options, named):
    with pytest.raises(ValueError, match=f"Column 'user'.*{named}"):
        feature_tables.FeatureSpec.from_json(spec_with(**options))


def test_a_dynamic_column_hashes_its_values_to_64_bit_ids_and_keeps_no_vocabulary():
    spec = feature_tables.FeatureSpec.from_json(spec_with(dynamic={"capacity": 8}))
    table = feature_tables.Table(
        "t.csv",
        {"age": ["1", "2", "3"], "user": ["a", "b", "a"], "clicked": ["1", "0", "0"]},
        "line",
        2,
    )
    fitted = feature_tables.fit(spec, table)
    assert fitted.vocabularies == {} and fitted.dynamic_columns() == {"user": {"capacity": 8}}
    columns, _ = fitted.arrays(table)
    want = tf.strings.to_hash_bucket_fast(["a", "b", "a"], 2**63 - 1).numpy()
    np.testing.assert_array_equal(columns["user"], want)
    arrays = feature_tables.model_arrays(fitted, columns)
    assert arrays["user"].dtype == np.int64 and arrays["user"].max() > 2**31
    again = feature_tables.FittedFeatures.from_json(fitted.to_json())
    assert again.dynamic_columns() == fitted.dynamic_columns()


def click_table(path, rows=600, users=20, seed=0):
    """A table whose clicks follow each user and tag: every user in every split."""
    rng = np.random.default_rng(seed)
    user = rng.integers(0, users, rows)
    tag = rng.integers(0, 12, rows)
    clicked = rng.random(rows) < 1 / (1 + np.exp(-(np.sin(user) * 2 + np.cos(tag))))
    lines = ["age,user,tags,clicked"]
    for i in range(rows):
        lines.append(f"{20 + i % 40},u{user[i]},t{tag[i]}|t{(tag[i] * 5) % 12},{int(clicked[i])}")
    path.write_text("\n".join(lines) + "\n")


def test_loops_ctr_admits_dynamic_ids_alike_on_1_and_2_replicas_and_the_export_flags_them(
    tmp_path,
):
    click_table(tmp_path / "clicks.csv")
    spec = {
        "label": "clicked",
        "columns": [
            {"name": "age", "kind": "numeric"},
            # Room for every user: each admitted at first sight, none evicted.
            {"name": "user", "kind": "categorical", "dynamic": {"capacity": 32}},
            # 12 tags in 8 rows, admitted at a second sighting: evictions.
            {"name": "tags", "kind": "multi_hot", "dynamic": {"capacity": 8, "admit_after": 2}},
        ],
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    common = [
        f"--data={tmp_path / 'clicks.csv'}",
        f"--spec={tmp_path / 'spec.json'}",
        "--train_steps=20",
        "--global_batch_size=32",
        "--table_optimizer=adagrad",
    ]
    runs = {}
    for name, layout in (("one", ["--strategy=default"]), ("two", ["--num_replicas=2"])):
        run_module("loops.bin.ctr", *common, *layout, f"--model_dir={tmp_path / name}")
        runs[name] = read_results(str(tmp_path / name))
    tables = {name: {table["name"]: table for table in got["tables"]} for name, got in runs.items()}
    users, tags = tables["one"]["user_embedding"], tables["one"]["tags_embedding_table"]
    assert users["dynamic"]["resident"] == 20 and users["dynamic"]["admissions"] == 20
    assert users["dynamic"]["evictions"] == 0 and users["dynamic"]["step"] == 20
    assert tags["dynamic"]["resident"] == 8 and tags["dynamic"]["evictions"] > 0
    for name, table in tables["one"].items():
        assert tables["two"][name]["dynamic"] == table["dynamic"]
        assert (table["split"], tables["two"][name]["split"]) == ("whole", "replicas")
    for key, value in runs["one"]["test"].items():
        assert runs["two"]["test"][key] == pytest.approx(value, rel=1e-6), key

    served = tf.saved_model.load(str(tmp_path / "one" / "export")).signatures["serving_default"]
    answers = served(
        age=tf.constant([30.0, 30.0, 30.0], tf.float64),
        user=tf.constant(["u3", "nobody", "someone else"]),
        tags=tf.constant(["t1|t5", "never|t1", ""]),
    )
    assert answers["user_known"].numpy().tolist() == [True, False, False]
    known_tags = answers["tags_known"].numpy()
    assert known_tags[1, 0] == np.False_ and not known_tags[2].any()
    assert answers["valid_row"].numpy().all()
    probabilities = answers["probabilities"].numpy()
    # Two unknown users read the same zeros: the same answer for the same other columns.
    again = served(
        age=tf.constant([30.0, 30.0], tf.float64),
        user=tf.constant(["nobody", "someone else"]),
        tags=tf.constant(["", ""]),
    )["probabilities"].numpy()
    assert again[0] == again[1] and probabilities[0] != probabilities[1]


def test_loops_ctr_with_dynamic_columns_killed_mid_run_resumes_the_same_map_on_any_layout(
    tmp_path,
):
    import signal

    from test_streamed_ctr import SPEC, ctr_run, final_weights, write_shards

    shards = write_shards(tmp_path / "log")

    spec = json.loads(json.dumps(SPEC))
    for column in spec["columns"]:  # 12 values each: C1 admits at a second sighting, C2 ages
        if column["name"] == "C1":
            column.update(dynamic={"capacity": 6, "admit_after": 2, "decay": 0.9})
        if column["name"] == "C2":
            column.pop("min_count")
            column.update(dynamic={"capacity": 5, "ttl": 3})
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    spec_file, optimizer = tmp_path / "spec.json", "--table_optimizer=adagrad"
    whole = ctr_run(tmp_path / "whole", shards, spec_file, optimizer)
    assert whole.returncode == 0, whole.stderr[-3000:]
    # Killed as its first call after the checkpoint of step 15 starts, resumed on another
    # layout; a resume on the same layout is tests/test_dynamic_tables.py's, in one process.
    killed = ctr_run(tmp_path / "moved", shards, spec_file, optimizer, kill_after=15)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    moved = ctr_run(tmp_path / "moved", shards, spec_file, optimizer, "--num_replicas=2")
    assert moved.returncode == 0, moved.stderr[-3000:]
    expected = final_weights(tmp_path / "whole")
    maps = [name for name in expected if "map_" in name]
    assert len(maps) >= 2 * 11, sorted(expected)  # wide and deep tables of both columns
    for name, array in final_weights(tmp_path / "moved").items():
        if name in maps:
            np.testing.assert_array_equal(array, expected[name], err_msg=name)
        else:
            np.testing.assert_allclose(array, expected[name], rtol=1e-5, atol=1e-7, err_msg=name)
    tables = {
        t["name"]: t["dynamic"]
        for t in read_results(str(tmp_path / "whole"))["tables"]
        if "dynamic" in t
    }
    assert tables["C1_embedding"]["evictions"] > 0 and tables["C2_embedding"]["evictions"] > 0
    assert tables["C2_embedding"]["refusals"] > 0  # every row seen in a step: ids wait
    moved_tables = read_results(str(tmp_path / "moved"))["tables"]
    assert {t["name"]: t["dynamic"] for t in moved_tables if "dynamic" in t} == tables
    assert len(tables) == 4  # the wide and the deep table of each
