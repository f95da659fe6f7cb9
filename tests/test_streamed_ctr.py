"""A click-through loop on a sharded log: streamed rows train as the same rows held in memory,
1, 2 and 4 replicas give the same losses, weights and evaluation on streamed batches (partial
last eval batch included), and loops-ctr on shards killed mid-epoch resumes to the uninterrupted
run's weights on the same layout and on another."""

import os
import shutil
import signal

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf

import loops
from conftest import binary_run, final_weights
from loops.input import feature_streams, feature_tables, sharded_logs, streaming_fit
from loops_data import ctr_data
from loops_data.ctr_tables import features_of
from loops_models import ctr

SPEC = {
    "label": "clicked",
    "columns": [
        {"name": "I1", "kind": "numeric"},
        {"name": "I2", "kind": "numeric"},
        {"name": "C1", "kind": "categorical"},
        {"name": "C2", "kind": "categorical", "min_count": 2},
        {"name": "tags", "kind": "multi_hot"},
    ],
}


def log_columns(rows, seed=4):
    log = ctr_data.click_log(
        rows, seed=seed, numeric_columns=2, categorical_columns=2, multi_hot_columns=1,
        cardinality=12, bag_cardinality=9, longest_bag=3,
    )  # fmt: skip
    columns = {"clicked": log.labels.astype(np.int64)}
    columns["I1"], columns["I2"] = (log.columns[n].astype(np.float64) for n in ("I1", "I2"))
    columns["C1"] = [f"a{v}" for v in log.columns["C1"]]
    columns["C2"] = log.columns["C2"].astype(np.int64)
    columns["tags"] = ["|".join(f"t{v}" for v in bag if v >= 0) for bag in log.columns["tags"]]
    return columns


def write_shards(folder, rows=700, shards=3, group=60):
    os.makedirs(folder, exist_ok=True)
    table = pa.table(log_columns(rows))
    step = -(-rows // shards)
    for shard in range(shards):
        part = table.slice(shard * step, step)
        pq.write_table(part, os.path.join(folder, f"day-{shard}.parquet"), row_group_size=group)
    return str(folder)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("clicks") / "log")


def feature_log(folder, split=(0.2, 0.0)):
    log = sharded_logs.ShardedLog.open(folder)
    spec = feature_tables.FeatureSpec.from_json(SPEC)
    band = streaming_fit.Split(*split).bands()["train"]
    return feature_streams.FeatureLog(log, streaming_fit.fit_log(spec, log, band),
                                      streaming_fit.Split(*split))  # fmt: skip


def trainer(strategy, train_data, eval_data, fitted):
    features = ctr.CTRFeatures(**features_of(fitted))
    return loops.Trainer(
        loops.CTRLoop(
            model_fn=lambda: ctr.dcn_v2(
                features, embedding_dim=4, cross_layers=1, hidden_units=(6,), seed=2
            ),  # fmt: skip
            optimizer_fn=lambda: keras.optimizers.Adam(0.02),
            auc_examples=1000,
        ),
        strategy=strategy,
        train_data=train_data,
        eval_data=eval_data,
        steps_per_loop=4,
        progress=loops.testing.quiet_progress(),
    )


def test_streamed_rows_train_as_the_same_rows_held_in_memory(shards):
    logged = feature_log(shards)
    ordered = logged.eval_batches("train", global_batch_size=32)
    # The training rows in memory, in the log's order: the same batches, from arrays.
    arrays = [batch for batch in ordered()]
    columns = {n: np.concatenate([b[0][n].numpy() for b in arrays])
               for n in arrays[0][0] if n != "tags"}  # fmt: skip
    width = max(b[0]["tags"].shape[1] for b in arrays)
    columns["tags"] = np.concatenate(
        [np.pad(b[0]["tags"].numpy(), ((0, 0), (0, width - b[0]["tags"].shape[1])),
                constant_values=-1) for b in arrays]
    )  # fmt: skip
    labels = np.concatenate([b[1].numpy() for b in arrays])
    # The stream's own reading of every block equals `FittedFeatures.arrays` of the whole
    # training rows (the fit's own, row by row).
    whole = sharded_logs.LogPart(logged.log, *logged.split.bands()["train"])
    tables = [whole.read(b).table() for b in range(len(logged.log.blocks))]
    assert sum(len(t.columns["clicked"]) for t in tables) == len(labels)
    from loops_data.in_memory import batches_in_memory

    evaluated = logged.eval_batches("test", global_batch_size=50)
    runs = {}
    strategy = loops.testing.replica_strategy(1)
    for name, train_data in {
        "streamed": lambda: ordered().repeat(),
        "memory": lambda: batches_in_memory((columns, labels), 32).repeat(),
    }.items():
        run = trainer(strategy, train_data, evaluated, logged.fitted)
        runs[name] = {"logs": run.train(12), "weights": loops.testing.loop_weights(run),
                      "eval": run.state.last_eval_metrics}  # fmt: skip
        run.close()
    loops.testing.assert_runs_agree(runs["streamed"], runs["memory"], rtol=1e-6, label="memory")
    assert runs["streamed"]["eval"]["examples"] == logged.row_counts()["test"]


