"""on_nonfinite='recover': back to the last checkpoint, past the batches that led to a
non-finite step, and on, to the weights of a run that never saw those batches."""

import glob
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import loops
import loops_models as models
from conftest import (
    ROOT,
    SUBPROCESS_ENV,
    checkpoint_weights,
    make_trainer,
    read_results,
    run_module,
)

BATCH = 8
# 24 global batches: no run here reads past the first pass, so each bad batch comes once.
EXAMPLES = 24 * BATCH


def examples(bad_batches=()):
    """Images and labels; batches numbered in `bad_batches` (from 1) hold an inf."""
    rng = np.random.default_rng(0)
    images = rng.uniform(0, 255, size=(EXAMPLES, 8, 8, 1)).astype(np.float32)
    labels = rng.integers(0, 10, size=(EXAMPLES,))
    for batch in bad_batches:
        # Row 6 of the batch: replica 1's rows at 2 replicas.
        images[(batch - 1) * BATCH + 6, 3, 3, 0] = np.inf
    return images, labels


def without_batches(images, labels, first, last):
    """The examples without batches first..last (numbered from 1)."""
    kept = np.ones(len(images), bool)
    kept[(first - 1) * BATCH : last * BATCH] = False
    return images[kept], labels[kept]


def stream(images, labels):
    return lambda: tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH)


def make_loop(train_data, num_replicas=2, definition_class=loops.ClassifierLoop, **kwargs):
    return make_trainer(
        definition_class,
        model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10, seed=2),
        optimizer_fn=lambda: keras.optimizers.Adam(0.01),
        strategy=loops.testing.replica_strategy(num_replicas),
        train_data=train_data,
        steps_per_loop=3,
        progress=loops.testing.quiet_progress(),
        **kwargs,
    )


def recovering(model_dir, bad_batches, **kwargs):
    return make_loop(
        stream(*examples(bad_batches)),
        on_nonfinite="recover",
        model_dir=str(model_dir),
        **kwargs,
    )


def checkpoint_values(prefix):
    reader = tf.train.load_checkpoint(prefix)
    return [reader.get_tensor(name) for name in reader.get_variable_to_shape_map()]


def recoveries_in_tensorboard(model_dir):
    """step -> the `train/recoveries` count TensorBoard holds for it."""
    return {
        event.step: float(tf.make_ndarray(value.tensor))
        for path in glob.glob(os.path.join(model_dir, "summaries", "train", "events.*"))
        for event in tf.compat.v1.train.summary_iterator(path)
        for value in event.summary.value
        if value.tag == "recoveries"
    }


def assert_checkpoints_finite(model_dir):
    indexes = glob.glob(os.path.join(model_dir, "checkpoints", "ckpt-*.index"))
    assert indexes
    for index in indexes:
        for value in checkpoint_values(index[: -len(".index")]):
            if np.issubdtype(np.asarray(value).dtype, np.floating):
                assert np.all(np.isfinite(value)), index


@pytest.mark.parametrize(
    "num_replicas, mixed_precision", [(1, "none"), (2, "none"), (2, "mixed_float16")]
)
def test_a_recovered_run_ends_with_the_weights_of_a_run_without_the_bad_batches(
    tmp_path, num_replicas, mixed_precision
):
    # Under float16 the inf makes the loss itself not finite: `nonfinite`, not an
    # overflow for the loss scale, so it recovers too.
    loop = recovering(
        tmp_path,
        [6],
        num_replicas=num_replicas,
        checkpoint_every=4,
        mixed_precision=mixed_precision,
    )
    logs = loop.train(12)
    # Step 6 read the inf: back to the checkpoint of step 4; steps 5, 6, ... then
    # read batches 7, 8, ...: batches 5 and 6 are left out.
    assert loop.controller.recoveries.entries == [
        {"step": 6, "restored_step": 4, "skipped_batches": 2, "cause": "nonfinite"}
    ]
    # The logs are those of the steps kept: 12, every one finite.
    assert logs["nonfinite"].tolist() == [0] * 12 and np.all(np.isfinite(logs["loss"]))
    never_bad = make_loop(
        stream(*without_batches(*examples(), 5, 6)),
        num_replicas,
        mixed_precision=mixed_precision,
    )
    never_bad.train(12)
    loops.testing.assert_close(
        loops.testing.loop_weights(loop),
        loops.testing.loop_weights(never_bad),
        rtol=1e-6,
        label="recovered vs never saw batches 5-6",
    )
    loop.close()
    assert_checkpoints_finite(str(tmp_path))


