"""Issue 64's faults of the binaries' flags and outputs: sizes no machine holds refused before
TensorFlow with the largest that fits, an ETA past a century said in years, a flagfile line
without dashes refused by file and line, and the outputs a run writes (results.json, config.json,
another run's export) checked before any training.
"""

import io
import json
import os
import subprocess
import sys
import time

import keras
import pytest
from absl import app, flags
from absl.testing import flagsaver

import loops
from conftest import ROOT, Counter
from conftest import SUBPROCESS_ENV as ENV
from loops.bin import classifier as classifier_binary
from loops.bin import flag_checks, training_settings
from loops.cli import application, flagfiles
from loops.cli import flags as loop_flags
from loops.core import own_files, reporting
from loops.model_dir import run_outputs
from loops.vocabulary import settings
from loops.vocabulary.host_memory import in_units, memory_bytes
from loops_data import ctr_tables
from loops_models import ctr
from loops_models import settings as model_settings

# A refusal before TensorFlow loads takes about a second; far below this on a loaded machine.
REFUSAL_SECONDS = 60


# ---- 14: a flagfile line without leading dashes. ----


def test_a_flagfile_line_without_dashes_is_refused_naming_the_file_and_line(tmp_path):
    path = tmp_path / "run.flags"
    path.write_text("# settings\n--model=cnn\ntrain_steps=7\n")
    with pytest.raises(ValueError) as refused:
        flagfiles.check_flagfiles([f"--flagfile={path}"])
    assert str(refused.value) == (
        f"--flagfile={path}, line 3 is 'train_steps=7', no flag: a flagfile's lines start "
        "with dashes; write it as --train_steps=7, or start it with # to keep it as a comment."
    )
    included = tmp_path / "included.flags"
    included.write_text("model_dir /tmp/run\n")
    path.write_text(f"--flagfile={included}\n")
    with pytest.raises(ValueError, match=rf"^--flagfile={included}, line 1 is 'model_dir "):
        flagfiles.check_flagfiles([f"--flagfile={path}"])
    path.write_text("-train_steps=7\n--model=cnn\n")  # one dash is a flag to absl too
    flagfiles.check_flagfiles([f"--flagfile={path}"])


# ---- 7: step counts and the ETA. ----


def test_an_eta_past_a_century_is_said_in_years_not_an_overflow():
    assert reporting.eta_text(100.4) == "0:01:40"
    assert reporting.eta_text(3 * 86400) == "3 days, 0:00:00"
    century = reporting.LONGEST_ETA_YEARS * 365.25 * 86400
    assert reporting.eta_text(century) == "36525 days, 0:00:00"
    assert reporting.eta_text(century + 1) == "more than 100 years"
    assert reporting.eta_text(float("inf")) == "more than 100 years"
    progress = reporting.Progress(stream=io.StringIO())
    # --train_steps=2**63-1 at 5 steps/s: 58 billion years, past timedelta's 2.7 million.
    progress.train(500, loop_flags.INT64_MAX, {"loss": 0.5}, 5.0)
    assert progress.stream.getvalue() == (
        f"step 500/{loop_flags.INT64_MAX} | loss 0.5 | 5.0 steps/s | ETA more than 100 years\n"
    )


def test_an_integer_flag_beyond_int64_is_refused_with_the_largest_accepted():
    values = flags.FlagValues()
    loop_flags.define_setting_flag(settings.BY_NAME["train_steps"], 600, values)
    offset = settings.Setting("offset", "training", "A count of no bound.", "integer", default=0)
    loop_flags.define_setting_flag(offset, 0, values)
    values(["binary", f"--train_steps={2**63 - 1}", f"--offset={-(2**63)}"])
    assert (values.train_steps, values.offset) == (2**63 - 1, -(2**63))
    for flag, value, bound in [
        ("train_steps", "99999999999999999999999", "<=9223372036854775807"),
        ("offset", str(-(2**63) - 1), ">=-9223372036854775808"),
    ]:
        values.unparse_flags()
        with pytest.raises(flags.IllegalFlagValueError) as refused:
            values(["binary", f"--{flag}={value}"])
        assert str(refused.value) == (
            f"flag --{flag}={value}: {value} is beyond the 64-bit integers TensorFlow counts "
            f"steps and sizes in; pass --{flag}{bound}."
        )


