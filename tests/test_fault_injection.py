"""SIGTERM and kill -9 at each moment of a run: a rerun finishes with the uninterrupted weights."""

import concurrent.futures
import glob
import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import (
    ROOT,
    built_once_for_all_workers,
    checkpoint_weights,
    logged_run,
    read_results,
    run_logged,
)
from loops.vocabulary import exit_codes

FLAGS = [
    "--train_steps=8",
    "--steps_per_loop=2",
    "--eval_every=4",
    "--num_replicas=2",
    "--global_batch_size=32",
]


def binary(model_dir, digits_dir, *extra):
    return [
        "-m",
        "loops.bin.classifier",
        f"--model_dir={model_dir}",
        f"--data_dir={digits_dir}",
        *FLAGS,
        *extra,
    ]


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


def trial_id(moment, signal_name):
    return f"{moment}-{signal_name}"


def extra_flags(moment):
    return ["--checkpoint_every=4", "--async_checkpoints"] if moment.startswith("async") else []


def run_trial(folder, digits_dir, moment, signal_name):
    """The interrupted run, a copy of its model_dir as the fault left it, then the rerun."""
    trial = os.path.join(folder, trial_id(moment, signal_name))
    model_dir, extra = os.path.join(trial, "run"), extra_flags(moment)
    fault_run = os.path.join(ROOT, "tests", "fault_run.py")
    command = [fault_run, moment, signal_name, *binary(model_dir, digits_dir, *extra)[2:]]
    run_logged([sys.executable, *command], os.path.join(trial, "interrupted"))
    shutil.copytree(model_dir, os.path.join(trial, "after_fault"))
    run_logged([sys.executable, *binary(model_dir, digits_dir, *extra)], f"{trial}/rerun")


# Trials run at once: each process mostly imports TensorFlow and traces, using a core; more
# at once than the CI's 2 cores only add their switching (measured: benchmarks/RESULTS.md,
# "The suite's time").
AT_ONCE = 2


@pytest.fixture(scope="module")
def trials(tmp_path_factory, digits_dir):
    """The folder holding, for each trial, its interrupted run's and rerun's outputs and
    model_dirs, and the uninterrupted run's model_dir."""

    def build(folder):
        def uninterrupted():
            command = binary(os.path.join(folder, "uninterrupted"), digits_dir)
            run_logged([sys.executable, *command], os.path.join(folder, "uninterrupted"))

        with concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
            started = [pool.submit(uninterrupted)]
            for moment, signal_name, _ in TRIALS:
                os.makedirs(os.path.join(folder, trial_id(moment, signal_name)))
                started.append(pool.submit(run_trial, folder, digits_dir, moment, signal_name))
            for future in started:
                future.result()  # raises what a thread raised

    return built_once_for_all_workers(tmp_path_factory, "fault_injection", build)


@pytest.mark.parametrize(
    "moment, signal_name, code", TRIALS, ids=[f"{moment}-{name}" for moment, name, _ in TRIALS]
)
def test_a_fault_at_any_moment_loses_no_completed_step(trials, moment, signal_name, code):
    uninterrupted = os.path.join(trials, "uninterrupted")
    done = logged_run(uninterrupted)
    assert done.returncode == 0, done.stderr[-3000:]
    trial = os.path.join(trials, trial_id(moment, signal_name))
    model_dir, after_fault = os.path.join(trial, "run"), os.path.join(trial, "after_fault")
    interrupted = logged_run(os.path.join(trial, "interrupted"))
    assert interrupted.returncode == code, interrupted.stderr[-3000:]
    if moment == "outputs":
        assert "SIGTERM after training finished: every step is saved; finishing the report" in (
            interrupted.stderr
        )
        assert "preempted" not in interrupted.stderr and "outputs in " in interrupted.stdout
        assert read_results(after_fault)["preempted"] is False
    written = checkpoint_steps(after_fault)
    if moment == "async_write_first":
        # The save in flight at step 4 finished, then the next boundary's save, then exit 42.
        stopped_at = read_results(after_fault)["global_step"]
        assert written[0] == 4 and written[-1] == stopped_at and 4 <= stopped_at <= 8
    elif moment == "async_write_final":
        assert written == [4]  # the step-8 save never finished: step 4's is in charge
    if signal_name == "TERM" and code == exit_codes.PREEMPTED:
        assert "preempted (SIGTERM) at step" in interrupted.stdout
        stopped_at = int(interrupted.stdout.split("preempted (SIGTERM) at step ")[1].split(":")[0])
        assert read_results(after_fault)["global_step"] == stopped_at
        assert read_results(after_fault)["preempted"] is True

    rerun = logged_run(os.path.join(trial, "rerun"))
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