def test_results_tensorboard_and_progress_record_every_recovery(tmp_path):
    loop = recovering(tmp_path, [3, 6], checkpoint_every=2)
    loop.train(8)
    loop.close()
    # Batch 3 is step 3's; after moving past it, step k reads batch k + 1: batch 6 is step 5's.
    expected = [
        {"step": 3, "restored_step": 2, "skipped_batches": 1, "cause": "nonfinite"},
        {"step": 5, "restored_step": 4, "skipped_batches": 1, "cause": "nonfinite"},
    ]
    results = read_results(str(tmp_path))
    assert results["recoveries"] == expected and results["global_step"] == 8
    assert recoveries_in_tensorboard(tmp_path) == {3: 1.0, 5: 2.0}
    progress = loop.run_context.progress.stream.getvalue()
    assert (
        "step 3 was not finite: recovery 1 of at most 3, back at the checkpoint of step 2; "
        "the train stream moved past 1 batch (step 3's), and training goes on"
    ) in progress
    assert "step 5 was not finite: recovery 2 of at most 3" in progress


def test_past_max_recoveries_it_stops_with_the_error_and_keeps_finite_checkpoints(tmp_path):
    loop = recovering(tmp_path, [3, 6, 9], checkpoint_every=2, max_recoveries=2)
    # Steps 3 and 5 recover (batches 3 and 6); step 7 reads batch 9.
    with pytest.raises(
        loops.NonFiniteError,
        match=r"Step 7: the loss or the gradients were not finite on at least one replica, "
        r"and the run has recovered 2 times already \(max_recoveries=2; at steps 3, 5\), so "
        r"it stops\. .* back at its last checkpoint \(step 6\), where a rerun also resumes\. "
        r".* raise max_recoveries \(--max_recoveries\)",
    ):
        loop.train(12)
    assert loop.state.step == 6
    assert all(np.all(np.isfinite(w)) for w in loops.testing.loop_weights(loop).values())
    loop.close()
    assert_checkpoints_finite(str(tmp_path))
    # The count is checkpointed: a rerun stops at the same step, ...
    again = recovering(tmp_path, [3, 6, 9], checkpoint_every=2, max_recoveries=2)
    assert len(again.controller.recoveries.entries) == 2
    with pytest.raises(loops.NonFiniteError, match="Step 7: .* recovered 2 times already"):
        again.train(12)
    again.close()
    # ... and one allowed more recoveries goes on past batch 9.
    more = recovering(tmp_path, [3, 6, 9], checkpoint_every=2, max_recoveries=3)
    more.train(12)
    more.close()
    assert [entry["step"] for entry in read_results(str(tmp_path))["recoveries"]] == [3, 5, 7]


