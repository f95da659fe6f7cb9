"""loops-ctr and benchmarks.adult: the binary trains on a generated log, keeps the checkpoint of
the best validation AUC and exports a model whose probabilities are the live model's; a table
it cannot read is refused before TensorFlow, naming the value; a resume on another model,
table, spec, generated log or split is refused naming each change, the run's files untouched;
the split is the seed's
permutation and the vocabularies come from the training rows alone; the test figures equal
scikit-learn's; the Adult benchmark writes its JSON on a stand-in of the wheel."""

import dataclasses
import json
import os
import zipfile

import numpy as np
import pytest
import tensorflow as tf
from sklearn.metrics import log_loss, roc_auc_score

from conftest import ROOT, read_results, run_module, snapshot
from loops.input import log_identity
from loops.model_dir import run_config
from loops_data import ctr_tables
from loops_models import ctr

TABLE = "age,city,tags,clicked\n31,Oslo,a|b,1\n45,Rome,,0\n28,Oslo,b,0\n52,Lima,c|a,1\n"
SPEC = {
    "label": "clicked",
    "columns": [
        {"name": "age", "kind": "numeric"},
        {"name": "city", "kind": "categorical"},
        {"name": "tags", "kind": "multi_hot"},
    ],
}


@pytest.fixture
def table_files(tmp_path):
    table, spec = tmp_path / "table.csv", tmp_path / "spec.json"
    table.write_text(TABLE)
    spec.write_text(json.dumps(SPEC))
    return str(table), str(spec)


def test_a_table_the_binary_cannot_read_is_refused_naming_the_value_and_the_fix(
    table_files, tmp_path
):
    table, spec = table_files
    missing = str(tmp_path / "missing.csv")
    wrong_column = tmp_path / "wrong.json"
    wrong_column.write_text(json.dumps({**SPEC, "columns": [{"name": "agee", "kind": "numeric"}]}))
    bad_field = tmp_path / "bad.csv"
    bad_field.write_text(TABLE.replace("45,Rome", "old,Rome"))
    cases = [
        (missing, spec, f"--data={missing} is not a file; name a CSV or Parquet file that exists."),
        (
            table,
            missing,
            f"--spec={missing} is not a file; name a JSON file that exists (the feature spec: "
            "docs/ctr.md).",
        ),
        (
            table,
            str(wrong_column),
            f"The feature spec names column 'agee', which {table} does not have (its columns: "
            f"age, city, tags, clicked); did you mean 'age'? (--spec={wrong_column})",
        ),
        (
            str(bad_field),
            spec,
            f"{bad_field} line 3: numeric column 'age' holds 'old', not a number; make it a "
            f"categorical column, or correct the value. (--spec={spec})",
        ),
    ]
    for data, spec_path, sentence in cases:
        with pytest.raises(ValueError) as raised:
            ctr_tables.checked_table(data, spec_path)
        assert str(raised.value) == sentence


def test_the_split_is_the_seeds_permutation_and_fits_the_vocabularies_to_training_rows(
    table_files,
):
    order = np.random.default_rng(3).permutation(10)
    train, validation, test = ctr_tables.split_indices(
        10, test_fraction=0.2, validation_fraction=0.25, seed=3
    )
    assert train.tolist() == order[:6].tolist() and validation.tolist() == order[6:8].tolist()
    assert test.tolist() == order[8:].tolist()
    with pytest.raises(ValueError) as raised:
        ctr_tables.split_indices(2, test_fraction=0.2, validation_fraction=0.4, seed=0)
    assert str(raised.value) == (
        "2 rows split by --test_fraction=0.2 and --validation_fraction=0.4 leave no validation "
        "rows; give more rows or fractions that leave each part a row."
    )
    table, spec = table_files
    parsed, rows = ctr_tables.checked_table(table, spec)
    # Seed 0 permutes the 4 rows to 2, 0, 1, 3: rows 2, 0, 1 train (Oslo, Oslo, Rome), row 3
    # (Lima, tags c|a) tests; Lima and c are unseen in training: row 0.
    split = ctr_tables.from_table(parsed, rows, seed=0, test_fraction=0.25, validation_fraction=0)
    assert split.fitted.vocabularies == {"city": ["Oslo", "Rome"], "tags": ["b", "a"]}
    assert split.train.columns["city"].tolist() == [1, 1, 2]
    assert split.test.columns["city"].tolist() == [0] and split.test.labels.tolist() == [1.0]
    assert split.test.columns["tags"].tolist() == [[0, 2]]
    assert split.test.columns["city"].dtype == np.int32 and split.validation is None
    assert split.features == {
        "numeric": ["age"],
        "categorical": {"city": 3},
        "multi_hot": {"tags": (3, "mean")},
    }
    assert split.notes()["test_rows"] == 1 and split.notes()["train_rows"] == 3