# ---- 7: a CTR model's weights and the generated log against memory. ----


def test_the_counted_weights_of_each_ctr_model_are_keras_own():
    features = ctr.CTRFeatures(
        numeric=["a", "b", "c"], categorical={"x": 7, "y": 13}, multi_hot={"t": (5, "sum")}
    )
    for model in ctr.MODELS:
        for sizes in [(3, 5, 2, 2), (4, 6, 1, 3)]:
            named = dict(
                zip(("embedding_dim", "hidden_units", "hidden_layers", "cross_layers"), sizes)
            )
            built = ctr.build_model(model, features, **named)
            tables, other = model_settings.ctr_weights(
                model, numeric_columns=3, table_rows=[7, 13, 5], **named
            )
            assert tables + other == built.count_params(), (model, sizes)
            keras.backend.clear_session()
    # wide & deep without a numeric column: no weight for them.
    built = ctr.build_model("wide_and_deep", ctr.CTRFeatures(categorical={"x": 7}), hidden_layers=1)
    counted = model_settings.ctr_weights(
        "wide_and_deep",
        numeric_columns=0,
        table_rows=[7],
        embedding_dim=8,
        hidden_units=64,
        hidden_layers=1,
        cross_layers=2,
    )
    assert sum(counted) == built.count_params()


def test_a_ctr_model_is_checked_against_memory_with_the_largest_sizes_that_fit():
    model = {"model": "wide_and_deep", "embedding_dim": 4, "hidden_units": 8}
    model |= {"hidden_layers": 1, "cross_layers": 2}
    # 1,010 table rows x (4 + 1) weights and 91 others, held 3 times at 4 bytes: 61,692 bytes.
    sizes = dict(
        numeric_columns=1,
        tables={"city": 1000, "tags": 10},
        copies=(3, 3),
        source="--spec=ctr.json",
        hashed=["city"],
    )
    model_settings.check_ctr_fits(model, **sizes, memory=61_692)
    with pytest.raises(ValueError) as refused:
        model_settings.check_ctr_fits(model, **sizes, memory=61_691)
    assert str(refused.value) == (
        "--model=wide_and_deep --embedding_dim=4 --hidden_units=8 --hidden_layers=1 over "
        "--spec=ctr.json is more than this machine can train: its 5,141 weights (5,050 of them "
        "in tables of 1,010 rows), held 3 times (the weights and their optimizer's slots) at 4 "
        "bytes, need 61,692 bytes, and it has 61,691 bytes of memory; pass --embedding_dim<=3 "
        "or --hidden_units<=7 or \"hash_buckets\": 999 (or fewer) for column 'city'."
    )
    # dcn_v2's cross layers grow with the width squared (1 + 2 x 4,000 numbers): their
    # count is a fix of its own; its tables, trained by SGD of their own, held once.
    dcn = model | {"model": "dcn_v2", "embedding_dim": 4000, "cross_layers": 4}
    with pytest.raises(ValueError) as refused:
        model_settings.check_ctr_fits(dcn, **sizes | {"copies": (1, 3)}, memory=2**30)
    assert str(refused.value) == (
        "--model=dcn_v2 --embedding_dim=4000 --hidden_units=8 --hidden_layers=1 "
        "--cross_layers=4 over --spec=ctr.json is more than this machine can train: its "
        "260,200,033 weights (4,040,000 of them in tables of 1,010 rows), held once in the "
        "tables and 3 times elsewhere (the weights and their optimizer's slots) at 4 bytes, "
        "need 2.9 GiB, and it has 1.0 GiB of memory; pass --embedding_dim<=2353 or "
        "--cross_layers<=1."
    )
    with pytest.raises(ValueError, match=r"pass smaller sizes and fewer table rows \(no one"):
        model_settings.check_ctr_fits(model, **sizes, memory=100)
    model_settings.check_ctr_fits(dcn, **sizes, memory=0)  # no figure: no check