def test_a_resume_after_a_recovery_reads_on_where_the_recovered_run_did(tmp_path):
    uninterrupted = recovering(tmp_path / "uninterrupted", [6], checkpoint_every=4)
    uninterrupted.train(12)
    uninterrupted.close()
    model_dir = tmp_path / "resumed"
    first = recovering(model_dir, [6], checkpoint_every=4, max_checkpoints=5)
    first.train(8)  # recovers at step 6, saves at 8 with the stream moved 2 batches on
    first.close()
    resumed = recovering(model_dir, [6], checkpoint_every=4)
    assert resumed.state.step == 8 and len(resumed.controller.recoveries.entries) == 1
    resumed.train(12)
    resumed.close()
    loops.testing.assert_close(
        loops.testing.loop_weights(resumed),
        loops.testing.loop_weights(uninterrupted),
        rtol=1e-6,
        label="resumed after a recovery vs uninterrupted",
    )
    assert (
        read_results(str(model_dir))["recoveries"]
        == read_results(str(tmp_path / "uninterrupted"))["recoveries"]
    )
    # Resumed from the checkpoint before the recovery (the later ones lost), the
    # run meets batch 6 again and recovers from it once more: the same run, one recovery.
    for name in glob.glob(str(model_dir / "checkpoints" / "ckpt-*")):
        if not os.path.basename(name).startswith("ckpt-4."):
            os.remove(name)
    from_before = recovering(model_dir, [6], checkpoint_every=4)
    assert from_before.state.step == 4 and from_before.controller.recoveries.entries == []
    from_before.train(12)
    from_before.close()
    loops.testing.assert_close(
        loops.testing.loop_weights(from_before),
        loops.testing.loop_weights(uninterrupted),
        rtol=1e-6,
        label="resumed before the recovery vs uninterrupted",
    )
    assert len(read_results(str(model_dir))["recoveries"]) == 1


def test_a_checkpoint_from_before_the_recovery_record_restores_as_no_recovery(tmp_path):
    old = make_loop(stream(*examples()))
    old.train(4)
    # What a checkpoint held before the record existed: the loop's items and the step.
    tf.train.CheckpointManager(
        tf.train.Checkpoint(**old.definition.checkpoint_items(), global_step=old.global_step),
        str(tmp_path / "checkpoints"),
        max_to_keep=1,
    ).save(checkpoint_number=4)
    loop = recovering(tmp_path, [6], checkpoint_every=4)
    assert loop.state.step == 4 and loop.controller.recoveries.entries == []
    loops.testing.assert_close(
        loops.testing.loop_weights(loop), loops.testing.loop_weights(old), rtol=0, label="old"
    )
    loop.train(8)
    assert loop.controller.recoveries.entries == [
        {"step": 6, "restored_step": 4, "skipped_batches": 2, "cause": "nonfinite"}
    ]
    loop.close()
    assert "recoveries/record/.ATTRIBUTES/VARIABLE_VALUE" in dict(
        tf.train.list_variables(str(tmp_path / "checkpoints"))
    )


def test_a_run_without_a_checkpoint_saves_one_at_its_start_to_go_back_to(tmp_path):
    loop = recovering(tmp_path, [2])  # checkpoints only at the end
    loop.train(5)
    assert loop.controller.recoveries.entries == [
        {"step": 2, "restored_step": 0, "skipped_batches": 2, "cause": "nonfinite"}
    ]
    loop.close()
    never_bad = make_loop(stream(*without_batches(*examples(), 1, 2)))
    never_bad.train(5)
    loops.testing.assert_close(
        loops.testing.loop_weights(loop),
        loops.testing.loop_weights(never_bad),
        rtol=1e-6,
        label="recovered to step 0 vs never saw batches 1-2",
    )


class RunningSum(loops.Loop):
    """Adds each batch's sum to a variable, with no finiteness check of its own."""

    def build(self):
        self.total = tf.Variable(0.0)

    def checkpoint_items(self):
        return {"total": self.total}

    def train_step(self, iterator):
        sums = self.strategy.run(tf.reduce_sum, args=(next(iterator),))
        self.total.assign_add(self.strategy.reduce(tf.distribute.ReduceOp.SUM, sums, axis=None))
        return {"total": loops.Last(self.total.read_value())}


def test_weights_found_not_finite_after_an_inner_loop_recover_past_all_its_steps(tmp_path):
    values = np.arange(1.0, 25.0, dtype=np.float32)
    poisoned = values.copy()
    poisoned[4] = np.inf  # batch 5 (of 1 value): steps 5-7 are one inner loop

    def running_sum(data, **kwargs):
        return make_trainer(
            RunningSum,
            strategy=loops.testing.replica_strategy(1),
            train_data=lambda: tf.data.Dataset.from_tensor_slices(data).batch(1),
            steps_per_loop=3,
            progress=loops.testing.quiet_progress(),
            **kwargs,
        )

    loop = running_sum(
        poisoned, on_nonfinite="recover", model_dir=str(tmp_path), checkpoint_every=4
    )
    loop.train(10)
    # Only the weights show it, after the inner loop of steps 5-7: all three are undone.
    assert loop.controller.recoveries.entries == [
        {"step": 7, "restored_step": 4, "skipped_batches": 3, "cause": "nonfinite"}
    ]
    assert float(loop.definition.total.numpy()) == float(np.sum(values[:4]) + np.sum(values[7:13]))
    loop.close()


