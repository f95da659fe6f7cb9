"""Faults v4 (issues 45 and 46): a damaged config.json no longer blocks the trainer, the
evaluator of a finished run ends without --train_steps, and flagfiles, profile steps and a
read-only export directory are sentences before TensorFlow loads."""

import json
import os
import shutil
import subprocess
import time

import numpy as np
import pytest

from conftest import checkpoint_weights, read_results, run_module, run_python
from loops.cli import flagfiles
from loops.model_dir import run_config
from loops.run.profiling import StepProfiler


def classifier(model_dir, digits_dir, *extra):
    return [
        f"--model_dir={model_dir}",
        f"--data_dir={digits_dir}",
        "--steps_per_loop=4",
        "--checkpoint_every=4",
        "--global_batch_size=32",
        "--eval_every=8",
        *extra,
    ]


@pytest.fixture(scope="module")
def sixteen_steps(tmp_path_factory, digits_dir):
    """A classifier run trained to step 16 (the issue's command)."""
    model_dir = str(tmp_path_factory.mktemp("sixteen") / "run")
    done = run_module(
        "loops.bin.classifier", *classifier(model_dir, digits_dir, "--train_steps=16")
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return model_dir


@pytest.mark.parametrize("damage", ["{garbage", "", "[]", '"a string"'])
def test_a_config_json_that_is_no_object_reads_as_none_for_the_trainer(tmp_path, damage):
    # What the trainer's resume checks read (the evaluator's `read` refuses these instead).
    (tmp_path / "config.json").write_text(damage)
    assert run_config.read_if_intact(str(tmp_path)) is None
    (tmp_path / "config.json").write_text('{"global_batch_size": "32", "seed": 1}')
    assert run_config.read_if_intact(str(tmp_path)) == {"global_batch_size": "32", "seed": 1}
    with pytest.raises(ValueError, match="holds no JSON object of settings"):
        (tmp_path / "config.json").write_text(damage)
        run_config.read(str(tmp_path))


@pytest.mark.parametrize("damage", ["{garbage"])  # the others read the same: the test above
def test_a_damaged_config_json_resumes_to_the_weights_of_an_undamaged_one(
    tmp_path, digits_dir, sixteen_steps, damage
):
    intact, damaged = str(tmp_path / "intact"), str(tmp_path / "damaged")
    shutil.copytree(sixteen_steps, intact)
    shutil.copytree(sixteen_steps, damaged)
    config_path = os.path.join(damaged, "config.json")
    with open(config_path, "w") as stream:
        stream.write(damage)
    started = time.monotonic()
    resumed = run_module(
        "loops.bin.classifier", *classifier(damaged, digits_dir, "--train_steps=24")
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert time.monotonic() - started < 300
    assert (
        f"warning: {config_path} did not read as the run's settings (a JSON object); the "
        "checkpoint is restored (its own record holds what a resume must not change) and "
        "config.json is rewritten with this run's settings."
    ) in resumed.stdout
    assert "warning: " not in resumed.stdout.replace(f"warning: {config_path} did not", "")
    with open(config_path) as stream:
        assert json.load(stream)["global_batch_size"] == 32  # rewritten
    if damage == "{garbage":  # the undamaged twin, once
        done = run_module(
            "loops.bin.classifier", *classifier(intact, digits_dir, "--train_steps=24")
        )
        assert done.returncode == 0, done.stderr[-3000:]
        got, expected = checkpoint_weights(damaged), checkpoint_weights(intact)
        assert sorted(got) == sorted(expected) and len(expected) >= 4
        for name in expected:
            np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert read_results(damaged)["global_step"] == 24


def test_the_evaluator_of_a_finished_run_ends_without_train_steps(tmp_path, sixteen_steps):
    model_dir = str(tmp_path / "run")
    shutil.copytree(sixteen_steps, model_dir)
    started = time.monotonic()
    # --train_steps unset: its default (600) is not the run's 16, which config.json records.
    done = run_module(
        "loops.bin.classifier",
        "--mode=evaluate_checkpoints",
        f"--model_dir={model_dir}",
        "--evaluator_timeout=120",
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert time.monotonic() - started < 110  # ended, not timed out
    assert "evaluator: the run ended at step 16" in done.stdout
    assert "up to step 16" in done.stdout


def binary_error(*argv, cwd=None):
    """Runs loops-classifier with argv; returns (exit code, its last stderr line, seconds)."""
    started = time.monotonic()
    done = run_module("loops.bin.classifier", *argv, timeout=60)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return done.returncode, lines[-1] if lines else "", time.monotonic() - started


def test_profile_steps_past_train_steps_are_refused_before_tensorflow(tmp_path):
    code, line, seconds = binary_error(
        "--profile_steps=10,20", "--train_steps=16", f"--model_dir={tmp_path}/run"
    )
    assert code == 1 and seconds < 30
    assert line == (
        "--profile_steps=10,20 ends past --train_steps=16, so its trace would never be "
        "written in full; pass steps within the run (END <= 16) or a larger --train_steps."
    )
    assert not os.path.exists(tmp_path / "run")


def test_profile_steps_a_train_call_cannot_reach_are_said():
    said = []
    profiler = StepProfiler((10, 20), "/unused", say=said.append)
    profiler.check_reachable(0, 30)  # within: nothing said
    profiler.check_reachable(12, 30)  # resumed past the start
    profiler.check_reachable(0, 16)  # ends past this call's last step
    assert said == [
        "warning: profile_steps=(10, 20) is not within the steps this train runs (13 to 30): "
        "nothing is traced; pass profile_steps inside them (--profile_steps=START,END).",
        "warning: profile_steps=(10, 20) is not within the steps this train runs (1 to 16): "
        "the trace stops at step 16; pass profile_steps inside them (--profile_steps=START,END).",
    ]


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory on a read-only bind mount (the test runs as root, as CI does)."""
    directory = tmp_path / "read_only"
    directory.mkdir()
    subprocess.run(["mount", "--bind", str(directory), str(directory)], check=True)
    try:
        subprocess.run(
            ["mount", "-o", "remount,ro,bind", str(directory)], check=True, capture_output=True
        )
        yield str(directory)
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def test_an_export_dir_on_a_read_only_file_system_is_refused_before_training(
    tmp_path, read_only_dir
):
    export_dir = os.path.join(read_only_dir, "export")
    code, line, seconds = binary_error(f"--model_dir={tmp_path}/run", f"--export_dir={export_dir}")
    assert code == 1 and seconds < 30
    assert line == (
        f"--export_dir={export_dir} cannot be written ({read_only_dir} is read-only or not "
        "writable by this user), so the export at the end of training would fail after the "
        "work; pass a writable --export_dir."
    )
    assert not os.path.exists(tmp_path / "run")


def flagfile(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return str(path)


def refusal(*arguments):
    with pytest.raises(ValueError) as raised:
        flagfiles.check_flagfiles(arguments)
    return str(raised.value)


def test_flagfiles_that_do_not_read_as_settings_are_sentences(tmp_path):
    latin = flagfile(tmp_path, "latin.flags", "--model_dir=/tmp/caf\xe9\n".encode("latin-1"))
    assert refusal(f"--flagfile={latin}") == (
        f"--flagfile={latin} is not UTF-8 text (byte 0xe9 at offset 20 does not decode); "
        "save it as UTF-8 text, one --flag=value a line."
    )
    utf16 = flagfile(tmp_path, "utf16.flags", "--train_steps=5\n".encode("utf-16"))
    assert refusal("--flagfile", utf16) == (
        f"--flagfile={utf16} is UTF-16 text; save it as UTF-8 text, one --flag=value a line."
    )
    binary = flagfile(tmp_path, "binary.flags", b"\x7fELF\x02\x01\x00\x00")
    assert refusal(f"--flagfile={binary}") == (
        f"--flagfile={binary} holds binary data (a NUL byte at offset 6), not --flag=value "
        "lines; save it as UTF-8 text, one --flag=value a line."
    )
    missing = str(tmp_path / "missing.flags")
    assert refusal(f"--flagfile={missing}") == (
        f"--flagfile={missing} does not read (No such file or directory); give the path of a "
        "readable file of --flag=value lines."
    )


def test_flagfile_cycles_and_empty_values_are_sentences(tmp_path, monkeypatch):
    first, second = str(tmp_path / "a.flags"), str(tmp_path / "b.flags")
    flagfile(tmp_path, "a.flags", f"# run settings\n--train_steps=5\n--flagfile={second}\n")
    flagfile(tmp_path, "b.flags", f"--flagfile={first}\n")
    assert refusal(f"--flagfile={first}") == (
        f"--flagfile={first} includes itself ({first} -> {second} -> {first}); a flagfile may "
        "include other files, never one that includes it: remove that --flagfile line."
    )
    itself = flagfile(tmp_path, "self.flags", "--flagfile=self.flags\n")
    monkeypatch.chdir(tmp_path)  # absl reads an included relative path from the working directory
    assert "includes itself" in refusal(f"--flagfile={itself}")
    empty = flagfile(tmp_path, "empty.flags", "\n--model_dir=\n")
    assert refusal(f"--flagfile={empty}") == (
        f"--flagfile={empty}, line 2 sets --model_dir to an empty value ('--model_dir='); give "
        "the value, or remove the line to take the default."
    )
    assert refusal("--flagfile=") == (
        "the command line has --flagfile with no file name; give the file "
        "(--flagfile=run.flags) or drop it."
    )
    good = flagfile(tmp_path, "good.flags", "// comment\n--train_steps=5\n\n--flagfile=c.flags\n")
    flagfile(tmp_path, "c.flags", "--model=cnn\n")
    flagfiles.check_flagfiles([f"--flagfile={good}", "--train_steps=6"])  # no error


def test_a_binary_flagfile_stops_the_binary_with_its_sentence(tmp_path):
    binary = flagfile(tmp_path, "binary.flags", b"\xff\xd8\xff\xe0\x00\x10JFIF")
    code, line, seconds = binary_error(f"--flagfile={binary}")
    assert code == 1 and seconds < 30
    assert line == (
        f"error: --flagfile={binary} holds binary data (a NUL byte at offset 4), not "
        "--flag=value lines; save it as UTF-8 text, one --flag=value a line."
    )


# A one-worker MultiWorkerMirroredStrategy in a process of its own (its collectives would
# stay in the test process) asked for background checkpoints.
ASYNC_UNDER_A_CLUSTER_STRATEGY = """
import sys
import keras, tensorflow as tf
import loops
strategy = tf.distribute.MultiWorkerMirroredStrategy()
class Regression(loops.Loop):
    def build(self):
        self.model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        self.optimizer = keras.optimizers.SGD(0.1)
        self.optimizer.build(self.model.trainable_variables)
        self.update = loops.Update(self, self.optimizer, self.model)
    def checkpoint_items(self):
        return {"model": self.model, "optimizer": self.optimizer}
    def replica_loss(self, x, y):
        count = loops.global_count(tf.shape(y)[0])
        error = tf.squeeze(self.model(x, training=True), -1) - y
        return loops.scale_to_global_batch(error**2, count), {}
    def train_step(self, iterator):
        result = self.update(self.replica_loss, args=next(iterator))
        return {"loss": loops.Mean(result.sums["loss"]), **result.outputs}
x = tf.random.normal([20, 3], seed=1)
y = tf.reduce_sum(x, axis=1)
progress = loops.testing.quiet_progress()
trainer = loops.Trainer(Regression(), strategy=strategy,
    train_data=tf.data.Dataset.from_tensor_slices((x, y)).batch(10), steps_per_loop=2,
    model_dir=sys.argv[1], async_checkpoints=True, checkpoint_every=2,
    progress=progress)
trainer.train(4)
trainer.close()
print(progress.stream.getvalue())
"""


def test_async_checkpoints_under_a_cluster_strategy_are_said_to_be_synchronous(tmp_path):
    done = run_python(ASYNC_UNDER_A_CLUSTER_STRATEGY, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    note = (
        "note: async_checkpoints does not apply under the multi_worker_mirrored strategy "
        "(every worker takes part in a save's collectives): checkpoints are written "
        "synchronously"
    )
    assert done.stdout.count(note) == 1, done.stdout
    assert sorted(os.listdir(tmp_path / "checkpoints"))[:2] == [
        "checkpoint",
        "ckpt-2.data-00000-of-00001",
    ]
