"""Fault trials of issue 31 on the model_dir and the flags: each case's sentence, exit code and
time, and a model_dir that the refused (or stopped) run left as it was.

Runs refused before TensorFlow loads are real binaries; the checks that need a
strategy or a live lock holder are called in-process or against a small process.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import ROOT, snapshot
from conftest import SUBPROCESS_ENV as ENV
from loops.cli import flags as loop_flags
from loops.model_dir import model_dir_lock
from loops.vocabulary import exit_codes
from loops_models import settings as model_settings

# A refused run takes well under a second; far below this even on a loaded machine.
REFUSAL_SECONDS = 60


def model_dir_with_a_run(directory) -> str:
    """A model_dir holding what a run leaves (checkpoint files, results): bytes to compare."""
    checkpoints = os.path.join(directory, "checkpoints")
    os.makedirs(checkpoints)
    for name, content in [
        ("checkpoints/ckpt-2.index", b"index bytes"),
        ("checkpoints/ckpt-2.data-00000-of-00001", b"data bytes"),
        ("checkpoints/checkpoint", b'model_checkpoint_path: "ckpt-2"\n'),
        ("results.json", b"{}"),
    ]:
        with open(os.path.join(directory, name), "wb") as stream:
            stream.write(content)
    return str(directory)


def binary(kind, model_dir, *flags):
    return [sys.executable, "-m", f"loops.bin.{kind}", f"--model_dir={model_dir}", *flags]


def run_timed(command):
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=300)
    return done, time.monotonic() - start


# ---- Flags: refused before any work (before TensorFlow loads), naming the flag and the fix. ----

FLAG_CASES = [
    (
        "gan",
        ["--grad_accum_steps=1000", "--global_batch_size=64"],
        "--grad_accum_steps=1000 cuts a replica's share of each step into more micro-batches "
        "than the 64 rows of --global_batch_size=64, so some would hold no example; pass "
        "--grad_accum_steps<=64 or a larger --global_batch_size.",
    ),
    (
        "classifier",
        ["--grad_accum_steps=64", "--global_batch_size=32"],
        "--grad_accum_steps=64 cuts a replica's share of each step into more micro-batches "
        "than the 32 rows of --global_batch_size=32",
    ),
    (
        "lm",
        ["--sequence_length=10000000"],  # 6 million GiB of attention: no machine has it
        "--sequence_length=10000000 is more than this machine can train: the attention "
        "probabilities of one example alone (4 blocks x 4 heads x 10000000² x 4 bytes) need",
    ),
    (
        "classifier",
        ["--learning_rate=1e39"],
        "flag --learning_rate=1e+39: 1e+39 is beyond float32's range (up to 3.403e+38 in "
        "magnitude): TensorFlow computes in float32, where it is infinite; pass a smaller "
        "--learning_rate, e.g. --learning_rate=0.002.",
    ),
    (
        "gan",
        ["--beta_1=-1e39"],
        "flag --beta_1=-1e+39: -1e+39 is beyond float32's range",
    ),
    (
        "classifier",
        ["--lr_schedule=step", "--lr_step_factor=0"],
        "flag --lr_step_factor=0.0: --lr_step_factor must lie in (0, 1]: each drop multiplies "
        "the rate by it; e.g. --lr_step_factor=0.1.",
    ),
    (
        "classifier",
        ["--lr_schedule=cosine", "--lr_final_fraction=2"],
        "flag --lr_final_fraction=2.0: --lr_final_fraction must lie in [0, 1]: the rate "
        "decays to that fraction of --learning_rate; e.g. --lr_final_fraction=0.1.",
    ),
    (
        "classifier",
        ["--lr_schedule=warmup_cosine", "--lr_warmup_steps=700", "--train_steps=600"],
        "--lr_warmup_steps=700 is not below --train_steps=600: the warm-up must end before "
        "the run does (the rate then decays over the rest); pass --lr_warmup_steps<600 or a "
        "larger --train_steps.",
    ),
    # --data_dir naming a file: tests/test_faults_data.py.
]


@pytest.mark.parametrize(
    "kind, flags, sentence", FLAG_CASES, ids=[" ".join(case[1]) for case in FLAG_CASES]
)
def test_a_bad_flag_is_refused_before_any_work(tmp_path, kind, flags, sentence):
    model_dir = model_dir_with_a_run(tmp_path / "run")
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    flags = [flag.replace("A_FILE", str(a_file)) for flag in flags]
    sentence = sentence.replace("A_FILE", str(a_file))
    before = snapshot(model_dir)
    done, seconds = run_timed(binary(kind, model_dir, *flags))
    print(f"refused in {seconds:.2f} s")
    assert done.returncode == 1, done.stderr[-2000:]
    assert sentence in " ".join(done.stderr.split()), done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert seconds < REFUSAL_SECONDS
    assert snapshot(model_dir) == before


def test_micro_batches_are_checked_against_a_replicas_rows():
    loop_flags.check_micro_batches(16, 32, 2)  # 16 rows a replica: 16 micro-batches of 1
    with pytest.raises(ValueError) as refused:
        loop_flags.check_micro_batches(20, 32, 2)
    assert str(refused.value) == (
        "--grad_accum_steps=20 cuts a replica's share of each step into more micro-batches "
        "than the 16 rows a replica holds (--global_batch_size=32 over 2 replicas), so some "
        "would hold no example; pass --grad_accum_steps<=16 or a larger --global_batch_size."
    )
    # 33 rows on 2 replicas: the second holds 16.
    with pytest.raises(ValueError, match="than the 16 rows a replica holds"):
        loop_flags.check_micro_batches(17, 33, 2)


def test_a_sequence_length_is_checked_against_memory():
    model = {"num_layers": 2, "num_heads": 4}
    gib = 2**30
    # 2 blocks x 4 heads x 5792² x 4 bytes is just below 1 GiB; 5793² is above.
    model_settings.check_attention_fits(model, sequence_length=5792, rows=1, memory=gib)
    with pytest.raises(ValueError) as refused:
        model_settings.check_attention_fits(model, sequence_length=5793, rows=1, memory=gib)
    assert "pass --sequence_length<=5792 (or fewer --num_layers or --num_heads)." in str(
        refused.value
    )
    with pytest.raises(ValueError) as refused:
        model_settings.check_attention_fits(model, sequence_length=4096, rows=16, memory=gib)
    assert str(refused.value) == (
        "--sequence_length=4096 is more than this machine can train: the attention "
        "probabilities of a replica's 16 rows alone (2 blocks x 4 heads x 4096² x 4 bytes) "
        "need 8 GiB, and it has 1 GiB of memory; pass --sequence_length<=1448 (or fewer "
        "--num_layers or --num_heads, or a smaller --global_batch_size)."
    )
    # No figure for the machine's memory: nothing to check against.
    model_settings.check_attention_fits(model, sequence_length=10**7, rows=1, memory=0)


def test_a_recommenders_weights_are_checked_against_memory():
    import keras

    from loops_models import recommender

    # The count is the models' own: 7 users, 11 items.
    rating = recommender.rating_model(num_users=7, num_items=11, embedding_dim=3, hidden_units=(5,))
    towers = [recommender.id_tower(num_ids=count, embedding_dim=4) for count in (7, 11)]
    assert model_settings.recommender_weights("rating", 3, 5, num_users=7, num_items=11) == (
        rating.count_params()
    )
    assert model_settings.recommender_weights("retrieval", 4, 0, num_users=7, num_items=11) == (
        sum(tower.count_params() for tower in towers)
    )
    keras.backend.clear_session()
    retrieval = {"model": "retrieval", "embedding_dim": 32, "hidden_units": 64}  # no MLP
    sizes = dict(num_users=3000, num_items=1500, copies=3)
    # 4,500 ids x 32 weights x 3 copies x 4 bytes = 1,728,000 bytes.
    model_settings.check_recommender_fits(retrieval, **sizes, memory=1_728_000)
    with pytest.raises(ValueError) as refused:
        model_settings.check_recommender_fits(retrieval, **sizes, memory=1_727_999)
    assert str(refused.value) == (
        "--embedding_dim=32 is more than this machine can train: the retrieval model's "
        "144,000 weights for 3,000 users and 1,500 items, held 3 times (the weights and the "
        "optimizer's 2 slots) at 4 bytes, need 1.6 MiB, and it has 1.6 MiB of memory; pass "
        "--embedding_dim<=31."
    )
    gib = 2**30
    rating = {"model": "rating", "embedding_dim": 32, "hidden_units": 10**9}
    with pytest.raises(ValueError) as refused:
        model_settings.check_recommender_fits(rating, **sizes | {"copies": 1}, memory=gib)
    assert str(refused.value) == (
        "--embedding_dim=32 --hidden_units=1000000000 is more than this machine can train: "
        "the rating model's 66,000,148,502 weights for 3,000 users and 1,500 items, held once "
        "(no optimizer slots) at 4 bytes, need 245.9 GiB, and it has 1.0 GiB of memory; pass "
        "--hidden_units<=4064953."
    )
    both = rating | {"embedding_dim": 10**9}
    with pytest.raises(ValueError, match=r"pass a smaller --embedding_dim and --hidden_units "):
        model_settings.check_recommender_fits(both, **sizes, memory=gib)
    with pytest.raises(ValueError, match=r"not even --embedding_dim=1 fits\)\.$"):
        model_settings.check_recommender_fits(retrieval, **sizes, memory=1024)
    model_settings.check_recommender_fits(both, **sizes, memory=0)  # no figure: no check


# ---- The model_dir. ----


def test_a_state_file_of_binary_bytes_is_rebuilt_from_the_checkpoint_files(tmp_path):
    import tensorflow as tf

    from loops.model_dir.checkpoints import Checkpointer

    directory = str(tmp_path / "checkpoints")
    step = tf.Variable(0, dtype=tf.int64)
    weights = tf.Variable([1.0, 2.0])
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(step=step, weights=weights), directory, max_to_keep=5
    )
    for value in (2, 4):
        step.assign(value)
        manager.save(checkpoint_number=step)
    state = os.path.join(directory, "checkpoint")
    with open(state, "wb") as stream:
        stream.write(b"\x80\x81\xff\x00 not text")
    intact = {name: data for name, data in snapshot(directory).items() if name != "checkpoint"}
    weights.assign([0.0, 0.0])
    step.assign(0)
    notes = []
    checkpointer = Checkpointer(
        strategy=tf.distribute.get_strategy(),
        directory=directory,
        items={"step": step, "weights": weights},
        step_counter=step,
        max_to_keep=5,
        say=notes.append,
    )
    assert checkpointer.restore() == os.path.join(directory, "ckpt-4")
    assert int(step.numpy()) == 4 and weights.numpy().tolist() == [1.0, 2.0]
    assert notes == [
        f"the checkpoint state file {state} was missing, damaged or out of date; rebuilt it "
        "from the checkpoint files (2 intact, newest ckpt-4)."
    ]
    assert tf.train.get_checkpoint_state(directory).model_checkpoint_path.endswith("ckpt-4")
    after = snapshot(directory)
    assert {name: data for name, data in after.items() if name != "checkpoint"} == intact


HOLDER = """
import sys
from loops.model_dir import model_dir_lock
model_dir_lock.acquire(sys.argv[1])
print("holding", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def held_model_dir(tmp_path):
    """A model_dir whose lock a live process holds (what a live run does first)."""
    model_dir = model_dir_with_a_run(tmp_path / "run")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, model_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
    )
    try:
        assert holder.stdout.readline() == "holding\n"
        yield model_dir, holder
    finally:
        holder.kill()
        holder.wait(timeout=60)