# ---- What recover needs, refused up front with the fix. ----


def test_recover_without_a_model_dir_is_refused():
    with pytest.raises(
        ValueError,
        match=r"on_nonfinite='recover' goes back to the last checkpoint, and ClassifierLoop "
        r"has model_dir=None, so it keeps none\. Pass model_dir=",
    ):
        make_loop(stream(*examples()), on_nonfinite="recover")


def test_recover_without_the_train_stream_a_loop_needs_is_refused(tmp_path):
    with pytest.raises(
        ValueError,
        match=r"Loop has no train_data\. Pass on_nonfinite='stop' or 'skip'",
    ):
        loops.Trainer(loops.Loop(), on_nonfinite="recover", model_dir=str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_recover_under_the_asynchronous_parameter_server_mode_is_refused():
    # Only the strategy's class name decides; a real one would connect to a cluster.
    strategy = type("ParameterServerStrategyV2", (), {})()
    asynchronous = type("Asynchronous", (loops.Loop,), {"supports_parameter_server": True})
    with pytest.raises(
        ValueError,
        match=r"under parameter_server_mode='async' the workers' steps run out of order, at "
        r"no position a checkpoint records\. Pass --parameter_server_mode=exact, or "
        r"on_nonfinite='skip'",
    ):
        loops.Trainer(
            asynchronous(),
            strategy=strategy,
            on_nonfinite="recover",
            train_data=stream(*examples()),
            parameter_server_mode="async",
        )


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            {"on_nonfinite": "stop", "max_recoveries": 2},
            r"max_recoveries=2 applies only to on_nonfinite='recover' \(got 'stop'\)",
        ),
        (
            {"on_nonfinite": "recover", "max_recoveries": 0},
            r"max_recoveries must be a whole number >= 1, got 0; to stop at the first",
        ),
    ],
)
def test_bad_recovery_arguments_name_the_value(arguments, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        make_loop(stream(*examples()), model_dir=str(tmp_path / "run"), **arguments)
    assert not (tmp_path / "run").exists()


# ---- From every binary's flags. ----

BINARY_RUNS = {
    "classifier": ["--global_batch_size=32"],
    "gan": ["--n_critic=2"],
    "lm": [
        "--sequence_length=32",
        "--width=32",
        "--num_layers=1",
        "--num_heads=2",
        "--sample_length=4",
    ],
}


# What runs a task: tests/nonfinite_run.py makes the loss infinite at the steps reading the
# batches it is given, then runs the binary.
ENV = {name: value for name, value in SUBPROCESS_ENV.items() if name != "TF_CONFIG"}


def poisoned_command(bad_batches, binary, model_dir, *flags):
    return [
        os.path.join(ROOT, "tests", "nonfinite_run.py"),
        ",".join(str(batch) for batch in bad_batches),
        f"loops.bin.{binary}",
        f"--model_dir={model_dir}",
        "--train_steps=8",
        "--steps_per_loop=2",
        "--checkpoint_every=2",
        "--on_nonfinite=recover",
        *BINARY_RUNS[binary],
        *flags,
    ]


def run(command):
    return subprocess.run(command, capture_output=True, text=True, env=ENV, timeout=900, cwd=ROOT)


def run_poisoned(bad_batches, binary, model_dir, *flags):
    return run([sys.executable, *poisoned_command(bad_batches, binary, model_dir, *flags)])


def run_all_at_once(commands, output_dir):
    """name -> CompletedProcess of each command of `commands` (name -> argv), all started at
    once: each spends most of its time importing TensorFlow, on one core. Their output goes
    to files in `output_dir` (a full pipe would stall a process until its turn to be read)."""
    started = {}
    for name, command in commands.items():
        outputs = [open(os.path.join(output_dir, f"{name}.{kind}"), "w+") for kind in "oe"]
        process = subprocess.Popen(
            command, stdout=outputs[0], stderr=outputs[1], text=True, env=ENV, cwd=ROOT
        )
        started[name] = process, outputs
    done = {}
    for name, (process, outputs) in started.items():
        process.wait(timeout=900)
        texts = []
        for stream in outputs:
            stream.seek(0)
            texts.append(stream.read())
            stream.close()
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, *texts)
    return done