def test_streamed_shuffled_batches_give_the_same_numbers_on_1_2_and_4_replicas(shards):
    logged = feature_log(shards, split=(0.2, 0.1))
    counts = logged.row_counts()
    # Eval batches of 24 over the validation rows: the last one partial.
    assert counts["validation"] % 24, counts

    def build(strategy):
        return trainer(
            strategy,
            logged.train_batches(global_batch_size=32, seed=9, window_blocks=2),
            logged.eval_batches("validation", global_batch_size=24),
            logged.fitted,
        )

    runs = loops.testing.assert_replica_parity(build, num_steps=12)
    assert runs[4]["eval"]["examples"] == counts["validation"]
    assert np.all(np.isfinite(runs[1]["logs"]["loss"]))


# ---- loops-ctr on shards, killed mid-epoch (SIGKILL) and resumed. ----


def ctr_run(model_dir, shards, spec, *extra, kill_after=None):
    flags = [
        f"--data={shards}",
        f"--spec={spec}",
        f"--model_dir={model_dir}",
        "--train_steps=40",
        "--steps_per_loop=5",
        "--checkpoint_every=5",
        "--eval_every=40",
        "--global_batch_size=32",
        "--shuffle_window=2",
        "--model=wide_and_deep",
        "--embedding_dim=4",
        "--seed=1",
        *extra,
    ]
    return binary_run("loops.bin.ctr", flags, kill_after=kill_after)


def test_loops_ctr_on_shards_killed_mid_epoch_resumes_bit_identical_on_this_and_another_layout(
    tmp_path, shards
):
    import json

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    shards = shutil.copytree(shards, tmp_path / "log")
    runs = {
        "whole": ctr_run(tmp_path / "whole", shards, spec),
        # Killed as its first call after the checkpoint of step 15 starts: 560 training
        # rows are 17.5 batches, so the kill is mid-epoch and the resume starts mid-window.
        "killed": ctr_run(tmp_path / "same", shards, spec, kill_after=15),
        "moved": ctr_run(tmp_path / "moved", shards, spec, kill_after=15),
    }
    assert runs["whole"].returncode == 0, runs["whole"].stderr[-3000:]
    for name in ("killed", "moved"):
        assert runs[name].returncode == -signal.SIGKILL, runs[name].stderr[-3000:]
    step = int(tf.train.latest_checkpoint(str(tmp_path / "same" / "checkpoints")).rsplit("-")[-1])
    assert step == 15
    # The killed run's statistics, kept beside its checkpoints, are what the resume reads.
    kept = json.loads((tmp_path / "same" / "streamed_features.json").read_text())
    same = ctr_run(tmp_path / "same", shards, spec)
    moved = ctr_run(tmp_path / "moved", shards, spec, "--num_replicas=2")
    for done in (same, moved):
        assert done.returncode == 0, done.stderr[-3000:]
    expected = final_weights(tmp_path / "whole")
    assert len(expected) >= 8
    for name, array in final_weights(tmp_path / "same").items():
        np.testing.assert_array_equal(array, expected[name], err_msg=name)
    for name, array in final_weights(tmp_path / "moved").items():
        np.testing.assert_allclose(array, expected[name], rtol=1e-5, atol=1e-7, err_msg=name)
    exported = (tmp_path / "same" / "export" / "features.json").read_text()
    assert json.loads(kept["fitted"]) == json.loads(exported)
    results = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert results["data"]["source"].endswith("3 shards, 700 rows (streamed)")
    assert results["test"]["examples"] == results["data"]["test_rows"] > 100
    # A shard rewritten between runs: the resume is refused before TensorFlow starts,
    # naming the log, and the run's checkpoints stay as they were.
    pq.write_table(pa.table(log_columns(50, seed=8)), shards / "day-1.parquet")
    refused = ctr_run(tmp_path / "whole", shards, spec, "--train_steps=50")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr[-2000:]
    assert f"--data={shards} changed since the run read it" in refused.stderr, refused.stderr
    assert final_weights(tmp_path / "whole").keys() == expected.keys()


