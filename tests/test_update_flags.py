"""--mixed_precision, --clip_norm, --grad_accum_steps, --ema_decay and --on_nonfinite on every
binary."""

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
        binary,
        tmp_path,
        "--mixed_precision=mixed_float16",
        "--clip_norm=1.0",
        "--ema_decay=0.5",
        data=data,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(tmp_path)
    assert results["global_step"] == 4 and results["skipped_steps"] == 0
    assert results["config"]["mixed_precision"] == "mixed_float16"
    assert results["config"]["clip_norm"] == 1.0
    for name in LOSS_SCALE_OUTPUTS[binary]:
        assert results["train"][name] == INITIAL_SCALE, (name, results["train"])
    assert results["config"]["ema_decay"] == 0.5
    # Throughput in each binary's unit, over the same inner loops as steps/s.
    unit, per_step = {
        "classifier": ("examples", 64),
        "gan": ("examples", 512),
        "rl": ("env_steps", results.get("num_envs", 0) * results.get("rollout_length", 0)),
        "lm": ("tokens", None),  # real tokens: fewer than 32 x 32 a step
    }[binary]
    rate = results[f"{unit}_per_second"]
    if per_step is None:
        assert 32 <= rate / results["steps_per_second"] <= 32 * 32
    else:
        assert per_step > 0 and rate == pytest.approx(per_step * results["steps_per_second"])
    assert f" {unit}/s | " in done.stdout
    checkpoint = tf.train.latest_checkpoint(os.path.join(tmp_path, "checkpoints"))
    saved = {name for name, _ in tf.train.list_variables(checkpoint)}
    # One average, of the network evaluation and the export use (the GAN's
    # generator), moved by every applied update: DQN makes 2 a step (updates_per_step).
    updates = tf.train.load_variable(
        checkpoint, "weight_averages/updates/0/num_updates/.ATTRIBUTES/VARIABLE_VALUE"
    )
    assert updates == {"classifier": 4, "gan": 4, "rl": 8, "lm": 4}[binary]
    assert not any(name.startswith("weight_averages/updates/1/") for name in saved)
    # Saved by the loop for every Update, without the binary's loop listing them.
    scales = sorted(name.split("/scale/")[0] for name in saved if "/scale/" in name)
    expected = [
        f"update_states/loss_scales/{index}" for index in range(len(LOSS_SCALE_OUTPUTS[binary]))
    ]
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
