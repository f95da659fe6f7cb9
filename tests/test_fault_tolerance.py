"""Preemption, kill -9 and concurrent use of a model_dir lose nothing a user wrote."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT, checkpoint_weights, read_results
from conftest import SUBPROCESS_ENV as ENV
from loops.vocabulary import exit_codes


def classifier(model_dir, digits_dir, *extra):
    return [
        sys.executable,
        "-m",
        "loops.bin.classifier",
        f"--model_dir={model_dir}",
        f"--data_dir={digits_dir}",
        "--train_steps=400",
        "--steps_per_loop=20",
        "--num_replicas=2",
        *extra,
    ]


def finish(command):
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def start_and_wait_for(command, text):
    """Starts `command` and returns it once a stdout line contains `text`."""
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=ENV, cwd=ROOT
    )
    deadline = time.time() + 300
    for line in process.stdout:
        if text in line:
            return process
        assert time.time() < deadline, f"no line with {text!r} in time"
    raise AssertionError(f"the run ended (code {process.wait()}) before printing {text!r}")


def assert_same_weights(model_dir, reference_dir):
    got, expected = checkpoint_weights(model_dir), checkpoint_weights(reference_dir)
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, digits_dir):
    model_dir = str(tmp_path_factory.mktemp("uninterrupted"))
    finish(classifier(model_dir, digits_dir))
    return model_dir


# SIGTERM: Kubernetes and most managers; SIGUSR1: SLURM's `--signal=USR1@90` warning.
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["TERM", "USR1"])
def test_a_preemption_signal_saves_at_the_next_boundary_and_a_rerun_finishes_the_same(
    tmp_path, digits_dir, uninterrupted, signum
):
    model_dir = str(tmp_path)
    process = start_and_wait_for(classifier(model_dir, digits_dir), "step 100/400")
    process.send_signal(signum)
    output = process.stdout.read()
    assert process.wait(timeout=120) == exit_codes.PREEMPTED == 42
    said = f"preempted ({signal.Signals(signum).name}) at step "
    assert said in output
    stopped_at = int(output.split(said)[1].split(":")[0])
    assert 100 <= stopped_at < 400 and stopped_at % 20 == 0
    results = read_results(model_dir)
    assert results["preempted"] is True and results["global_step"] == stopped_at
    assert tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints")).endswith(
        f"ckpt-{stopped_at}"
    )

    rerun = finish(classifier(model_dir, digits_dir))
    assert f"at step {stopped_at}" in rerun.stdout
    assert read_results(model_dir)["global_step"] == 400
    assert_same_weights(model_dir, uninterrupted)


def test_kill_9_mid_run_restarts_from_the_newest_complete_checkpoint(
    tmp_path, digits_dir, uninterrupted
):
    model_dir = str(tmp_path)
    command = classifier(model_dir, digits_dir, "--checkpoint_every=20")
    process = start_and_wait_for(command, "step 160/400")
    process.kill()
    process.wait(timeout=60)
    rerun = finish(command)
    assert "restored" in rerun.stdout
    assert_same_weights(model_dir, uninterrupted)


def test_a_second_run_on_a_live_model_dir_is_refused(tmp_path, digits_dir):
    model_dir = str(tmp_path)
    first = start_and_wait_for(
        classifier(model_dir, digits_dir, "--train_steps=100000"), "step 20/"
    )
    # Stopped, it keeps its lock and leaves the cores to the second run.
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = subprocess.run(
            classifier(model_dir, digits_dir),
            capture_output=True,
            text=True,
            env=ENV,
            timeout=300,
            cwd=ROOT,
        )
        assert second.returncode != 0
        assert f"is in use by another live run (pid {first.pid}" in second.stderr
    finally:
        first.kill()
        first.wait(timeout=60)
    # The kernel released the lock with the killed process: the directory is usable again.
    finish(classifier(model_dir, digits_dir, "--train_steps=40"))