def test_a_resume_reads_the_statistics_its_run_fitted_and_another_split_fits_anew(shards, tmp_path):
    from loops_data import ctr_streams

    spec = feature_tables.FeatureSpec.from_json(SPEC)
    log = sharded_logs.ShardedLog.open(shards)
    fitted = ctr_streams.fitted_log(spec, log, split=(0.2, 0.0), model_dir=None, flags="")
    # A run's statistics as the model_dir keeps them (here with a vocabulary of its own, so
    # reading them is told from fitting again).
    kept = feature_tables.FittedFeatures(
        spec, {**fitted.vocabularies, "C1": ["kept"]}, fitted.scales, fitted.boundaries
    )
    ctr_streams.save_fit(str(tmp_path), spec, log, kept, (0.2, 0.0))
    read = ctr_streams.fitted_log(spec, log, split=(0.2, 0.0), model_dir=str(tmp_path), flags="")
    assert read.vocabularies["C1"] == ["kept"]
    other = ctr_streams.fitted_log(spec, log, split=(0.3, 0.0), model_dir=str(tmp_path), flags="")
    assert other.vocabularies["C1"] != ["kept"] and other.vocabularies["C1"]
    (tmp_path / ctr_streams.FITTED_FILE).write_text("{not json")
    again = ctr_streams.fitted_log(spec, log, split=(0.2, 0.0), model_dir=str(tmp_path), flags="")
    assert again.to_json() == fitted.to_json()


def test_the_streaming_auc_is_within_the_bound_it_states_of_the_exact_one():
    from loops.kinds.library.ranking_metrics import StreamingAUC, auc

    rng = np.random.default_rng(0)
    labels = (rng.random(200_000) < 0.2).astype(np.float64)
    logits = rng.normal(0.0, 1.5, len(labels)) + 1.2 * labels
    exact = auc(logits, labels)
    bounds = []
    for bins in (16, 256, 1 << 16):
        streaming = StreamingAUC(bins=bins)
        for start in range(0, len(labels), 30_000):  # batches, as a test pass streams them
            streaming.update(logits[start : start + 30_000], labels[start : start + 30_000])
        assert abs(streaming.result() - exact) <= streaming.bound(), bins
        bounds.append(streaming.bound())
    assert bounds[0] > bounds[1] > bounds[2] and bounds[2] < 1e-4, bounds
    # Scores past the range fall in the end bins; ties of equal scores are halves in both.
    tied = StreamingAUC(bins=4, low=-1.0, high=1.0)
    tied.update(np.array([-5.0, -5.0, 0.2, 9.0]), np.array([0, 1, 0, 1]))
    assert tied.result() == auc(np.array([-5.0, -5.0, 0.2, 9.0]), np.array([0, 1, 0, 1])) == 0.625


def test_streamed_test_figures_past_the_exact_rows_equal_the_exact_ones_within_their_bound(
    shards,
):
    from loops_data import ctr_streams

    logged = feature_log(shards)
    streamed = ctr_streams.StreamedTable(logged.log, logged.fitted, 0.2, 0.0, 2)
    run = trainer(
        loops.testing.replica_strategy(1),
        logged.train_batches(global_batch_size=32, seed=1),
        logged.eval_batches("test", global_batch_size=32),
        logged.fitted,
    )
    run.train(8)
    exact = streamed.test_figures(run.definition, 32)
    sketched = streamed.test_figures(run.definition, 32, exact_rows=40)
    run.close()
    # Logits of a model 8 steps in lie close together: the bins' bound is loose, and holds.
    assert "auc_bound" not in exact and 0 < sketched["auc_bound"] < 1e-2
    assert abs(sketched["auc"] - exact["auc"]) <= sketched["auc_bound"]
    for name in ("log_loss", "accuracy", "mean_prediction", "positive_rate", "calibration"):
        assert sketched[name] == pytest.approx(exact[name], rel=1e-12), name
    assert sketched["examples"] == exact["examples"] == logged.row_counts()["test"]


def test_format_streams_a_single_file_and_the_run_records_its_split_and_window(shards, tmp_path):
    import json

    from loops_data import ctr_streams, ctr_training
    from loops_data import settings as data_settings
    from loops_models import settings as model_settings

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(SPEC))
    data = {setting.name: setting.default for setting in data_settings.CTR_DATA}
    one = os.path.join(shards, "day-0.parquet")
    assert not ctr_streams.names_shards(one, None)  # one Parquet file alone: read whole
    data.update(data=one, spec=str(spec), format="parquet", shuffle_window=3)
    training = ctr_training.CTRTraining(
        data,
        {setting.name: setting.default for setting in model_settings.CTR},
        seed=0,
        global_batch_size=32,
        optimizers=lambda: (None, (None, None)),
    )
    assert training.streamed
    training.check(str(tmp_path / "run"))
    split = training.identity()["split"]
    assert (split["how"], split["shuffle_window"]) == ("row hash", 3)
    assert training.split().notes()["source"].endswith("parquet, 1 shards, 234 rows (streamed)")