def test_generated_rows_are_checked_against_memory():
    # 200 bytes a row: 4 numbers, 8 ids, 2 bags of 5, a label and a truth, twice.
    assert ctr_tables.GENERATED_ROW_BYTES == 200
    ctr_tables.check_generated_rows_fit(5_368_709, memory=2**30)
    with pytest.raises(ValueError) as refused:
        ctr_tables.check_generated_rows_fit(5_368_710, memory=2**30)
    assert str(refused.value) == (
        "--generated_rows=5368710 is more than this machine can hold: the generated log and "
        "its split take 200 bytes a row (1.0 GiB), and it has 1.0 GiB of memory; pass "
        "--generated_rows<=5368709."
    )
    assert sorted(ctr_tables.generated_tables().values()) == [50, 50] + [100] * 8


def test_table_weights_are_held_as_their_own_optimizer_keeps_them():
    optimizer = {"optimizer": "adam"}
    assert training_settings.table_weight_copies(optimizer, {"table_optimizer": "same"}) == 3
    assert training_settings.table_weight_copies(optimizer, {"table_optimizer": "adagrad"}) == 2
    for name in ("sgd", "rowwise_adagrad"):
        assert training_settings.table_weight_copies(optimizer, {"table_optimizer": name}) == 1


def test_a_language_models_weights_are_checked_against_memory():
    from loops_data import python_text
    from loops_models import lm

    assert flag_checks.LM_VOCAB_SIZE == python_text.VOCAB_SIZE
    for width, layers, heads, length in [(8, 2, 2, 16), (12, 1, 3, 5)]:
        built = lm.transformer_lm(
            vocab_size=256, sequence_length=length, width=width, num_layers=layers, num_heads=heads
        )
        values = {"width": width, "num_layers": layers}
        counted = model_settings.transformer_weights(values, sequence_length=length, vocab_size=256)
        assert counted == built.count_params()
        keras.backend.clear_session()
    model = {"width": 64, "num_layers": 2, "num_heads": 4}
    sizes = dict(sequence_length=128, vocab_size=256, copies=3)
    # 140,928 weights x 3 copies x 4 bytes = 1,691,136 bytes.
    model_settings.check_transformer_weights_fit(model, **sizes, memory=1_691_136)
    with pytest.raises(ValueError) as refused:
        model_settings.check_transformer_weights_fit(model, **sizes, memory=1_691_135)
    assert str(refused.value) == (
        "--width=64 --num_layers=2 is more than this machine can train: the language model's "
        "140,928 weights, held 3 times (the weights and the optimizer's slots) at 4 bytes, need "
        "1.6 MiB, and it has 1.6 MiB of memory; pass --width<=60 or --num_layers<=1."
    )


def test_a_rollout_and_a_replay_buffer_are_checked_against_memory():
    from loops_data import cartpole

    assert training_settings.ROLLOUT_STEP_BYTES == cartpole.OBSERVATION_SIZE * 4 + 12
    sizes = dict(algorithm="ppo", buffer_capacity=10**15)  # ppo keeps no replay buffer
    training_settings.check_rl_fits(**sizes, num_envs=10, rollout_length=100, memory=28_000)
    with pytest.raises(ValueError) as refused:
        training_settings.check_rl_fits(**sizes, num_envs=10, rollout_length=100, memory=27_999)
    assert str(refused.value) == (
        "--num_envs=10 --rollout_length=100 is more than this machine can hold: a rollout of "
        "1,000 environment steps at 28 bytes each (an observation, action, reward and end) "
        "needs 28,000 bytes, and it has 27,999 bytes of memory; pass --num_envs<=9 or "
        "--rollout_length<=99."
    )
    with pytest.raises(ValueError, match=r"^--num_envs=1000 is more .* pass --num_envs<=999\.$"):
        training_settings.check_rl_fits(**sizes, num_envs=1000, rollout_length=None, memory=27_999)
    dqn = dict(algorithm="dqn", num_envs=8, rollout_length=4)
    training_settings.check_rl_fits(**dqn, buffer_capacity=47_662, memory=2**21)
    with pytest.raises(ValueError) as refused:
        training_settings.check_rl_fits(**dqn, buffer_capacity=47_663, memory=2**21)
    assert str(refused.value) == (
        "--buffer_capacity=47663 is more than this machine can hold: the replay buffer's 44 "
        "bytes a transition (two observations, an action, reward and end) need 2.0 MiB, and "
        "it has 2.0 MiB of memory; pass --buffer_capacity<=47662."
    )