def refusal(model_dir, was, now):
    """check_resume's sentence against a checkpoint recording `was`; None when it goes on."""
    try:
        run_config.check_resume(
            model_dir,
            {run_config.RESUME_IDENTITY: now},
            checkpoint_record={run_config.RESUME_IDENTITY: was},
        )
    except ValueError as error:
        return str(error)
    return None


def test_another_table_spec_split_model_or_generated_log_is_refused_naming_each_change(
    table_files, tmp_path
):
    table, spec = table_files

    def identity(model="wide_deep", files=None, generated=None, seed=0, test_fraction=0.2):
        return log_identity.table_identity(
            model,
            files={"data": table, "spec": spec} if files is None else files,
            generated=generated or {},
            test_fraction=test_fraction,
            validation_fraction=0.1,
            seed=seed,
        )

    def content(path):
        return f"{os.path.getsize(path)} bytes, sha256 {log_identity.file_sha256(path)[:12]}"

    model_dir = str(tmp_path)
    start = f"The checkpoints in {model_dir} were trained on another model, data or split: "
    fix = (
        ". Going on would restore weights built for other columns or train and test on other "
        "rows. Pass the run's own --model, --data, --spec (the same files, unchanged), "
        "--test_fraction, --validation_fraction and --seed, or a new --model_dir to train on "
        "this data."
    )
    was, spec_was = identity(), content(spec)
    # The same content elsewhere goes on; a spec edited in place, another table, another
    # split or model is refused, each change named.
    moved = tmp_path / "moved.csv"
    moved.write_text(TABLE)
    assert refusal(model_dir, was, identity(files={"data": str(moved), "spec": spec})) is None
    with open(spec, "w") as stream:
        json.dump({**SPEC, "columns": SPEC["columns"][:2]}, stream)
    other = tmp_path / "other.csv"
    other.write_text(TABLE.replace("Oslo", "Bergen"))
    now = identity("dcn_v2", files={"data": str(other), "spec": spec}, seed=4, test_fraction=0.3)
    assert refusal(model_dir, was, now) == (
        f"{start}--model=dcn_v2 here and --model=wide_deep in the run (its checkpoint holds the "
        f"other kind's embeddings and optimizer slots); --data={other} ({content(other)}) here "
        f"and --data={table} ({content(table)}) in the run; --spec={spec} changed since the run "
        f"read it ({content(spec)} here and {spec_was} in the run); --test_fraction=0.3 here "
        "and --test_fraction=0.2 in the run; --seed=4 here and --seed=0 in the run" + fix
    )
    # A generated log: its settings, and a table in its place.
    generated = identity(files={}, generated={"generated_rows": 4000})
    assert refusal(
        model_dir, generated, identity(files={}, generated={"generated_rows": 3000})
    ) == (
        f"{start}--generated_rows=3000 here and --generated_rows=4000 in the run. Going on "
        "would restore weights built for other columns or train and test on other rows. Pass "
        "the run's own --model, --generated_rows, --test_fraction, --validation_fraction and "
        "--seed, or a new --model_dir to train on this data."
    )
    assert refusal(model_dir, generated, identity()) == (
        f"{start}--data={table} ({content(table)}) and --spec={spec} ({content(spec)}) here "
        "and the generated log (--generated_rows=4000) in the run" + fix
    )


RAW_TABLE = (
    "age,income,city,zip,tags,clicked\n31,1200,Oslo,0150,a|b,1\n45,80,Rome,00184,,0\n"
    "28,3400,Oslo,0150,b,0\n52,0,Lima,15001,c|a,1\n39,560,Rome,00184,a,0\n"
)
RAW_SPEC = {
    "label": "clicked",
    "columns": [
        {"name": "age", "kind": "numeric"},
        {"name": "income", "kind": "numeric", "normalize": "log"},
        {"name": "city", "kind": "categorical", "min_count": 2},
        {"name": "zip", "kind": "categorical", "hash_buckets": 7},
        {"name": "tags", "kind": "multi_hot", "pooling": "sum"},
    ],
}