@pytest.fixture(scope="module")
def recovered_binaries(tmp_path_factory, digits_dir):
    """binary -> (model_dir, finished process) of its run recovering from step 5."""
    model_dirs, commands = {}, {}
    for binary in sorted(BINARY_RUNS):
        data = [f"--data_dir={digits_dir}"] if binary == "classifier" else []
        batches_per_step = 2 if binary == "gan" else 1  # the GAN's n_critic
        model_dirs[binary] = tmp_path_factory.mktemp(binary)
        # Step 5 reads the batch after step 4's (batches 9-10 of the GAN).
        bad_batches = [4 * batches_per_step + 1]
        command = poisoned_command(bad_batches, binary, model_dirs[binary], *data)
        commands[binary] = [sys.executable, *command]
    done = run_all_at_once(commands, tmp_path_factory.mktemp("outputs"))
    return {binary: (model_dirs[binary], done[binary]) for binary in model_dirs}


@pytest.mark.parametrize("binary", sorted(BINARY_RUNS))
def test_every_binary_recovers_from_its_flags(binary, recovered_binaries):
    tmp_path, done = recovered_binaries[binary]
    batches_per_step = 2 if binary == "gan" else 1
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 5 was not finite: recovery 1 of at most 3" in done.stdout
    results = read_results(tmp_path)
    assert results["recoveries"] == [
        {"step": 5, "restored_step": 4, "skipped_batches": batches_per_step, "cause": "nonfinite"}
    ]
    assert results["global_step"] == 8 and results["config"]["on_nonfinite"] == "recover"


def test_two_workers_recover_as_one_process_does(tmp_path, digits_dir, recovered_binaries):
    one_process, done = recovered_binaries["classifier"]
    assert done.returncode == 0, done.stderr[-3000:]
    launched = run(
        [
            sys.executable,
            "-m",
            "loops.cluster.launch",
            "--num_workers=2",
            "--grace_period=5",
            "--",
            sys.executable,
            *poisoned_command(
                [5],
                "classifier",
                tmp_path,
                f"--data_dir={digits_dir}",
                "--strategy=multi_worker_mirrored",
                "--num_replicas=1",
            ),
        ]
    )
    assert launched.returncode == 0, launched.stdout[-3000:]
    for worker in ("worker_0", "worker_1"):
        assert f"[{worker}] step 5 was not finite: recovery 1 of at most 3" in launched.stdout
    assert read_results(tmp_path)["recoveries"] == read_results(one_process)["recoveries"]
    got, expected = checkpoint_weights(tmp_path), checkpoint_weights(one_process)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
        assert loops.testing.relative_error(got[name], value) <= 1e-5, name


def test_a_binary_stops_past_max_recoveries_with_the_error(tmp_path, digits_dir):
    done = run_poisoned(
        [3, 5], "classifier", tmp_path, f"--data_dir={digits_dir}", "--max_recoveries=1"
    )
    assert done.returncode == 1, done.stdout[-3000:]
    assert (
        "error: Step 4: the loss or the gradients were not finite on at least one replica, "
        "and the run has recovered 1 time already (max_recoveries=1; at step 3)"
    ) in done.stderr
    assert_checkpoints_finite(str(tmp_path))