def run_binary(kind, *flags):
    start = time.monotonic()
    command = [sys.executable, "-m", f"loops.bin.{kind}", *flags]
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    return done, time.monotonic() - start


def test_sizes_no_machine_holds_are_refused_before_tensorflow(tmp_path):
    table, spec = tmp_path / "table.csv", tmp_path / "spec.json"
    table.write_text("age,city,clicked\n31,Oslo,1\n45,Rome,0\n28,Oslo,0\n52,Lima,1\n")
    columns = [{"name": "age", "kind": "numeric"}]
    columns.append({"name": "city", "kind": "categorical", "hash_buckets": 100_000_000_000})
    spec.write_text(json.dumps({"label": "clicked", "columns": columns}))
    memory = in_units(memory_bytes())
    model_dir = tmp_path / "run"
    cases = [
        (
            "ctr",
            [f"--data={table}", f"--spec={spec}"],
            "--model=dcn_v2 --embedding_dim=8 --hidden_units=64 --hidden_layers=2 "
            f"--cross_layers=2 over --spec={spec} is more than this machine can train: its "
            "800,000,005,045 weights (800,000,000,000 of them in tables of 100,000,000,000 "
            "rows), held 3 times (the weights and their optimizer's slots) at 4 bytes, need "
            f'8,940.7 GiB, and it has {memory} of memory; pass "hash_buckets": '
            # 3 x 4 bytes x (8 weights a row + 5,045 others) <= the memory
            f"{(memory_bytes() - 60_540) // 96} (or fewer) for column 'city'.",
        ),
        (
            "ctr",
            ["--generated_rows=99999999999999"],
            "--generated_rows=99999999999999 is more than this machine can hold: the generated "
            f"log and its split take 200 bytes a row (18,626,451.5 GiB), and it has {memory} of "
            f"memory; pass --generated_rows<={memory_bytes() // 200}.",
        ),
        (
            "gan",
            ["--train_steps=99999999999999999999999"],
            "error: flag --train_steps=99999999999999999999999: 99999999999999999999999 is "
            "beyond the 64-bit integers TensorFlow counts steps and sizes in; pass "
            "--train_steps<=9223372036854775807.",
        ),
        (
            "rl",
            ["--algorithm=dqn", "--buffer_capacity=100000000000"],
            "--buffer_capacity=100000000000 is more than this machine can hold: the replay "
            f"buffer's 44 bytes a transition (two observations, an action, reward and end) need "
            f"4,097.8 GiB, and it has {memory} of memory; pass --buffer_capacity<="
            f"{memory_bytes() // 44}.",
        ),
        (
            "lm",
            ["--width=100000"],  # 4 blocks of 12 x 100,000² weights
            "--width=100000 --num_layers=4 is more than this machine can train: the language "
            "model's 480,068,200,256 weights, held 3 times",
        ),
    ]
    for kind, given, sentence in cases:
        done, seconds = run_binary(kind, f"--model_dir={model_dir}", *given)
        assert done.returncode == 1, done.stderr[-2000:]
        assert sentence in " ".join(done.stderr.split()), done.stderr[-2000:]
        assert "Traceback" not in done.stderr
        assert seconds < REFUSAL_SECONDS
        assert not model_dir.exists()


# ---- 13: the outputs a run writes, checked before training. ----


def parse_classifier(*argv):
    flags.FLAGS.unparse_flags()
    return flags.FLAGS(["loops-classifier", *argv])