def test_the_export_of_a_table_serves_raw_rows_as_the_live_model_scores_them(tmp_path):
    from loops.input import feature_tables
    from loops.model_dir.ctr_export import export_ctr

    (tmp_path / "train.csv").write_text(RAW_TABLE)
    spec = feature_tables.FeatureSpec.from_json(RAW_SPEC)
    split = ctr_tables.from_table(
        spec,
        feature_tables.read_table(str(tmp_path / "train.csv")),
        seed=0,
        test_fraction=0.2,
        validation_fraction=0,
    )
    model = ctr.build_model("dcn_v2", ctr.CTRFeatures(**split.features), seed=0)
    export_ctr(model, str(tmp_path / "export"), fitted=split.fitted)
    # Rows the training rows never held: Paris and Lima (seen once, under min_count=2), zip
    # 99999, tags z and an empty bag, an income of 0.
    serving = (
        "age,income,city,zip,tags,clicked\n33,0,Paris,99999,z|a,0\n61,90,Lima,0150,,1\n"
        "47,2500,Oslo,00184,b|z|b,0\n"
    )
    (tmp_path / "serve.csv").write_text(serving)
    columns, _ = split.fitted.arrays(feature_tables.read_table(str(tmp_path / "serve.csv")))
    assert columns["city"].tolist() == [0, 0, 1] and columns["tags"][0].tolist()[0] == 0
    # The model's own input types (`ctr_tables.from_table`): int32 ids, float32 numbers.
    prepared = {
        name: array.astype(np.int32) if array.dtype.kind == "i" else array
        for name, array in columns.items()
    }
    live = tf.sigmoid(tf.reshape(model(prepared), [-1])).numpy()
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    raw = {
        "age": tf.constant([33.0, 61.0, 47.0], tf.float64),
        "income": tf.constant([0.0, 90.0, 2500.0], tf.float64),
        "city": tf.constant(["Paris", "Lima", "Oslo"]),
        "zip": tf.constant(["99999", "0150", "00184"]),
        "tags": tf.constant(["z|a", "", "b|z|b"]),
    }
    served = loaded.signatures["serving_default"](**raw)["probabilities"].numpy()
    np.testing.assert_allclose(served, live, atol=1e-6)
    by_prepared = loaded.signatures["serve_prepared"](**prepared)["probabilities"].numpy()
    np.testing.assert_allclose(by_prepared, live, atol=1e-6)
    assert len(set(np.round(live, 6))) == 3  # three rows the model tells apart


CROSS_TABLE = (
    "age,city,zip,day,clicked\n31,Oslo,0150,Mon,1\n45,Rome,00184,Tue,0\n28,Oslo,0150,Tue,0\n"
    "52,Lima,15001,Mon,1\n39,Rome,00184,Mon,0\n33,Oslo,0150,Mon,1\n41,Rome,00184,Tue,1\n"
)
CROSS_SPEC = {
    "label": "clicked",
    "columns": [
        {"name": "age", "kind": "numeric"},
        {"name": "city", "kind": "categorical"},
        {"name": "zip", "kind": "categorical", "hash_buckets": 7},
        # A pair of the spec's columns by vocabulary; the day (not itself a feature) hashed.
        {"name": "city_x_zip", "kind": "categorical", "cross": ["city", "zip"], "min_count": 2},
        {
            "name": "city_x_day",
            "kind": "categorical",
            "cross": ["city", "day"],
            "hash_buckets": 5,
            "separator": "#",
        },
    ],
}


