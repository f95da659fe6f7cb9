"""SIGTERM and kill -9 at each moment of a run: a rerun finishes with the uninterrupted weights."""

import glob
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT, checkpoint_weights, read_results
from conftest import SUBPROCESS_ENV as ENV
from loops.vocabulary import exit_codes

FLAGS = [
    "--train_steps=8",
    "--steps_per_loop=2",
    "--eval_every=4",
    "--num_replicas=2",
    "--global_batch_size=32",
]


def run(arguments):
    return subprocess.run(
        [sys.executable, *arguments], capture_output=True, text=True, env=ENV, timeout=600, cwd=ROOT
    )


def binary(model_dir, digits_dir, *extra):
    return [
        "-m",
        "loops.bin.classifier",
        f"--model_dir={model_dir}",
        f"--data_dir={digits_dir}",
        *FLAGS,
        *extra,
    ]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, digits_dir):
    model_dir = str(tmp_path_factory.mktemp("uninterrupted"))
    done = run(binary(model_dir, digits_dir))
    assert done.returncode == 0, done.stderr[-3000:]
    return model_dir


# moment, signal, the interrupted run's exit code.
TRIALS = [
    ("first_trace", "TERM", exit_codes.PREEMPTED),
    ("inner_loop", "TERM", exit_codes.PREEMPTED),
    ("evaluation", "TERM", exit_codes.PREEMPTED),
    ("final_evaluation", "TERM", exit_codes.PREEMPTED),
    ("final_save", "TERM", exit_codes.PREEMPTED),
    ("results", "TERM", exit_codes.PREEMPTED),
    ("export", "TERM", 0),  # the run had finished: the export completes
    ("outputs", "TERM", 0),  # after train returned: said, and the run is complete
    ("inner_loop", "KILL", -9),
    ("state_file", "KILL", -9),
    ("results", "KILL", -9),
    ("export", "KILL", -9),
    # Checkpoints written in the background (every 4 steps here): a kill while one is
    # written leaves the one before in charge; SIGTERM lets it finish, then saves and exits.
    ("async_write_first", "TERM", exit_codes.PREEMPTED),
    ("async_write_final", "KILL", -9),
]


def checkpoint_steps(model_dir):
    """The steps of the complete checkpoints the state file lists, oldest first."""
    state = tf.train.get_checkpoint_state(os.path.join(model_dir, "checkpoints"))
    paths = list(state.all_model_checkpoint_paths) if state else []
    assert all(os.path.exists(path + ".index") for path in paths), paths
    return [int(path.rsplit("-", 1)[1]) for path in paths]


@pytest.mark.parametrize(
    "moment, signal_name, code", TRIALS, ids=[f"{moment}-{name}" for moment, name, _ in TRIALS]
)
def test_a_fault_at_any_moment_loses_no_completed_step(
    tmp_path, digits_dir, uninterrupted, moment, signal_name, code
):
    model_dir = str(tmp_path / "run")
    extra = ["--checkpoint_every=4", "--async_checkpoints"] if moment.startswith("async") else []
    interrupted = run(
        [
            os.path.join(ROOT, "tests", "fault_run.py"),
            moment,
            signal_name,
            *binary(model_dir, digits_dir, *extra)[2:],
        ]
    )
    assert interrupted.returncode == code, interrupted.stderr[-3000:]
    if moment == "outputs":
        assert "SIGTERM after training finished: every step is saved; finishing the report" in (
            interrupted.stderr
        )
        assert "preempted" not in interrupted.stderr and "outputs in " in interrupted.stdout
        assert read_results(model_dir)["preempted"] is False
    written = checkpoint_steps(model_dir)
    if moment == "async_write_first":
        # The save in flight at step 4 finished, then the next boundary's save, then exit 42.
        stopped_at = read_results(model_dir)["global_step"]
        assert written[0] == 4 and written[-1] == stopped_at and 4 <= stopped_at <= 8
    elif moment == "async_write_final":
        assert written == [4]  # the step-8 save never finished: step 4's is in charge
    if signal_name == "TERM" and code == exit_codes.PREEMPTED:
        assert "preempted (SIGTERM) at step" in interrupted.stdout
        stopped_at = int(interrupted.stdout.split("preempted (SIGTERM) at step ")[1].split(":")[0])
        assert read_results(model_dir)["global_step"] == stopped_at
        assert read_results(model_dir)["preempted"] is True

    rerun = run(binary(model_dir, digits_dir, *extra))
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    results = read_results(model_dir)
    assert results["global_step"] == 8 and results["preempted"] is False
    got, expected = checkpoint_weights(model_dir), checkpoint_weights(uninterrupted)
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert np.all(np.isfinite(got[name])), name
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)
    assert os.path.isfile(os.path.join(model_dir, "export", "saved_model.pb"))
    leftovers = [
        path
        for pattern in ("**/*_temp", "**/.export-*", "**/.results.*", "**/.*.tmp", ".lock")
        for path in glob.glob(os.path.join(model_dir, pattern), recursive=True)
    ]
    assert leftovers == []
