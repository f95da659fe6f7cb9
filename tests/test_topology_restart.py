"""A run restarted on another topology continues exactly: saved by 2 workers x 1 replica, it
goes on in 1 process with 4 or 3 replicas (the same global batch) to the numbers of the run
that never stopped. A different global batch size cannot be exact: refused unless allowed,
and then recorded."""

import os
import shutil
import sys

import numpy as np
import pytest
from absl import app, flags
from absl.testing import flagsaver
from test_launch import train_scalars

from conftest import ROOT, OutputRun, checkpoint_weights, read_results
from loops.bin import classifier as classifier_binary
from loops.testing import relative_error

ENV = {
    name: value
    for name, value in os.environ.items()
    if name not in ("TF_CONFIG", "LOOPS_CLUSTER_FOUND_BY")
}
ENV["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
RTOL = 1e-5
HALF, STEPS = 200, 400


def classifier(model_dir, digits_dir, train_steps, *extra):
    return [
        "loops.bin.classifier",
        f"--model_dir={model_dir}",
        f"--data_dir={digits_dir}",
        f"--train_steps={train_steps}",
        "--steps_per_loop=20",
        "--global_batch_size=64",
        *extra,
    ]


def two_workers(command):
    return OutputRun(
        [
            sys.executable,
            "-m",
            "loops.cluster.launch",
            "--num_workers=2",
            "--grace_period=5",
            "--",
            command[0],
            "--strategy=multi_worker_mirrored",
            "--num_replicas=1",
            *command[1:],
        ],
        ENV,
    )


def one_process(command, replicas):
    strategy = "default" if replicas == 1 else "mirrored"
    return OutputRun(
        [sys.executable, "-m", *command, f"--strategy={strategy}", f"--num_replicas={replicas}"],
        ENV,
    )


def classifier_in_process(*argv):
    """The classifier binary's main in this process (one replica: --strategy=default)."""
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        rest = flags.FLAGS(["loops-classifier", *argv, "--strategy=default", "--num_replicas=1"])
        classifier_binary.main(rest)


def largest_weight_difference(model_dir, reference_dir):
    got, expected = checkpoint_weights(model_dir), checkpoint_weights(reference_dir)
    assert sorted(got) == sorted(expected) and len(expected) >= 10
    return max(relative_error(got[name], expected[name]) for name in expected)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, digits_dir):
    """The classifier's model_dir after STEPS in one process with 2 replicas, never stopped."""
    model_dir = str(tmp_path_factory.mktemp("uninterrupted"))
    one_process(classifier(model_dir, digits_dir, STEPS), 2).succeed()
    return model_dir


@pytest.fixture(scope="module")
def saved_by_two_workers(tmp_path_factory, digits_dir):
    """The classifier's model_dir after HALF steps on 2 workers x 1 replica: the same run for
    every topology it continues on, so each test continues a copy of it."""
    model_dir = str(tmp_path_factory.mktemp("two_workers"))
    two_workers(classifier(model_dir, digits_dir, HALF)).succeed()
    return model_dir


@pytest.mark.parametrize("replicas", [4, 3])
def test_a_run_saved_by_two_workers_continues_on_one_process_exactly(
    replicas, tmp_path, digits_dir, uninterrupted, saved_by_two_workers
):
    model_dir = str(tmp_path / "run")
    shutil.copytree(saved_by_two_workers, model_dir)
    assert read_results(model_dir)["num_replicas"] == 2
    run = one_process(classifier(model_dir, digits_dir, STEPS), replicas).succeed()
    assert f"restored {model_dir}" in run.output and f"at step {HALF}" in run.output
    # The topology is free to change: no warning about it.
    assert "warning" not in run.output, run.output[-3000:]
    got, expected = read_results(model_dir), read_results(uninterrupted)
    assert got["num_replicas"] == replicas and got["global_step"] == STEPS
    assert got["eval"]["loss"] == pytest.approx(expected["eval"]["loss"], rel=RTOL)
    assert got["eval"]["accuracy"] == expected["eval"]["accuracy"] >= 0.9
    difference = largest_weight_difference(model_dir, uninterrupted)
    print(
        f"2 workers, then {replicas} replicas: largest relative weight difference {difference:.2g}"
    )
    assert difference <= RTOL


def gan(model_dir, train_steps):
    return [
        "loops.bin.gan",
        f"--model_dir={model_dir}",
        "--gan_loss=wgan_gp",
        "--n_critic=2",
        f"--train_steps={train_steps}",
        "--global_batch_size=64",
        "--steps_per_loop=1",
        "--seed=3",
    ]