def test_the_export_joins_crossed_columns_from_the_raw_columns_as_the_live_model_reads_them(
    tmp_path,
):
    from loops.input import feature_tables
    from loops.model_dir.ctr_export import export_ctr

    (tmp_path / "train.csv").write_text(CROSS_TABLE)
    split = ctr_tables.from_table(
        feature_tables.FeatureSpec.from_json(CROSS_SPEC),
        feature_tables.read_table(str(tmp_path / "train.csv")),
        seed=0,
        test_fraction=0.2,
        validation_fraction=0,
    )
    # Seed 0 trains on rows 2, 4, 3, 6, 5 (from 0) of the 7: Oslo|0150 and Rome|00184 twice
    # each, Lima|15001 once.
    assert split.fitted.vocabularies["city_x_zip"] == ["Oslo|0150", "Rome|00184"]
    model = ctr.build_model("dcn_v2", ctr.CTRFeatures(**split.features), seed=0)
    export_ctr(model, str(tmp_path / "export"), fitted=split.fitted)
    # A kept pair; known values in a pair training never held (Oslo|00184); an unknown city
    # (Paris) and zip; Lima|15001, seen once (under min_count 2).
    serving = (
        "age,city,zip,day,clicked\n33,Oslo,0150,Tue,0\n61,Oslo,00184,Mon,1\n"
        "47,Paris,99999,Sun,0\n29,Lima,15001,Mon,1\n"
    )
    (tmp_path / "serve.csv").write_text(serving)
    columns, _ = split.fitted.arrays(feature_tables.read_table(str(tmp_path / "serve.csv")))
    assert columns["city_x_zip"].tolist() == [1, 0, 0, 0]
    day_texts = ["Oslo#Tue", "Oslo#Mon", "Paris#Sun", "Lima#Mon"]
    hashed = tf.strings.to_hash_bucket_fast(day_texts, 5).numpy().tolist()
    assert columns["city_x_day"].tolist() == hashed
    prepared = {
        name: array.astype(np.int32) if array.dtype.kind == "i" else array
        for name, array in columns.items()
    }
    live = tf.sigmoid(tf.reshape(model(prepared), [-1])).numpy()
    loaded = tf.saved_model.load(str(tmp_path / "export"))
    serve = loaded.signatures["serving_default"]
    # The raw columns, the day among them; no crossed column.
    assert sorted(serve.structured_input_signature[1]) == ["age", "city", "day", "zip"]
    raw = {
        "age": tf.constant([33.0, 61.0, 47.0, 29.0], tf.float64),
        "city": tf.constant(["Oslo", "Oslo", "Paris", "Lima"]),
        "zip": tf.constant(["0150", "00184", "99999", "15001"]),
        "day": tf.constant(["Tue", "Mon", "Sun", "Mon"]),
    }
    served = serve(**raw)["probabilities"].numpy()
    np.testing.assert_allclose(served, live, atol=1e-6)
    assert len(set(np.round(live, 6))) == 4  # four rows the model tells apart
    by_prepared = loaded.signatures["serve_prepared"](**prepared)["probabilities"].numpy()
    np.testing.assert_allclose(by_prepared, live, atol=1e-6)
    # A served zip holding the separator ("0150|x", which a table may not hold) joins to a
    # text of two separators, which no kept pair has: the out-of-vocabulary row.
    odd = dict(raw, zip=tf.constant(["0150|x", "00184", "99999", "15001"]))
    odd_columns = dict(prepared, zip=tf.strings.to_hash_bucket_fast(odd["zip"], 7).numpy())
    odd_columns["zip"] = odd_columns["zip"].astype(np.int32)
    odd_columns["city_x_zip"] = np.array([0, 0, 0, 0], np.int32)
    expected = tf.sigmoid(tf.reshape(model(odd_columns), [-1])).numpy()
    np.testing.assert_allclose(serve(**odd)["probabilities"].numpy(), expected, atol=1e-6)
    assert abs(expected[0] - live[0]) > 1e-6  # the first row now reads other rows


def adult_stand_in(adult, rows, *, seed, categories):
    """Columns of a generated stand-in for the Adult table: numbers 0-59, each category
    "v" + `categories(generator, rows)`'s draws, about 30% of the rows >50K."""
    generator = np.random.default_rng(seed)
    columns = {
        name: generator.integers(0, 60, rows).tolist()
        for name in (*adult.NUMERIC, *adult.LOG_NUMERIC)
    }
    columns.update(
        {name: [f"v{v}" for v in categories(generator, rows)] for name in adult.CATEGORICAL}
    )
    columns["income"] = [">50K" if v else "<=50K" for v in generator.random(rows) < 0.3]
    return columns


