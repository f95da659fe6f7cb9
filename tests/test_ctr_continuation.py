"""A click model that goes on from yesterday's run (`loops-ctr --continue_from`): its
vocabularies grow by the new day's values behind the old ones and its scales stay; each old
value keeps its table rows and its Adam slots bit for bit, each new one starts as built; a
warm start from another model remaps by value; what cannot continue is refused before
TensorFlow, naming it; the binary's lineage, its next day on a log of shards, and its delta
export that patches yesterday's export into today's bit for bit."""

import json
import os

import numpy as np
import pytest

from loops.input import feature_growth, feature_tables

SPEC = {
    "label": "clicked",
    "columns": [
        {"name": "age", "kind": "numeric", "buckets": 3},
        {"name": "city", "kind": "categorical"},
        {"name": "tags", "kind": "multi_hot"},
    ],
}
DAY_CITIES = {1: ["Oslo", "Rome", "Lima", "Pune"], 2: ["Oslo", "Rome", "Kyiv", "Baku"]}


def write_day(path, day, rows=240):
    """A day of clicks as CSV: day 2 keeps two of day 1's cities and brings two new ones;
    its ages run older (a scale refitted would move)."""
    rng = np.random.default_rng(day)
    cities = DAY_CITIES[day]
    lines = ["age,city,tags,clicked"]
    for _ in range(rows):
        city = cities[rng.integers(len(cities))]
        tags = "|".join(sorted(set(rng.choice(list("abcde"), rng.integers(0, 3)))))
        age = rng.integers(18, 60) + 10 * (day - 1)
        clicked = int(rng.random() < 0.25 + 0.5 * (city in ("Oslo", "Kyiv")))
        lines.append(f"{age},{city},{tags},{clicked}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.fixture
def days(tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    return str(spec), {day: write_day(tmp_path / f"day{day}.csv", day) for day in (1, 2)}


def trainer_of(training, model_dir=None, **settings):
    """`training`'s Trainer, in `model_dir` (its checkpoints, features.json) or nowhere."""
    if model_dir is not None:
        settings["model_dir"] = model_dir
    return training.trainer(settings, model_dir=model_dir)


def training(data, spec, *, starts=None, model="dcn_v2"):
    import keras

    from loops_data import ctr_training
    from loops_data import settings as data_settings
    from loops_models import settings as model_settings

    values = {setting.name: setting.default for setting in data_settings.CTR_DATA}
    values.update(data=data, spec=spec, validation_fraction=0.0)
    settings = {setting.name: setting.default for setting in model_settings.CTR}
    settings.update(model=model, hidden_units=16, hidden_layers=1, embedding_dim=4)
    return ctr_training.CTRTraining(
        values,
        settings,
        seed=3,
        global_batch_size=32,
        optimizers=lambda: (lambda: keras.optimizers.Adam(0.05), (None, None)),
        warm_start=starts,
    )


def trained_day1(spec, data, model_dir, *, model="dcn_v2"):
    """Day 1 trained 5 Adam steps into `model_dir` (closed, checkpointed)."""
    first = trainer_of(training(data, spec, model=model), model_dir, steps_per_loop=5)
    first.train(5)
    first.close()
    return feature_tables.FittedFeatures.from_json(
        open(os.path.join(model_dir, "features.json")).read()
    )


def built_rows(training, layer):
    """The rows `layer`'s table starts from in `training`'s model, as its seed builds them."""
    from loops_models import ctr

    settings = dict(training.model)
    name = settings.pop("model")
    model = ctr.build_model(name, ctr.CTRFeatures(**training.split().features), **settings, seed=3)
    return model.get_layer(layer).weights[0].numpy()


def rows_and_slots(trainer, layer):
    """The table of `layer` (the model's) and its two Adam slots, as arrays."""
    model = trainer.definition.model
    (table,) = [v for v in model.get_layer(layer).weights]
    start = table.path.replace("/", "_") + "_"
    slots = sorted(
        (v for v in trainer.definition.optimizer.variables if v.name.startswith(start)),
        key=lambda v: v.name,
    )
    assert len(slots) == 2, [v.name for v in trainer.definition.optimizer.variables]
    return [np.array(v.numpy()) for v in (table, *slots)]


def test_a_continuation_grows_the_vocabularies_and_keeps_each_old_values_rows_and_slots(
    days, tmp_path
):
    spec, data = days
    before = trained_day1(spec, data[1], str(tmp_path / "day1"))
    saved = trained = None
    day1 = trainer_of(training(data[1], spec), str(tmp_path / "day1"))
    saved = rows_and_slots(day1, "city_embedding")
    day1.close()
    assert saved[1].any() and saved[2].any()  # Adam's moments of 5 steps

    second = training(data[2], spec, starts={"continue_from": str(tmp_path / "day1")})
    trained = trainer_of(second, str(tmp_path / "day2"))
    grown = second.split().fitted
    built = built_rows(second, "city_embedding")
    # The vocabularies: day 1's, then day 2's new values; the scales and boundaries day 1's.
    assert grown.vocabularies["city"][:4] == before.vocabularies["city"]
    assert sorted(grown.vocabularies["city"][4:]) == ["Baku", "Kyiv"]
    assert grown.scales == before.scales and grown.boundaries == before.boundaries
    assert grown.vocabularies["tags"] == before.vocabularies["tags"]
    rows = rows_and_slots(trained, "city_embedding")
    # Row 0 (out of vocabulary) and the 4 old cities: day 1's rows and Adam moments, bit for
    # bit; the 2 new cities: the rows the model builds, their moments zero.
    for got, was in zip(rows, saved):
        np.testing.assert_array_equal(got[:5], was)
        assert got.shape[0] == 7
    np.testing.assert_array_equal(rows[0][5:], built[5:])
    assert not rows[1][5:].any() and not rows[2][5:].any()
    report = trained.warm_start_report
    assert report["continues"] and report["step"] == 5
    city = report["remapped"]["city_embedding"]
    assert (city["rows"], city["kept"], city["new"], city["dropped"]) == (7, 5, 2, 0)
    assert len(city["variables"]) == 3  # the rows and Adam's two moments
    # The temporal evaluation: day 1's model, as day 2 starts, on day 2's evaluated rows.
    start = report["evaluated_at_start"]
    assert start.pop("step") == 5 and start == trained.evaluate()
    assert report["temporal"] == [report["evaluated_at_start"]]
    notes = trained.definition.data_notes["features"]
    assert notes["vocabularies"]["city"] == {"was": 4, "now": 6, "added": 2}
    trained.close()


def test_a_warm_start_from_another_model_remaps_each_shared_value_by_value(days, tmp_path):
    """A new model fitted on day 2 alone (its own vocabulary order) takes day 1's wide & deep
    tables, both of each column, row by row by value: a value of both keeps its day-1 rows,
    a value new or gone starts as built; the dense optimizer's state is not taken."""
    spec, data = days
    before = trained_day1(spec, data[1], str(tmp_path / "day1"), model="wide_and_deep")
    day1 = trainer_of(training(data[1], spec, model="wide_and_deep"), str(tmp_path / "day1"))
    layers = ("city_embedding", "wide_city_embedding")
    was = {layer: day1.definition.model.get_layer(layer).weights[0].numpy() for layer in layers}
    day1.close()
    starts = {"warm_start_from": str(tmp_path / "day1"), "warm_start_variables": "model/.*"}
    other = training(data[2], spec, starts=starts, model="wide_and_deep")
    trainer = trainer_of(other, str(tmp_path / "other"))
    now = other.split().fitted
    assert now.vocabularies["city"] != before.vocabularies["city"][: len(now.vocabularies["city"])]
    old_row = {value: row for row, value in enumerate(before.vocabularies["city"], 1)}
    for layer in layers:
        got = trainer.definition.model.get_layer(layer).weights[0].numpy()
        built = built_rows(other, layer)
        np.testing.assert_array_equal(got[0], was[layer][0])
        for row, value in enumerate(now.vocabularies["city"], 1):
            expected = was[layer][old_row[value]] if value in old_row else built[row]
            np.testing.assert_array_equal(got[row], expected)
    report = trainer.warm_start_report
    assert set(report["remapped"]) >= {"city_embedding", "wide_city_embedding"}
    assert report["remapped"]["city_embedding"]["kept"] == 3  # row 0, Oslo and Rome
    assert not any(name.startswith("optimizer/") for name in report["taken"])
    trainer.close()


def write_features(model_dir, spec=SPEC, vocabulary=("Oslo",)):
    os.makedirs(model_dir, exist_ok=True)
    fitted = feature_tables.FittedFeatures(
        feature_tables.FeatureSpec.from_json(spec),
        {"city": list(vocabulary), "tags": ["a"]},
        {"age": (30.0, 10.0)},
        {"age": [25.0, 40.0]},
    )
    with open(os.path.join(model_dir, "features.json"), "w") as stream:
        stream.write(fitted.to_json())
    return fitted


def test_what_cannot_continue_is_refused_before_tensorflow_naming_it(days, tmp_path):
    spec, data = days
    other = dict(SPEC, columns=[*SPEC["columns"][:2], {"name": "tags", "kind": "categorical"}])
    write_features(str(tmp_path / "respec"), spec=other)
    with pytest.raises(ValueError) as refused:
        training(data[2], spec, starts={"continue_from": str(tmp_path / "respec")}).check()
    message = str(refused.value)
    assert "The spec differs from the one the run" in message and "column 'tags'" in message
    assert "'kind': 'categorical'" in message and "'kind': 'multi_hot'" in message
    assert f"(--spec={spec})" in message
    os.makedirs(tmp_path / "empty")
    with pytest.raises(ValueError, match="holds no feature statistics") as refused:
        training(data[2], spec, starts={"continue_from": str(tmp_path / "empty")}).check()
    assert "it is not the model_dir of a loops-ctr run" in str(refused.value)
    generated = tmp_path / "generated"
    os.makedirs(generated)
    (generated / "config.json").write_text(json.dumps({"data": None, "generated_rows": 4000}))
    with pytest.raises(ValueError) as refused:
        training(data[2], spec, starts={"continue_from": str(generated)}).check()
    assert "was trained on the generated log and this run reads a feature table" in str(
        refused.value
    )


def test_the_growth_rule_appends_new_values_up_to_max_vocabulary_and_keeps_the_scales():
    capped = dict(
        SPEC,
        columns=[{**c, "max_vocabulary": 3} if c["name"] == "city" else c for c in SPEC["columns"]],
    )
    parsed = feature_tables.FeatureSpec.from_json(capped)
    was = feature_tables.FittedFeatures(
        parsed, {"city": ["b", "a"], "tags": []}, {"age": (1.0, 2.0)}
    )
    day = feature_tables.FittedFeatures(
        parsed, {"city": ["c", "a", "d"], "tags": ["x"]}, {"age": (5.0, 9.0)}, {"age": [7.0]}
    )
    grown = feature_growth.grown(was, day)
    assert grown.vocabularies == {"city": ["b", "a", "c"], "tags": ["x"]}
    assert grown.scales == {"age": (1.0, 2.0)} and grown.boundaries == {}
    assert feature_growth.growth(was, grown)["city"] == {"was": 2, "now": 3, "added": 1}
    # A value named like row 0's id keeps a row of its own.
    assert feature_growth.row_values([feature_growth.OUT_OF_VOCABULARY]) == [
        feature_growth.OUT_OF_VOCABULARY,
        feature_growth.VALUE_MARK + feature_growth.OUT_OF_VOCABULARY,
    ]


SMALL = (
    *("--model=dcn_v2", "--embedding_dim=4", "--hidden_units=16", "--hidden_layers=1"),
    *("--validation_fraction=0", "--global_batch_size=32", "--eval_every=10"),
)


def write_shards(csv, folder):
    """The rows of `csv` as two Parquet shards in `folder` (a day's log of shards)."""
    import pyarrow.csv as pc
    import pyarrow.parquet as pq

    table = pc.read_csv(csv)
    os.makedirs(folder)
    half = table.num_rows // 2
    for shard, part in enumerate((table.slice(0, half), table.slice(half))):
        pq.write_table(part, os.path.join(folder, f"part-{shard}.parquet"), row_group_size=40)
    return str(folder)


def test_loops_ctr_continues_day_by_day_onto_a_log_of_shards_with_delta_exports(days, tmp_path):
    """Day 2 (a table) goes on from day 1's step, its vocabularies grown, with a delta that
    patches day 1's export into day 2's bit for bit on 10^4 requests; day 3 (a log of
    shards) goes on from day 2, the lineage of both runs before in its results.json; a
    --train_steps the run continued from reached already is refused before any work."""
    from conftest import read_results, run_module, run_python

    spec, data = days
    data[3] = write_shards(write_day(tmp_path / "day3.csv", 2, rows=200), tmp_path / "day3")
    run = {day: tmp_path / f"d{day}" for day in data}

    def ctr(day, steps, *more):
        return run_module(
            "loops.bin.ctr",
            *SMALL,
            f"--data={data[day]}",
            f"--spec={spec}",
            f"--model_dir={run[day]}",
            f"--train_steps={steps}",
            *more,
        )

    first = ctr(1, 10)
    assert first.returncode == 0, first.stderr[-3000:]
    refused = ctr(2, 10, f"--continue_from={run[1]}")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert "pass --train_steps=20 to train 10 steps more" in refused.stderr
    assert not (run[2] / "checkpoints").exists()
    # Day 2 keeps its best validation AUC: a link at each evaluation that keeps one, then
    # the export's (tests/test_delta_chain.py has the chain's own cases).
    validated = ("--validation_fraction=0.25", "--eval_every=5")
    second = ctr(2, 20, f"--continue_from={run[1]}", "--export_deltas", *validated)
    assert second.returncode == 0, second.stderr[-3000:]
    third = ctr(3, 30, f"--continue_from={run[2]}")
    assert third.returncode == 0, third.stderr[-3000:]

    def features(day):
        with open(run[day] / "features.json") as stream:
            return feature_tables.FittedFeatures.from_json(stream.read())

    cities = {day: features(day).vocabularies["city"] for day in data}
    assert cities[2][:4] == cities[1] and sorted(cities[2][4:]) == ["Baku", "Kyiv"]
    assert cities[3] == cities[2]  # day 3's cities are day 2's
    assert features(3).scales == features(2).scales == features(1).scales
    results = {day: read_results(str(run[day])) for day in data}
    assert results[2]["global_step"] == 20 and results[3]["global_step"] == 30
    growth = results[2]["data"]["features"]
    assert growth["grown_from"] == str(run[1]) and growth["vocabularies"]["city"]["added"] == 2
    lineage = results[3]["warm_start"]["lineage"]
    assert [entry["step"] for entry in lineage] == [10, 20]
    assert [entry["log"]["files"]["data"]["path"] for entry in lineage] == [data[1], data[2]]
    # The temporal evaluation of each day after the first: the model of the days before.
    temporal = results[3]["warm_start"]["temporal"]
    assert [entry["step"] for entry in temporal] == [10, 20]
    assert (
        temporal[0]
        == results[2]["warm_start"]["evaluated_at_start"]
        == lineage[1]["evaluated_at_start"]
    )
    assert all(0 < entry["auc"] < 1 and entry["examples"] > 0 for entry in temporal)
    assert results[3]["data"]["source"].endswith("parquet, 2 shards, 200 rows (streamed)")

    from loops.model_dir import export_deltas

    links = [export_deltas.read_delta(p) for p in export_deltas.delta_paths([run[2] / "deltas"])]
    kept = second.stdout.count("(a best kept)")
    assert kept >= 1 and len(links) == kept + 1, second.stdout[-2000:]
    assert links[0]["follows"] == export_deltas.fingerprint(str(run[1] / "export"))
    assert [link["follows"] for link in links[1:]] == [link["gives"] for link in links[:-1]]
    assert links[-1]["gives"] == export_deltas.fingerprint(str(run[2] / "export"))
    applied = run_module(
        "loops.cli.apply_deltas",
        f"--export={run[1] / 'export'}",
        f"--deltas={run[2] / 'deltas'}",
        f"--output={tmp_path / 'patched'}",
    )
    assert applied.returncode == 0, applied.stderr[-2000:]
    code = """
import sys, numpy as np, tensorflow as tf
rng = np.random.default_rng(4)
cities = np.array(["Oslo", "Rome", "Lima", "Pune", "Kyiv", "Baku", "Nowhere"])
request = dict(
    age=tf.constant(rng.uniform(10, 90, 10_000)),
    city=tf.constant(cities[rng.integers(0, 7, 10_000)]),
    tags=tf.constant(np.array(["a|b", "", "c", "e|d|z"])[rng.integers(0, 4, 10_000)]),
)
def answers(path):
    served = tf.saved_model.load(path).signatures["serving_default"]
    return {key: value.numpy() for key, value in served(**request).items()}
a, b, before = map(answers, sys.argv[1:])
assert sorted(a) == sorted(b) == ["logits", "probabilities", "valid_row"]
for key in a:
    assert a[key].tobytes() == b[key].tobytes(), key
assert not np.array_equal(a["logits"], before["logits"])
assert not [m for m in sys.modules if m.startswith("loops")]
print("equal", len(a["logits"]))
"""
    paths = (tmp_path / "patched", run[2] / "export", run[1] / "export")
    done = run_python(code, *map(str, paths))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "equal 10000" in done.stdout