def test_a_gan_saved_by_two_workers_continues_on_four_replicas_exactly(tmp_path):
    model_dir, reference_dir = str(tmp_path / "restarted"), str(tmp_path / "reference")
    reference = one_process(gan(reference_dir, 12), 2)
    two_workers(gan(model_dir, 6)).succeed(timeout=300)
    reference.succeed(timeout=300)
    run = one_process(gan(model_dir, 12), 4).succeed(timeout=300)
    assert "warning" not in run.output, run.output[-3000:]
    assert read_results(model_dir)["num_replicas"] == 4
    # Every step's losses, the first 6 by 2 workers and the rest by 4 replicas.
    losses, expected_losses = train_scalars(model_dir), train_scalars(reference_dir)
    assert sorted(losses) == sorted(expected_losses) and losses
    for tag, by_step in expected_losses.items():
        assert sorted(losses[tag]) == sorted(by_step) == list(range(1, 13))
        np.testing.assert_allclose(
            [losses[tag][step] for step in sorted(by_step)],
            [by_step[step] for step in sorted(by_step)],
            rtol=RTOL,
            atol=1e-7,
            err_msg=tag,
        )
    got, expected = checkpoint_weights(model_dir), checkpoint_weights(reference_dir)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=RTOL, atol=1e-7, err_msg=name)


def test_another_global_batch_size_is_refused_before_tensorflow_unless_allowed_then_recorded(
    tmp_path, digits_dir
):
    model_dir = str(tmp_path)
    one_process(classifier(model_dir, digits_dir, 40, "--steps_per_loop=20"), 1).succeed()
    checkpoints = sorted(os.listdir(os.path.join(model_dir, "checkpoints")))
    results = read_results(model_dir)

    refused = one_process([*classifier(model_dir, digits_dir, 80), "--global_batch_size=32"], 1)
    assert refused.finish() == 1
    assert refused.lines[-1] == (
        f"error: --global_batch_size=32 differs from 64, the global_batch_size of the run in "
        f"{model_dir}: a resume continues exactly only with the same global_batch_size (the "
        "workers and replicas may change). Pass --global_batch_size=64, or "
        "--allow_batch_size_change to go on with 32 (recorded in results.json), or a new "
        "--model_dir."
    )
    assert "restored" not in refused.output  # refused before TensorFlow built anything
    assert sorted(os.listdir(os.path.join(model_dir, "checkpoints"))) == checkpoints
    assert read_results(model_dir) == results

    # The checkpoint records the batch size too: config.json deleted, damaged, or holding a
    # string, the resume is refused all the same (once the checkpoint is read), and nothing
    # is written. In this process: the refusal is a usage error (exit 1, as above), and
    # three more TensorFlow start-ups would cost 15 s each.
    config_path = os.path.join(model_dir, "config.json")
    with open(config_path) as stream:
        config_text = stream.read()
    for damage in (None, "{garbage", '{"global_batch_size": "64"}'):
        if os.path.exists(config_path):
            os.remove(config_path)
        if damage is not None:
            with open(config_path, "w") as stream:
                stream.write(damage)
        with pytest.raises(app.UsageError) as refused_here:
            classifier_in_process(
                *classifier(model_dir, digits_dir, 80)[1:], "--global_batch_size=32"
            )
        assert refused_here.value.exitcode == 1, damage
        assert str(refused_here.value) == (
            f"--global_batch_size=32 differs from 64, the global_batch_size of the run in "
            f"{model_dir}: a resume continues exactly only with the same global_batch_size (the "
            "workers and replicas may change). Pass --global_batch_size=64, or "
            "--allow_batch_size_change to go on with 32 (recorded in results.json), or a new "
            "--model_dir."
        ), damage
        assert sorted(os.listdir(os.path.join(model_dir, "checkpoints"))) == checkpoints
        assert read_results(model_dir) == results
    with open(config_path, "w") as stream:
        stream.write(config_text)

    allowed = [*classifier(model_dir, digits_dir, 80), "--global_batch_size=32"]
    one_process([*allowed, "--allow_batch_size_change"], 1).succeed()
    got = read_results(model_dir)
    assert got["global_step"] == 80
    assert got["config"]["changed_on_resume"] == {
        "global_batch_size": {"was": 64, "now": 32, "at_step": 40}
    }