def test_the_adult_benchmarks_spec_crosses_give_the_ids_of_its_joined_columns(monkeypatch):
    # The `pytest` script does not put the repository on the path (`python -m pytest` does).
    monkeypatch.syspath_prepend(ROOT)
    from benchmarks import adult
    from loops.input import feature_tables

    # Skewed values, so that some pairs fall under min_count 3 and ties are broken by text.
    columns = adult_stand_in(adult, 400, seed=1, categories=lambda g, n: g.geometric(0.35, n))
    table = adult.with_engineered_columns(feature_tables.Table("stand-in", columns, "row", 0))
    # The benchmark before crossed columns: each pair joined here as f"{a}|{b}", a
    # categorical column of the table with min_count 3.
    joined = dict(table.columns)
    entries = [column for column in adult.spec().columns if not column.crosses()]
    for first, second in adult.CROSSES:
        name = f"{first}_x_{second}"
        joined[name] = [f"{a}|{b}" for a, b in zip(columns[first], columns[second])]
        entries.append(feature_tables.Column(name, "categorical", {"min_count": 3}))
    before_spec = feature_tables.FeatureSpec(adult.LABEL, tuple(entries), adult.POSITIVE)
    split = dict(seed=0, test_fraction=0.2, validation_fraction=0.1)
    before = ctr_tables.from_table(before_spec, dataclasses.replace(table, columns=joined), **split)
    after = ctr_tables.from_table(adult.spec(), table, **split)
    assert after.fitted.vocabularies == before.fitted.vocabularies
    crosses = [f"{first}_x_{second}" for first, second in adult.CROSSES]
    for name in crosses:  # the same contents in the same order, some pairs left out
        assert 3 < len(after.fitted.vocabularies[name]) < len(set(joined[name]))
    assert after.features == before.features
    for part in ("train", "validation", "test"):
        now, was = getattr(after, part).columns, getattr(before, part).columns
        assert list(now) == list(was)
        for name in now:
            np.testing.assert_array_equal(now[name], was[name], err_msg=f"{part} {name}")
        assert sum(int(np.sum(now[name] == 0)) for name in crosses) > 0  # rows out of vocabulary


def test_the_test_figures_equal_scikit_learns():
    generator = np.random.default_rng(0)
    labels = (generator.random(300) < 0.3).astype(np.float32)
    logits = generator.normal(size=300) + 2 * labels
    rows = ctr_tables.Rows({"x": logits.astype(np.float32)}, labels, truth_logits=logits)
    figures = ctr_tables.figures(lambda columns: columns["x"], rows)
    probabilities = 1 / (1 + np.exp(-logits.astype(np.float32).astype(np.float64)))
    assert figures["auc"] == pytest.approx(roc_auc_score(labels, probabilities), abs=1e-9)
    assert figures["log_loss"] == pytest.approx(log_loss(labels, probabilities), abs=1e-9)
    assert figures["calibration"] == pytest.approx(probabilities.mean() / labels.mean())
    assert figures["planted_auc"] == pytest.approx(roc_auc_score(labels, logits), abs=1e-9)
    assert figures["examples"] == 300


