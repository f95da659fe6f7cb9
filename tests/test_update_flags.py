"""--mixed_precision, --clip_norm, --grad_accum_steps and --on_nonfinite on every binary."""

import os

import pytest
import tensorflow as tf

from conftest import read_results, run_module

INITIAL_SCALE = 2.0**15
SHORT_RUNS = {
    "classifier": ["--train_steps=4", "--steps_per_loop=2"],
    "gan": ["--train_steps=4", "--steps_per_loop=2"],
    "rl": ["--algorithm=dqn", "--train_steps=4", "--steps_per_loop=2", "--learning_starts=16"],
    "lm": [
        "--train_steps=4",
        "--steps_per_loop=2",
        "--sequence_length=32",
        "--width=32",
        "--num_layers=1",
        "--num_heads=2",
        "--sample_length=4",
    ],
}
# The loss scales each binary keeps (one per optimizer), as step outputs.
LOSS_SCALE_OUTPUTS = {
    "classifier": ["loss_scale"],
    "gan": ["d_loss_scale", "g_loss_scale"],
    "rl": ["loss_scale"],
    "lm": ["loss_scale"],
}


def run_binary(binary, model_dir, *argv, data=()):
    return run_module(
        f"loops.bin.{binary}", f"--model_dir={model_dir}", *SHORT_RUNS[binary], *data, *argv
    )


@pytest.mark.parametrize("binary", sorted(SHORT_RUNS))
def test_float16_with_clipping_trains_every_binary_and_checkpoints_its_loss_scales(
    binary, tmp_path, digits_dir
):
    data = [f"--data_dir={digits_dir}"] if binary == "classifier" else []
    done = run_binary(
        binary, tmp_path, "--mixed_precision=mixed_float16", "--clip_norm=1.0", data=data
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(tmp_path)
    assert results["global_step"] == 4 and results["skipped_steps"] == 0
    assert results["config"]["mixed_precision"] == "mixed_float16"
    assert results["config"]["clip_norm"] == 1.0
    for name in LOSS_SCALE_OUTPUTS[binary]:
        assert results["train"][name] == INITIAL_SCALE, (name, results["train"])
    saved = {
        name
        for name, _ in tf.train.list_variables(
            tf.train.latest_checkpoint(os.path.join(tmp_path, "checkpoints"))
        )
    }
    scales = sorted(name.split("/")[0] for name in saved if "/scale/" in name)
    expected = {
        "classifier": ["loss_scale"],
        "gan": ["discriminator_loss_scale", "generator_loss_scale"],
        "rl": ["loss_scale"],
        "lm": ["loss_scale"],
    }[binary]
    assert scales == expected, sorted(saved)


@pytest.mark.parametrize("binary", ["classifier", "gan", "lm"])
def test_grad_accum_steps_runs_from_the_flags(binary, tmp_path, digits_dir):
    data = [f"--data_dir={digits_dir}"] if binary == "classifier" else []
    done = run_binary(binary, tmp_path, "--grad_accum_steps=3", data=data)
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(tmp_path)
    assert results["config"]["grad_accum_steps"] == 3
    assert results["global_step"] == 4


def test_rl_refuses_gradient_accumulation_with_a_sentence(tmp_path):
    done = run_binary("rl", tmp_path, "--grad_accum_steps=2")
    assert done.returncode != 0
    assert "DQNLoop does not accumulate gradients (got grad_accum_steps=2)" in done.stderr
    assert "Leave grad_accum_steps at 1" in done.stderr
    assert not os.path.exists(os.path.join(tmp_path, "checkpoints"))


@pytest.mark.parametrize("binary", sorted(SHORT_RUNS))
def test_a_bad_clip_norm_is_refused_by_every_binary(binary, tmp_path):
    done = run_binary(binary, tmp_path, "--clip_norm=0")
    assert done.returncode != 0
    assert "--clip_norm must be > 0" in done.stderr