def test_deleting_the_lock_file_does_not_let_a_second_run_in(held_model_dir):
    model_dir, holder = held_model_dir
    with pytest.raises(ValueError, match=rf"in use by another live run \(pid {holder.pid} on "):
        model_dir_lock.acquire(model_dir)
    os.remove(os.path.join(model_dir, model_dir_lock.LOCK_NAME))  # a cleanup script
    before = snapshot(model_dir)
    with pytest.raises(ValueError) as refused:
        model_dir_lock.acquire(model_dir)
    assert str(refused.value) == (
        f"model_dir {model_dir!r} is in use by another live run (whose .lock file was "
        "removed). Wait for it to finish or stop it, or pass a different --model_dir."
    )
    # A second binary is refused the same way, and nothing in model_dir changes.
    done, seconds = run_timed(binary("gan", model_dir, "--train_steps=2"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert "is in use by another live run (whose .lock file was removed)." in done.stderr
    assert seconds < REFUSAL_SECONDS
    assert snapshot(model_dir) == before
    # The kernel releases the holder's locks when it dies: the directory is free again.
    holder.kill()
    holder.wait(timeout=60)
    model_dir_lock.release(model_dir_lock.acquire(model_dir))


def tensorflow_is_loading(pid: int) -> bool:
    """Whether the process has mapped TensorFlow's libraries (its import has begun)."""
    with open(f"/proc/{pid}/maps") as maps:
        return "_pywrap_tensorflow_internal" in maps.read()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["TERM", "USR1"])
def test_a_preemption_signal_while_tensorflow_imports_is_the_preemption_exit(tmp_path, signum):
    model_dir = model_dir_with_a_run(tmp_path / "run")
    before = snapshot(model_dir)
    process = subprocess.Popen(
        binary("gan", model_dir, "--train_steps=2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
    )
    deadline = time.monotonic() + REFUSAL_SECONDS
    while not tensorflow_is_loading(process.pid):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signum)
    start = time.monotonic()
    stdout, stderr = process.communicate(timeout=REFUSAL_SECONDS)
    print(f"exited {time.monotonic() - start:.2f} s after the signal")
    assert process.returncode == exit_codes.PREEMPTED, stderr[-2000:]
    name = signal.Signals(signum).name
    assert f"preempted ({name}) before training started: nothing to save" in stderr
    assert "Traceback" not in stderr
    assert snapshot(model_dir) == before


def test_sigterm_while_an_evaluator_waits_for_the_runs_config_is_the_preemption_exit(tmp_path):
    model_dir = str(tmp_path)  # no run has recorded its config.json here yet
    process = subprocess.Popen(
        binary("gan", model_dir, "--mode=evaluate_checkpoints", "--evaluator_timeout=300"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        cwd=ROOT,
    )
    time.sleep(1)  # by then waiting, as a rule (TensorFlow is imported only after the wait)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=REFUSAL_SECONDS)
    assert process.returncode == exit_codes.PREEMPTED, stderr[-2000:]
    # On a machine slow enough to be still starting, the start's own line.
    assert (
        "evaluator stopped (SIGTERM); its history is on disk" in stderr
        or "preempted (SIGTERM) before training started: nothing to save" in stderr
    ), stderr[-2000:]
    assert os.listdir(model_dir) == []