def test_the_binary_keeps_the_best_auc_and_exports_the_live_models_probabilities(
    tmp_path, table_files
):
    table, spec = table_files
    refused = run_module("loops.bin.ctr", f"--data={table}", f"--model_dir={tmp_path / 'no'}")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert (
        f"--data={table} is given without --spec: a feature table is read by its spec, so pass "
        "both (docs/ctr.md), or neither to train on the generated click log." in refused.stderr
    )
    assert not os.path.exists(tmp_path / "no")
    model_dir = tmp_path / "run"
    # 150 steps (13 epochs): by 300 the dense layers overfit the 2,880 rows, and how far
    # depended on the CPU's kernels (test AUC 0.754 on an AVX2 machine, 0.729 on an
    # AVX-512 one, log loss 0.96); at 150 the AVX-512 one gives 0.7535 (oneDNN on and off).
    flags = ["--generated_rows=4000", "--train_steps=150", "--eval_every=50", "--model=dlrm"]
    # The tables by row-wise Adagrad of their own, the dense layers by Adam.
    flags += ["--table_optimizer=rowwise_adagrad", "--table_learning_rate=0.1"]
    done = run_module("loops.bin.ctr", f"--model_dir={model_dir}", *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(model_dir)
    assert results["config"]["table_optimizer"] == "rowwise_adagrad"
    assert results["config"]["table_learning_rate"] == 0.1
    saved = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir / "checkpoints")))
    slots = {
        tuple(shape)
        for name, shape in saved.get_variable_to_shape_map().items()
        if name.startswith("table_optimizer/_variables/")
    }
    # One accumulator a row of each table: 8 columns of 100 values, 2 bags of 50 ids.
    assert slots == {(100, 1), (50, 1)}, slots
    data = results["data"]
    assert (data["train_rows"], data["validation_rows"], data["test_rows"]) == (2880, 320, 800)
    assert results["config"]["keep_best_metric"] == "auc" and results["best_step"] in (
        50,
        100,
        150,
    )
    test = results["test"]
    assert test["planted_auc"] == pytest.approx(data["planted_test_auc"])
    # 2,880 training rows of 8 columns of 100 values: 0.7535 measured, the truth's 0.835.
    assert test["auc"] > 0.72 and test["auc"] > test["planted_auc"] - 0.1, test
    assert 0.8 < test["calibration"] < 1.25 and test["log_loss"] < 0.62, test
    # The live model (the best checkpoint's weights) and the export, on the test rows.
    split = ctr_tables.generated(4000, seed=0, test_fraction=0.2, validation_fraction=0.1)
    model = ctr.build_model("dlrm", ctr.CTRFeatures(**split.features), seed=0)
    with open(model_dir / "best" / "best.json") as stream:
        best = json.load(stream)
    tf.train.Checkpoint(model=model).restore(best["checkpoint"]).expect_partial()
    columns = {name: tf.constant(array) for name, array in split.test.columns.items()}
    live = tf.sigmoid(tf.reshape(model(columns), [-1])).numpy()
    served = tf.saved_model.load(str(model_dir / "export")).signatures["serving_default"]
    exported = served(**columns)
    np.testing.assert_allclose(exported["probabilities"].numpy(), live, atol=1e-6)
    # By logits, as the binary ranks them (probabilities near 0 or 1 round to ties).
    logits = exported["logits"].numpy()
    assert roc_auc_score(split.test.labels, logits) == pytest.approx(test["auc"], abs=1e-6)
    # Another generated log and model in the same --model_dir: refused before TensorFlow,
    # each change named, the run's files untouched.
    files_before = snapshot(model_dir)
    other = [f for f in flags if not f.startswith(("--generated_rows", "--model"))]
    again = run_module(
        "loops.bin.ctr",
        f"--model_dir={model_dir}",
        "--generated_rows=3000",
        "--model=dcn_v2",
        *other,
    )
    assert again.returncode == 1 and "Traceback" not in again.stderr, again.stderr[-3000:]
    assert (
        f"The checkpoints in {model_dir} were trained on another model, data or split: "
        "--model=dcn_v2 here and --model=dlrm in the run (its checkpoint holds the other "
        "kind's embeddings and optimizer slots); --generated_rows=3000 here and "
        "--generated_rows=4000 in the run. Going on would restore weights built for other "
        "columns or train and test on other rows. Pass the run's own --model, "
        "--generated_rows, --test_fraction, --validation_fraction and --seed, or a new "
        "--model_dir to train on this data." in again.stderr
    )
    assert snapshot(model_dir) == files_before


def test_the_adult_benchmark_writes_its_json_on_a_stand_in_of_the_wheel(tmp_path, monkeypatch):
    import pyarrow
    import pyarrow.parquet

    # The `pytest` script does not put the repository on the path (`python -m pytest` does).
    monkeypatch.syspath_prepend(ROOT)
    from benchmarks import adult

    columns = adult_stand_in(adult, 200, seed=0, categories=lambda g, n: g.integers(0, 4, n))
    stand_in = tmp_path / "adult.parquet"
    pyarrow.parquet.write_table(pyarrow.table(columns), stand_in)
    cache = tmp_path / "cache"
    cache.mkdir()
    with zipfile.ZipFile(cache / adult.WHEEL, "w") as wheel:
        wheel.write(stand_in, adult.MEMBER)
    output = tmp_path / "adult.json"
    done = run_module(
        "benchmarks.adult",
        f"--cache_dir={cache}",
        "--steps=4",
        "--eval_every=2",
        f"--output={output}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    numbers = json.loads(output.read_text())
    assert numbers["loops"]["test_rows"] == 40  # the last 20% of 200 rows
    assert set(numbers["loops"]) == {
        "auc",
        "log_loss",
        "accuracy",
        "calibration",
        "model",
        "test_rows",
    }
    assert [c["candidate"] for c in numbers["candidates"]] == [c.name() for c in adult.CANDIDATES]
    assert all(c["best_step"] in (2, 4) for c in numbers["candidates"])
    assert sorted(numbers["peers"]) == [
        "HistGradientBoosting (native categorical)",
        "logistic regression (one-hot + standardized)",
    ]
    assert "| logistic regression (one-hot + standardized) |" in done.stdout