def test_a_planted_results_json_is_refused_before_the_binary_trains(tmp_path):
    target = tmp_path / "victim.txt"
    target.write_text("not the run's")
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    os.symlink(target, model_dir / "results.json")
    with flagsaver.flagsaver(), pytest.raises(app.UsageError) as raised:
        classifier_binary.main(parse_classifier(f"--model_dir={model_dir}"))
    assert str(raised.value) == str(own_files.planted_link(str(model_dir / "results.json")))
    assert sorted(os.listdir(model_dir)) == ["results.json"]  # no config.json, no checkpoint
    assert target.read_text() == "not the run's"
    os.remove(model_dir / "results.json")
    (model_dir / "config.json").mkdir()
    with flagsaver.flagsaver(), pytest.raises(app.UsageError) as raised:
        classifier_binary.main(parse_classifier(f"--model_dir={model_dir}"))
    assert str(raised.value) == (
        f"{model_dir / 'config.json'} is no plain file (a directory), where this run writes "
        "its config.json, which would fail there after the work; remove it (or use another "
        "--model_dir) and run the same command again."
    )


def test_a_trainer_refuses_a_planted_results_json_before_its_first_step(tmp_path):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    os.symlink(tmp_path / "elsewhere.json", model_dir / "results.json")
    with pytest.raises(own_files.PlantedLinkError, match="results.json is a symbolic link"):
        loops.Trainer(Counter(), model_dir=str(model_dir), progress=loops.testing.quiet_progress())
    assert os.listdir(model_dir) == ["results.json"]  # no config.json, no checkpoint, no lock
    assert not os.path.exists(tmp_path / "elsewhere.json")


def test_an_export_is_replaced_only_by_the_run_that_wrote_it_or_when_asked(tmp_path):
    export_dir, first, second = tmp_path / "export", tmp_path / "first", tmp_path / "second"
    export_dir.mkdir()
    (export_dir / "saved_model.pb").write_bytes(b"")
    (export_dir / "features.json").write_text("{}")
    with flagsaver.flagsaver(), pytest.raises(app.UsageError) as raised:
        parse_classifier(f"--model_dir={second}", f"--export_dir={export_dir}")
        application.check_run_outputs()
    assert str(raised.value) == (
        f"--export_dir={export_dir} holds another run's export (it has no "
        f"exported_from.txt naming the run that wrote it, not --model_dir={second}), which the "
        "export at the end of training would replace, and its files with it; pass "
        "--replace_export to replace it, or a new --export_dir."
    )
    (export_dir / run_outputs.EXPORT_MARKER).write_text(os.path.realpath(first) + "\n")
    assert run_outputs.export_writer(str(export_dir)) == os.path.realpath(first)
    with flagsaver.flagsaver():
        for argv in ([f"--model_dir={first}"], [f"--model_dir={second}", "--replace_export"]):
            parse_classifier(*argv, f"--export_dir={export_dir}")
            application.check_run_outputs()
        parse_classifier(f"--export_dir={export_dir}")  # a new model_dir
        with pytest.raises(app.UsageError, match=rf"the run in {first} wrote it, not a new "):
            application.check_run_outputs()
    # MODEL_DIR/export is the run's own, marked or not.
    assert run_outputs.is_this_runs_export(str(second / "export"), str(second))
    assert sorted(os.listdir(export_dir)) == [
        "exported_from.txt",
        "features.json",
        "saved_model.pb",
    ]


def test_a_binarys_export_records_its_model_dir(tmp_path, digits_dir):
    model_dir, export_dir = tmp_path / "run", tmp_path / "served"
    argv = [f"--model_dir={model_dir}", f"--export_dir={export_dir}", f"--data_dir={digits_dir}"]
    with flagsaver.flagsaver():
        classifier_binary.main(
            parse_classifier(*argv, "--train_steps=2", "--steps_per_loop=1", "--num_replicas=1")
        )
    assert (export_dir / "exported_from.txt").read_text() == f"{os.path.realpath(model_dir)}\n"
    with flagsaver.flagsaver(), pytest.raises(app.UsageError, match=f"the run in {model_dir} "):
        parse_classifier(f"--model_dir={tmp_path / 'other'}", f"--export_dir={export_dir}")
        application.check_run_outputs()