class PoisonedPPO(loops.ActorCriticLoop):
    """PPO whose loss is inf at the steps whose own data is keyed on `bad_data_steps`."""

    bad_data_steps: tuple[int, ...] = ()

    def _replica_loss(self, samples, update):
        loss, logs = super()._replica_loss(samples, update)
        bad = tf.reduce_any(
            tf.equal(self.data_step, tf.constant([-1, *self.bad_data_steps], tf.int64))
        )
        return loss + tf.where(bad, float("inf"), 0.0), logs


def ppo(bad_data_steps, num_replicas, **kwargs):
    from loops_data import cartpole
    from loops_models import rl as rl_models

    loop_class = type("Poisoned", (PoisonedPPO,), {"bad_data_steps": tuple(bad_data_steps)})
    return make_trainer(
        loop_class,
        environment=cartpole.CartPole(),
        model_fn=lambda: rl_models.policy_value_network(observation_size=4, num_actions=2, seed=0),
        strategy=loops.testing.replica_strategy(num_replicas),
        num_envs=4,
        rollout_length=16,
        global_batch_size=32,
        epochs=1,
        steps_per_loop=2,
        seed=3,
        progress=loops.testing.quiet_progress(),
        **kwargs,
    )


@pytest.mark.parametrize("num_replicas", [1, 2])
def test_rl_recovers_by_drawing_the_data_after_the_bad_steps(tmp_path, num_replicas):
    """A loop that makes its own data keys it on data_step: after going back from step 6
    to the checkpoint of step 4, steps 5, 6, ... draw what steps 7, 8, ... would have.
    (While step k runs, the global step, and so data_step without recoveries, is k - 1.)"""
    recovered = ppo(
        [5], num_replicas, model_dir=str(tmp_path), checkpoint_every=4, on_nonfinite="recover"
    )
    recovered.train(10)
    assert [dict(entry) for entry in recovered.controller.recoveries.entries] == [
        {"step": 6, "restored_step": 4, "skipped_batches": 2, "cause": "nonfinite"}
    ]
    assert int(recovered.data_offset.numpy()) == 2
    reference = ppo([], num_replicas)
    reference.train(4)
    # As if steps 5 and 6 had been skipped: the Controller keys data_step on the record.
    reference.controller.recoveries.entries = [
        {"step": 6, "restored_step": 4, "skipped_batches": 2, "cause": "nonfinite"}
    ]
    reference.train(10)
    assert int(reference.data_offset.numpy()) == 2
    loops.testing.assert_close(
        loops.testing.loop_weights(recovered),
        loops.testing.loop_weights(reference),
        rtol=1e-6,
        label="recovered vs drawn past the bad steps",
    )
    recovered.close()
    # A resume reads the offset back from the recovery record in the checkpoint.
    resumed = ppo([5], num_replicas, model_dir=str(tmp_path), on_nonfinite="recover")
    assert resumed.state.step == 10
    resumed.train(10)
    assert int(resumed.data_offset.numpy()) == 2
    resumed.close()


def test_the_rl_binary_takes_recover(tmp_path):
    done = run_module(
        "loops.bin.rl",
        "--algorithm=dqn",
        "--train_steps=4",
        "--steps_per_loop=2",
        "--learning_starts=16",
        "--on_nonfinite=recover",
        "--max_recoveries=2",
        f"--model_dir={tmp_path}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = read_results(str(tmp_path))
    assert results["recoveries"] == [] and results["global_step"] == 4
    assert results["config"]["on_nonfinite"] == "recover"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--max_recoveries=0"], "--max_recoveries"),
        (["--on_nonfinite=retry"], "--on_nonfinite"),
        (
            ["--max_recoveries=2"],
            "max_recoveries=2 applies only to on_nonfinite='recover' (got 'stop')",
        ),
    ],
)
def test_bad_recovery_flags_are_refused_with_the_fix(flags, message, tmp_path, digits_dir):
    done = run_module(
        "loops.bin.classifier", f"--model_dir={tmp_path}", f"--data_dir={digits_dir}", *flags
    )
    assert done.returncode != 0
    assert message in done.stderr
