"""The local launcher, and multi-worker training through it, which must match one machine."""

import glob
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import ROOT, built_once_for_all_workers, checkpoint_weights
from conftest import OutputRun as _OutputRun
from conftest import read_results as results
from loops.cluster import launch
from loops.testing import relative_error
from loops.vocabulary import exit_codes

ENV = {name: value for name, value in os.environ.items() if name != "TF_CONFIG"}
ENV["PYTHONPATH"] = ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")
TRAIN_STEPS = 400
RTOL = 1e-5


def classifier_flags(model_dir, digits_dir, *extra):
    return [
        f"--model_dir={model_dir}",
        f"--data_dir={digits_dir}",
        f"--train_steps={TRAIN_STEPS}",
        "--steps_per_loop=20",
        "--global_batch_size=64",
        *extra,
    ]


def one_process(strategy, num_replicas, model_dir, digits_dir):
    return [
        sys.executable,
        "-m",
        "loops.bin.classifier",
        f"--strategy={strategy}",
        f"--num_replicas={num_replicas}",
        *classifier_flags(model_dir, digits_dir),
    ]


def two_workers(model_dir, digits_dir, *extra):
    return [
        sys.executable,
        "-m",
        "loops.cluster.launch",
        "--num_workers=2",
        "--grace_period=5",
        "--",
        "loops.bin.classifier",
        "--strategy=multi_worker_mirrored",
        "--num_replicas=1",
        *classifier_flags(model_dir, digits_dir, *extra),
    ]


class Run(_OutputRun):
    """A subprocess of this module's environment whose output lines are collected."""

    def __init__(self, command, env=None):
        super().__init__(command, ENV if env is None else env)


def largest_weight_difference(model_dir, reference_dir):
    """The largest per-tensor relative difference of the two runs' final checkpoints."""
    got, expected = checkpoint_weights(model_dir), checkpoint_weights(reference_dir)
    assert sorted(got) == sorted(expected)
    assert len(expected) >= 10  # model kernels and biases, Adam's slots, the step
    return max(relative_error(got[name], expected[name]) for name in expected)


@pytest.fixture(scope="module")
def one_machine(tmp_path_factory, digits_dir):
    """model_dirs of the same training on 1 replica and on 2 mirrored replicas."""
    model_dirs = {
        replicas: str(tmp_path_factory.mktemp(f"replicas{replicas}")) for replicas in (1, 2)
    }
    # Both at once: each process spends most of its time importing TensorFlow.
    runs = [
        Run(one_process("default", 1, model_dirs[1], digits_dir)),
        Run(one_process("mirrored", 2, model_dirs[2], digits_dir)),
    ]
    for run in runs:
        run.succeed()
    return model_dirs


def test_two_workers_give_one_machines_weights_and_loss(tmp_path, digits_dir, one_machine):
    model_dir = str(tmp_path)
    run = Run(two_workers(model_dir, digits_dir)).succeed()

    # Both workers trained: each printed its own progress to the end.
    for worker in ("worker_0", "worker_1"):
        assert f"[{worker}] step {TRAIN_STEPS}/{TRAIN_STEPS} | loss" in run.output
        assert f"[launch] {worker} finished" in run.output
    ports = re.findall(r"\[launch\] worker_\d pid \d+ at 127\.0\.0\.1:(\d+)", run.output)
    assert len(set(ports)) == 2
    # Only the chief writes: outputs, results, summaries, checkpoints (no scratch left).
    assert "[worker_0] outputs in" in run.output and "[worker_1] outputs in" not in run.output
    chief_pid = re.search(r"\[launch\] worker_0 pid (\d+)", run.output).group(1)
    events = glob.glob(os.path.join(model_dir, "summaries", "*", "events.out.tfevents.*"))
    assert events and all(f".{chief_pid}." in os.path.basename(path) for path in events)
    checkpoint_files = sorted(os.listdir(os.path.join(model_dir, "checkpoints")))
    assert checkpoint_files == [
        "checkpoint",
        f"ckpt-{TRAIN_STEPS}.data-00000-of-00001",
        f"ckpt-{TRAIN_STEPS}.index",
    ]
    assert not glob.glob(os.path.join(model_dir, "**", ".scratch_*"), recursive=True)

    got = results(model_dir)
    assert got["strategy"] == "multi_worker_mirrored" and got["num_replicas"] == 2
    assert got["global_step"] == TRAIN_STEPS and got["preempted"] is False
    for replicas, reference_dir in one_machine.items():
        expected = results(reference_dir)
        assert expected["num_replicas"] == replicas
        assert got["train"]["num_examples"] == expected["train"]["num_examples"]
        assert got["train"]["loss"] == pytest.approx(expected["train"]["loss"], rel=RTOL)
        assert got["eval"]["loss"] == pytest.approx(expected["eval"]["loss"], rel=RTOL)
        assert got["eval"]["accuracy"] == expected["eval"]["accuracy"]
        difference = largest_weight_difference(model_dir, reference_dir)
        print(
            f"2 workers vs {replicas} replica(s): train loss {got['train']['loss']!r} vs "
            f"{expected['train']['loss']!r}, largest relative weight difference {difference:.2g}"
        )
        assert difference <= RTOL
    assert results(one_machine[1])["eval"]["accuracy"] >= 0.9  # it really learned


def consecutive_free_ports(count):
    """A first port whose next `count - 1` are free too (SLURM tasks of a node take a run)."""
    for first in launch.free_ports(20):
        try:
            for port in range(first, first + count):
                with socket.socket() as bound:
                    bound.bind((launch.HOST, port))
            return first
        except OSError:
            continue
    pytest.fail(f"no {count} consecutive free ports")


def test_two_srun_tasks_find_their_cluster_and_give_one_machines_weights(
    tmp_path, digits_dir, one_machine
):
    """No TF_CONFIG and no launcher: the environment srun gives two tasks on one node."""
    model_dir, port = str(tmp_path), consecutive_free_ports(2)
    runs = []
    for rank in range(2):
        srun = dict(
            SLURM_JOB_ID="77",
            SLURM_PROCID=str(rank),
            SLURM_STEP_NUM_TASKS="2",
            SLURM_STEP_NODELIST="localhost",
            SLURM_STEP_TASKS_PER_NODE="2",
            SLURM_NODEID="0",
            SLURM_LOCALID=str(rank),
            SLURMD_NODENAME="localhost",
        )
        command = [
            sys.executable,
            "-m",
            "loops.bin.classifier",
            "--strategy=multi_worker_mirrored",
            "--num_replicas=1",
            f"--cluster_port={port}",
            *classifier_flags(model_dir, digits_dir),
        ]
        runs.append(Run(command, env=dict(ENV, **srun)))
    for rank, run in enumerate(runs):
        run.succeed()
        assert (
            f"cluster: slurm, 2 workers, this task worker {rank} at localhost:{port + rank}"
            in run.lines
        )
    got, expected = results(model_dir), results(one_machine[2])
    assert got["strategy"] == "multi_worker_mirrored" and got["num_replicas"] == 2
    assert got["train"]["loss"] == pytest.approx(expected["train"]["loss"], rel=RTOL)
    assert got["eval"]["accuracy"] == expected["eval"]["accuracy"]
    assert largest_weight_difference(model_dir, one_machine[2]) <= RTOL


def test_preempted_then_killed_worker_and_reruns_finish_with_one_machines_weights(
    tmp_path, digits_dir, one_machine
):
    model_dir = str(tmp_path)
    command = two_workers(model_dir, digits_dir, "--checkpoint_every=100")

    # SIGTERM to one worker: both stop at the same boundary, save, and exit 42,
    # which the launcher passes on.
    run = Run(command)
    worker_1 = int(run.wait_for(r"\[launch\] worker_1 pid (\d+)").group(1))
    run.wait_for(r"\[worker_1\] step 60/")
    os.kill(worker_1, signal.SIGTERM)
    assert run.finish() == exit_codes.PREEMPTED, run.output[-4000:]
    # Each worker names what it saw: its own SIGTERM, or the other's signal.
    stopped = {
        int(run.wait_for(rf"\[{worker}\] preempted \({seen}\) at step (\d+)").group(1))
        for worker, seen in (("worker_0", "a signal to another worker"), ("worker_1", "SIGTERM"))
    }
    assert len(stopped) == 1
    preempted_at = stopped.pop()
    assert 60 <= preempted_at < TRAIN_STEPS and preempted_at % 20 == 0
    assert results(model_dir)["preempted"] is True
    assert results(model_dir)["global_step"] == preempted_at

    # SIGKILL to one worker: the launcher names it, stops the other and fails, in bounded time.
    run = Run(command)
    run.wait_for(rf"\[worker_0\] restored \S+ckpt-{preempted_at} at step {preempted_at}")
    worker_1 = int(run.wait_for(r"\[launch\] worker_1 pid (\d+)").group(1))
    run.wait_for(r"\[worker_1\] step 2[0-9]0/")
    os.kill(worker_1, signal.SIGKILL)
    killed_at = time.monotonic()
    code = run.finish(timeout=120)
    stop_seconds = time.monotonic() - killed_at
    print(f"launcher exited {stop_seconds:.1f} s after the SIGKILL")
    assert code == 1
    assert "[launch] FAILED: worker_1 was killed by SIGKILL" in run.output
    assert stop_seconds < 30  # the grace period is 5 s
    latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
    resume_step = int(latest.rsplit("-", 1)[1])
    # The kill came after the step-2x0 progress line, before or after the save at step 200.
    assert resume_step in (100, 200)

    # The same command again resumes there and finishes with the uninterrupted numbers.
    run = Run(command).succeed()
    for worker in ("worker_0", "worker_1"):
        assert f"[{worker}] restored {latest} at step {resume_step}" in run.output
        assert f"[{worker}] step {TRAIN_STEPS}/{TRAIN_STEPS}" in run.output
    assert results(model_dir)["global_step"] == TRAIN_STEPS
    assert not glob.glob(os.path.join(model_dir, "**", ".scratch_*"), recursive=True)
    difference = largest_weight_difference(model_dir, one_machine[1])
    print(
        f"preempted at {preempted_at}, resumed from {resume_step} after the SIGKILL: "
        f"largest relative weight difference to 1 replica {difference:.2g}"
    )
    assert difference <= RTOL


# ---- GAN, RL, LM and click-through: 2 worker processes against 1 process. ----


def train_scalars(model_dir):
    """tag -> {step: value} of the train summaries a run wrote (one point per inner loop)."""
    scalars = {}
    for path in glob.glob(os.path.join(model_dir, "summaries", "train", "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(path):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                if not value.tag.endswith("_per_second"):  # timings: steps, examples, ...
                    number = float(tf.make_ndarray(value.tensor))
                    scalars.setdefault(value.tag, {})[event.step] = number
    return scalars


LOOP_RUNS = {
    # DCN-v2 with multi-hot bags (some empty); 168 validation rows: the last eval batch
    # holds 8, 4 on each worker, and each worker gathers every row for the exact AUC.
    "ctr": (
        "loops.bin.ctr",
        ["--train_steps=6", "--global_batch_size=32", "--generated_rows=2100"],
    ),
    # The other two interactions on the same log: wide & deep's wide tables beside its deep
    # ones, DLRM's pairwise dots with its tables placed by the strategy (loops.EmbeddingTables
    # split over the 2 workers' replicas, gathered whole by each checkpoint, the test and
    # the export).
    **{
        f"ctr_{model}": (
            "loops.bin.ctr",
            [
                f"--model={model}",
                "--train_steps=6",
                "--global_batch_size=32",
                "--generated_rows=2100",
                *placed,
            ],
        )
        for model, placed in (
            ("wide_and_deep", ()),
            ("dlrm", ("--placed_tables", "--table_optimizer=adagrad")),
        )
    },
    # A sharded Parquet log streamed (`write_sharded_log`): the workers split the statistics
    # pass (a chunk each); each reads every block of a window and keeps its replica's rows;
    # the last validation batch is partial.
    "ctr_sharded": (
        "loops.bin.ctr",
        [
            "--data={shards}",
            "--spec={shards}.spec.json",
            "--train_steps=6",
            "--global_batch_size=32",
            "--shuffle_window=2",
        ],
    ),
    # The same shards, every id column a loops.DynamicTable (`write_sharded_log`'s dynamic
    # spec): admissions and evictions decided from every replica's ids, of both workers.
    "ctr_dynamic": (
        "loops.bin.ctr",
        [
            "--data={shards}",
            "--spec={shards}.dynamic.json",
            "--train_steps=6",
            "--global_batch_size=32",
            "--shuffle_window=2",
            "--table_optimizer=adagrad",
        ],
    ),
    # An interaction log of Parquet shards streamed (`write_interaction_shards`) to the rating
    # model: ids numbered by the pass on each worker, its validation pairs streamed.
    "recommender_sharded": (
        "loops.bin.recommender",
        [
            "--data={shards}-interactions",
            "--model=rating",
            "--train_steps=6",
            "--global_batch_size=32",
            "--shuffle_window=2",
            "--embedding_dim=8",
            "--table_optimizer=adagrad",
        ],
    ),
    # The critic takes 2 batches a step, with the gradient penalty and the EMA generator.
    "gan": (
        "loops.bin.gan",
        ["--gan_loss=wgan_gp", "--n_critic=2", "--train_steps=12", "--global_batch_size=64"],
    ),
    "ppo": (
        "loops.bin.rl",
        [
            "--algorithm=ppo",
            "--train_steps=6",
            "--num_envs=8",
            "--rollout_length=32",
            "--global_batch_size=64",
            "--ppo_epochs=2",
        ],
    ),
    # Byte windows of Python source, padded: the replicas' real-token counts differ.
    "lm": (
        "loops.bin.lm",
        [
            "--train_steps=6",
            "--global_batch_size=16",
            "--sequence_length=32",
            "--width=32",
            "--num_layers=1",
            "--num_heads=2",
            "--sample_length=8",
            # The binary's default bfloat16 rounds each replica's share differently.
            "--mixed_precision=none",
        ],
    ),
    # Updates start at the third step and the 256-transition buffer wraps at the fifth.
    "dqn": (
        "loops.bin.rl",
        [
            "--algorithm=dqn",
            "--train_steps=8",
            "--num_envs=8",
            "--rollout_length=8",
            "--global_batch_size=16",
            "--buffer_capacity=256",
            "--learning_starts=128",
            "--target_update_every=3",
        ],
    ),
}


def loop_commands(loop):
    """(name -> command of the loop's 2-worker run and its 1- and 2-replica references
    without their model_dir, the flags they share)."""
    binary, loop_flags = LOOP_RUNS[loop]
    # One inner loop a step, so the summaries hold every step's losses.
    loop_flags = [*loop_flags, "--steps_per_loop=1", "--seed=3"]
    launcher = [sys.executable, "-m", "loops.cluster.launch", "--num_workers=2", "--"]
    return {
        "workers2": [*launcher, binary, "--strategy=multi_worker_mirrored", "--num_replicas=1"],
        "replicas1": [sys.executable, "-m", binary, "--strategy=default", "--num_replicas=1"],
        "replicas2": [sys.executable, "-m", binary, "--strategy=mirrored", "--num_replicas=2"],
    }, loop_flags


VALIDATION_ROWS_OF_THE_SHARDS = 75


def write_interaction_shards(folder):
    """`recommender_sharded`'s log: 2,000 generated interactions in 2 Parquet shards of row
    groups of 128."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from loops_data import interactions

    log = interactions.generated_log(num_users=80, num_items=60, num_interactions=2000, seed=2)
    table = pa.table({"user_id": log.user_ids[log.users], "item_id": log.item_ids[log.items],
                      "rating": log.ratings})  # fmt: skip
    os.makedirs(folder)
    half = -(-table.num_rows // 2)
    for shard in range(2):
        pq.write_table(table.slice(shard * half, half), f"{folder}/part-{shard}.parquet",
                       row_group_size=128)  # fmt: skip


def write_sharded_log(folder):
    """`ctr_sharded`'s log: 900 generated click rows in 3 Parquet shards of row groups of 10
    (90 blocks: 2 chunks of the statistics pass, one for each of 2 workers), and its spec
    beside it."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from loops_data import ctr_data

    log = ctr_data.click_log(900, seed=6, numeric_columns=2, categorical_columns=3,
                             multi_hot_columns=1, cardinality=15)  # fmt: skip
    columns = {"clicked": log.labels.astype(np.int64)}
    for name, values in log.columns.items():
        if values.ndim == 2:
            columns[name] = ["|".join(str(v) for v in bag if v >= 0) for bag in values]
        else:
            columns[name] = values.astype(np.float64 if values.dtype.kind == "f" else np.int64)
    os.makedirs(folder)
    table = pa.table(columns)
    for shard in range(3):
        pq.write_table(table.slice(shard * 300, 300), f"{folder}/part-{shard}.parquet",
                       row_group_size=10)  # fmt: skip
    kinds = {"I": "numeric", "C": "categorical", "t": "multi_hot"}
    spec = {"label": "clicked", "columns": [
        {"name": name, "kind": kinds[name[0]]} for name in columns if name != "clicked"
    ]}  # fmt: skip
    with open(folder + ".spec.json", "w") as stream:
        json.dump(spec, stream)
    # Room for 8 of each categorical column's 15 values, admitted at a second sighting: the
    # 6 steps admit and evict. (A streamed bag has no static id count to exchange.)
    for column in spec["columns"]:
        if column["kind"] == "categorical":
            column["dynamic"] = {"capacity": 8, "admit_after": 2, "decay": 0.9}
    with open(folder + ".dynamic.json", "w") as stream:
        json.dump(spec, stream)


# Loops whose runs go at once: the 2 workers wait on each other at every step, and each
# process imports TensorFlow on one core; 2 loops (10 processes) keep memory modest.
LOOPS_AT_ONCE = 2


@pytest.fixture(scope="module")
def loop_runs(tmp_path_factory):
    """The folder holding, for each loop, its 3 runs' model_dirs and output (`.out`) and
    exit code (`.code`) files, from one build for all pytest-xdist workers."""

    def build(folder):
        write_sharded_log(os.path.join(folder, "shards"))
        write_interaction_shards(os.path.join(folder, "shards-interactions"))
        loops = sorted(LOOP_RUNS)
        for first in range(0, len(loops), LOOPS_AT_ONCE):
            started = {}
            for loop in loops[first : first + LOOPS_AT_ONCE]:
                commands, loop_flags = loop_commands(loop)
                for name, command in commands.items():
                    model_dir = os.path.join(folder, loop, name)
                    shards = os.path.join(folder, "shards")
                    flags = [f"--model_dir={model_dir}"]
                    flags += [flag.replace("{shards}", shards) for flag in loop_flags]
                    started[model_dir] = Run([*command, *flags])
            for model_dir, run in started.items():
                code = run.finish(timeout=300)
                with open(model_dir + ".out", "w") as out, open(model_dir + ".code", "w") as end:
                    out.write(run.output)
                    end.write(str(code))

    return built_once_for_all_workers(tmp_path_factory, "launch_loops", build)


@pytest.mark.parametrize("loop", sorted(LOOP_RUNS))
def test_each_loop_on_two_workers_gives_one_machines_step_losses_and_weights(loop_runs, loop):
    commands, loop_flags = loop_commands(loop)
    model_dirs = {name: os.path.join(loop_runs, loop, name) for name in commands}
    outputs = {}
    for name, model_dir in model_dirs.items():
        with open(model_dir + ".out") as out, open(model_dir + ".code") as end:
            outputs[name], code = out.read(), int(end.read())
        assert code == 0, f"{name}: exit code {code}:\n{outputs[name][-4000:]}"
    train_steps = int(re.search(r"--train_steps=(\d+)", " ".join(loop_flags)).group(1))
    for worker in ("worker_0", "worker_1"):
        assert re.search(rf"\[{worker}\] step {train_steps}/{train_steps} \|", outputs["workers2"])
    got = results(model_dirs["workers2"])
    assert got["strategy"] == "multi_worker_mirrored" and got["num_replicas"] == 2
    assert got["global_step"] == train_steps

    losses = train_scalars(model_dirs["workers2"])
    assert losses and all(
        sorted(steps) == list(range(1, train_steps + 1)) for steps in losses.values()
    )
    for reference in ("replicas1", "replicas2"):
        expected = train_scalars(model_dirs[reference])
        assert sorted(expected) == sorted(losses)
        for tag, by_step in expected.items():
            got_values = np.array([losses[tag][step] for step in sorted(by_step)])
            want = np.array([by_step[step] for step in sorted(by_step)])
            # PPO's policy loss averages advantages normalized to mean 0: a sum that
            # cancels, so rounding sets its error; it gets an absolute tolerance.
            rtol, atol = (0, 1e-6) if tag == "policy_loss" else (RTOL, 1e-7)
            np.testing.assert_allclose(
                got_values,
                want,
                rtol=rtol,
                atol=atol,
                err_msg=f"{loop} {tag}: 2 workers vs {reference}",
            )
        difference = largest_weight_difference(model_dirs["workers2"], model_dirs[reference])
        print(
            f"{loop}: 2 workers vs {reference}: largest relative weight difference "
            f"{difference:.2g} over {len(losses)} logged values x {train_steps} steps"
        )
        assert difference <= RTOL


@pytest.mark.parametrize("loop", ["ctr", "ctr_wide_and_deep", "ctr_dlrm", "ctr_sharded"])
def test_ctr_on_two_workers_evaluates_and_tests_every_row_as_one_process_does(loop_runs, loop):
    got = results(os.path.join(loop_runs, loop, "workers2"))
    # The generated log's 168 validation rows; the shards' by their rows' hash: 75 (32 * 2 + 11).
    validation = {"ctr_sharded": VALIDATION_ROWS_OF_THE_SHARDS}.get(loop, 168)
    assert got["data"]["validation_rows"] == validation and got["eval"]["examples"] == validation
    assert got["config"]["model"] == {"ctr": "dcn_v2", "ctr_sharded": "dcn_v2"}.get(
        loop, loop.removeprefix("ctr_")
    )
    for reference in ("replicas1", "replicas2"):
        expected = results(os.path.join(loop_runs, loop, reference))
        for figures in ("eval", "test"):
            assert sorted(got[figures]) == sorted(expected[figures])
            for name, value in expected[figures].items():
                assert got[figures][name] == pytest.approx(value, rel=1e-6), (figures, name)
    if loop == "ctr_sharded":  # the workers split the statistics pass: a share each, one fit
        runs = os.path.join(loop_runs, loop)
        shares = glob.glob(os.path.join(runs, "workers2", ".fit_shares", "*", "share-*-of-2.json"))
        assert len(shares) == 2, shares
        fitted = {}
        for name in ("workers2", "replicas1"):
            with open(os.path.join(runs, name, "streamed_features.json")) as stream:
                fitted[name] = json.load(stream)["fitted"]
        assert fitted["workers2"] == fitted["replicas1"]
    placed = {
        name: {
            table["split"]
            for table in results(os.path.join(loop_runs, loop, name)).get("tables", [])
        }
        for name in ("workers2", "replicas1", "replicas2")
    }
    if loop == "ctr_dlrm":  # each worker held half of every table's rows
        assert placed == {
            "workers2": {"replicas"},
            "replicas1": {"whole"},
            "replicas2": {"replicas"},
        }
        tables = results(os.path.join(loop_runs, loop, "workers2"))["tables"]
        assert all(len(table["blocks"]) == 2 for table in tables), tables
    else:  # keras Embeddings: whole on one replica, a copy on every replica of two
        assert placed == {
            "workers2": {"replicated"},
            "replicas1": {"whole"},
            "replicas2": {"replicated"},
        }


def test_dynamic_tables_on_two_workers_make_one_processs_admissions_and_figures(loop_runs):
    runs = {
        name: results(os.path.join(loop_runs, "ctr_dynamic", name))
        for name in ("workers2", "replicas1", "replicas2")
    }
    tables = {
        name: {t["name"]: t for t in got["tables"] if "dynamic" in t} for name, got in runs.items()
    }
    assert len(tables["replicas1"]) == 3  # the 3 categorical columns
    for name, placed in tables.items():
        for table in placed.values():
            dynamic = table["dynamic"]
            assert dynamic["step"] == 6 and 0 < dynamic["resident"] <= dynamic["capacity"]
            assert dynamic["admissions"] > dynamic["capacity"] and dynamic["evictions"] > 0
            assert dynamic == tables["replicas1"][table["name"]]["dynamic"], (name, table)
            assert table["split"] == ("whole" if name == "replicas1" else "replicas")
    for name in ("workers2", "replicas2"):
        for figures in ("eval", "test"):
            for key, value in runs["replicas1"][figures].items():
                assert runs[name][figures][key] == pytest.approx(value, rel=1e-6), (name, key)


# ---- The launcher on its own, with small Python commands (no TensorFlow in the tasks). ----

# Prints its task from TF_CONFIG, then acts as the environment variable ROLE_<task> says:
# exit<code> once every task is ready (a file each in READY_DIR), so no task is stopped
# before it printed and set its handlers (saving<code>: 1 s later, "saving" meanwhile);
# the other roles wait to be stopped. On SIGTERM `graceful` notes it in READY_DIR and
# exits 0; `preempted` waits 0.5 s (a save), says which tasks got SIGTERM meanwhile, and
# exits 42 as a preempted loops binary does.
TASK_SCRIPT = """
import json, os, signal, sys, time
config = json.loads(os.environ["TF_CONFIG"])
task = f"{config['task']['type']}_{config['task']['index']}"
ready_dir = os.environ["READY_DIR"]
print("task", json.dumps(config), flush=True)
print("a line on stderr", file=sys.stderr, flush=True)
role = os.environ.get("ROLE_" + task, "exit0")
if role == "ignore_signals":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
def graceful(signum, _):
    open(os.path.join(ready_dir, "sigterm_" + task), "w").close()
    print("got", signal.Signals(signum).name, flush=True)
    sys.exit(0)
def preempted(*_):
    time.sleep(0.5)
    signalled = sorted(name[8:] for name in os.listdir(ready_dir) if name.startswith("sigterm_"))
    print("others got SIGTERM while saving:", signalled, flush=True)
    sys.exit(42)
if role in ("graceful", "preempted"):
    signal.signal(signal.SIGTERM, graceful if role == "graceful" else preempted)
    signal.signal(signal.SIGUSR1, graceful if role == "graceful" else preempted)
print("ready", flush=True)
open(os.path.join(ready_dir, task), "w").close()
if role.startswith(("exit", "saving")):
    tasks = int(os.environ["TASKS"])  # the evaluator is not in the cluster, so counted here
    deadline = time.monotonic() + 60
    while len(os.listdir(ready_dir)) < tasks and time.monotonic() < deadline:
        time.sleep(0.02)
    if role.startswith("saving"):
        print("saving", flush=True)
        time.sleep(1)
    sys.exit(int(role.removeprefix("exit").removeprefix("saving")))
time.sleep(60)
"""


def launch_in_process(
    num_workers, num_ps=0, roles=None, grace_period=1.0, after_ready=None, evaluator=False
):
    """Runs TASK_SCRIPT as a cluster; returns (exit code, stdout, stderr, seconds)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    ready_dir = tempfile.mkdtemp()
    tasks = launch.plan_cluster(num_workers, num_ps, evaluator=evaluator)
    env = dict(
        ENV,
        READY_DIR=ready_dir,
        TASKS=str(len(tasks)),
        **{f"ROLE_{task}": role for task, role in (roles or {}).items()},
    )
    launcher = launch.Launcher(
        [sys.executable, "-c", TASK_SCRIPT],
        tasks,
        grace_period=grace_period,
        stdout=stdout,
        stderr=stderr,
        env=env,
    )
    finished = threading.Event()
    if after_ready is not None:
        # The signals go to this process; only its main thread can hand them to the launcher.
        assert threading.current_thread() is threading.main_thread()

        def when_ready():
            # Never signal once the launcher is done: the signal would reach pytest itself.
            while stdout.getvalue().count("ready") < len(tasks):
                if finished.wait(0.02):
                    return
            after_ready()

        threading.Thread(target=when_ready, daemon=True).start()
    started = time.monotonic()
    try:
        code = launcher.run()
    finally:
        finished.set()
        shutil.rmtree(ready_dir)
    return code, stdout.getvalue(), stderr.getvalue(), time.monotonic() - started


def test_every_task_gets_its_tf_config_and_prefixed_output_and_servers_are_stopped():
    code, stdout, stderr, seconds = launch_in_process(2, num_ps=1, roles={"ps_0": "serve"})
    assert code == 0, stderr
    configs = {}
    for name in ("chief_0", "worker_0", "worker_1", "ps_0"):
        line = re.search(rf"^\[{name}\] task (.*)$", stdout, re.MULTILINE).group(1)
        configs[name] = json.loads(line)
        assert f"[{name}] a line on stderr" in stderr
    cluster = configs["worker_0"]["cluster"]
    assert all(config["cluster"] == cluster for config in configs.values())
    assert [config["task"] for config in configs.values()] == [
        {"type": "chief", "index": 0},
        {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
        {"type": "ps", "index": 0},
    ]
    addresses = cluster["chief"] + cluster["worker"] + cluster["ps"]
    assert len(addresses) == 4 and len(set(addresses)) == 4
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", address) for address in addresses)
    # TensorFlow binds 0.0.0.0 all the same: the tasks run where only they reach those ports.
    assert stderr.startswith(f"[launch] {launch.PRIVATE_NETWORK_NOTE}\n[launch] starting 4 tasks")
    # The parameter server never exits on its own; the launcher stops it once the chief is done.
    assert re.search(r"the chief finished; stopping (worker_\d, )*ps_0", stderr)
    assert seconds < 15


def test_a_failing_task_is_named_and_the_others_are_stopped_even_one_that_ignores_sigterm():
    code, stdout, stderr, seconds = launch_in_process(
        3,
        roles={"worker_0": "ignore_signals", "worker_1": "exit3", "worker_2": "graceful"},
        grace_period=1.0,
    )
    assert code == 1
    assert "[launch] FAILED: worker_1 exited with code 3" in stderr
    assert "worker_1 exited with code 3; stopping worker_0, worker_2" in stderr
    assert "[worker_2] got SIGTERM" in stdout
    assert "worker_0 still running 1 s after SIGTERM; sending SIGKILL" in stderr
    assert seconds < 15


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1], ids=["TERM", "USR1"])
def test_a_preemption_signal_to_the_launcher_is_forwarded_to_every_task(signum):
    handler_before = signal.getsignal(signum)
    code, stdout, stderr, _ = launch_in_process(
        2,
        roles={"worker_0": "graceful", "worker_1": "graceful"},
        after_ready=lambda: os.kill(os.getpid(), signum),
    )
    assert code == 0, stderr
    name = signal.Signals(signum).name
    assert f"[launch] received {name}; sent {name} to every task" in stderr
    assert f"[worker_0] got {name}" in stdout and f"[worker_1] got {name}" in stdout
    assert signal.getsignal(signum) is handler_before  # the handler is given back


def test_a_second_signal_kills_tasks_that_do_not_stop():
    def signal_twice():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)  # the tasks ignore SIGINT, so the launcher is still waiting
        os.kill(os.getpid(), signal.SIGINT)

    code, _, stderr, seconds = launch_in_process(
        2,
        roles={"worker_0": "ignore_signals", "worker_1": "ignore_signals"},
        grace_period=30.0,
        after_ready=signal_twice,
    )
    assert code == 128 + signal.SIGINT, stderr
    assert "[launch] received SIGINT; sent SIGINT to every task" in stderr
    assert "[launch] received SIGINT; sent SIGKILL to every task" in stderr
    assert "[launch] FAILED: worker_0 was killed by SIGKILL after SIGINT and SIGINT" in stderr
    assert seconds < 10  # not the 30 s grace period


def test_tasks_exiting_42_make_the_launcher_exit_42_and_are_not_a_failure():
    # worker_1 is still saving when worker_0 exits 42: it is left to finish.
    code, stdout, stderr, _ = launch_in_process(
        2, roles={"worker_0": "exit42", "worker_1": "saving42"}
    )
    assert code == exit_codes.PREEMPTED == 42, stderr
    assert "[launch] worker_0 was preempted (exit code 42) and saved" in stderr
    assert "[launch] worker_1 was preempted (exit code 42) and saved" in stderr
    assert stderr.endswith(
        "[launch] PREEMPTED: worker_0, worker_1 exited 42; rerun the same "
        "command to continue (exit code 42)\n"
    )
    assert "[worker_1] saving" in stdout
    assert "stopping" not in stderr and "FAILED" not in stderr


def test_a_preempted_chief_ends_the_run_with_42_and_its_servers_are_stopped():
    code, _, stderr, seconds = launch_in_process(
        2,
        num_ps=1,
        roles={"chief_0": "exit42", "worker_0": "serve", "worker_1": "serve", "ps_0": "serve"},
    )
    assert code == 42, stderr
    assert "[launch] the chief finished; stopping worker_0, worker_1, ps_0" in stderr
    assert stderr.endswith(
        "[launch] PREEMPTED: chief_0 exited 42; rerun the same command to continue (exit code 42)\n"
    )
    assert seconds < 15


def test_a_failure_beside_a_preemption_still_fails_the_run():
    code, _, stderr, _ = launch_in_process(2, roles={"worker_0": "exit42", "worker_1": "exit3"})
    assert code == 1
    assert "[launch] FAILED: worker_1 exited with code 3" in stderr


def test_sigterm_goes_to_the_chief_alone_until_it_has_saved_then_the_servers_stop():
    code, stdout, stderr, _ = launch_in_process(
        1,
        num_ps=1,
        roles={"chief_0": "preempted", "worker_0": "graceful", "ps_0": "graceful"},
        after_ready=lambda: os.kill(os.getpid(), signal.SIGTERM),
    )
    assert code == 42, stderr
    assert (
        "[launch] received SIGTERM; sent SIGTERM to chief_0 (the others keep serving until "
        "the run ends)"
    ) in stderr
    # A parameter server dies on SIGTERM; the chief's save needs it, so it must not get one first.
    assert "[chief_0] others got SIGTERM while saving: []" in stdout
    assert "[launch] the chief finished; stopping worker_0, ps_0" in stderr
    assert "[worker_0] got SIGTERM" in stdout and "[ps_0] got SIGTERM" in stdout
    assert stderr.endswith(
        "[launch] PREEMPTED after SIGTERM: chief_0 exited 42; rerun the same "
        "command to continue (exit code 42)\n"
    )


def test_an_evaluator_task_is_outside_the_cluster_and_the_launcher_waits_for_it():
    # The workers exit at once; the evaluator 1 s later ("saving" meanwhile).
    code, stdout, stderr, _ = launch_in_process(2, evaluator=True, roles={"evaluator_0": "saving0"})
    assert code == 0, stderr
    configs = {
        name: json.loads(re.search(rf"^\[{name}\] task (.*)$", stdout, re.MULTILINE).group(1))
        for name in ("worker_0", "worker_1", "evaluator_0")
    }
    # TensorFlow's convention: the evaluator sees the cluster, which does not list it.
    assert configs["evaluator_0"] == {
        "cluster": configs["worker_0"]["cluster"],
        "task": {"type": "evaluator", "index": 0},
    }
    assert list(configs["worker_1"]["cluster"]) == ["worker"]
    assert re.search(r"^\[launch\] evaluator_0 pid \d+$", stderr, re.MULTILINE)
    assert (
        "[launch] every worker finished; waiting for evaluator_0 to evaluate the run's last "
        "checkpoints\n"
    ) in stderr
    assert "[evaluator_0] saving" in stdout
    assert stderr.endswith("[launch] evaluator_0 finished\n")
    assert "stopping" not in stderr


def test_servers_stopped_after_the_chief_are_no_failure_while_the_evaluator_finishes():
    code, stdout, stderr, _ = launch_in_process(
        1,
        num_ps=1,
        evaluator=True,
        roles={"chief_0": "exit0", "worker_0": "serve", "ps_0": "serve", "evaluator_0": "saving0"},
    )
    assert code == 0, stderr
    assert "[launch] the chief finished; stopping worker_0, ps_0\n" in stderr
    assert "[evaluator_0] saving" in stdout
    assert stderr.endswith("[launch] evaluator_0 finished\n")
    assert "killed by" not in stderr and "FAILED" not in stderr


def test_a_failing_evaluator_leaves_training_running_then_fails_the_launch():
    code, stdout, stderr, _ = launch_in_process(
        2,
        evaluator=True,
        roles={"worker_0": "saving0", "worker_1": "saving0", "evaluator_0": "exit3"},
    )
    assert code == 1, stderr
    assert "[launch] evaluator_0 exited with code 3; training goes on without it" in stderr
    assert "[worker_0] saving" in stdout and "[worker_1] saving" in stdout
    assert "[launch] worker_0 finished" in stderr and "[launch] worker_1 finished" in stderr
    assert stderr.endswith("[launch] FAILED: evaluator_0 exited with code 3 (training finished)\n")
    assert "stopping" not in stderr


def test_a_preempted_run_stops_its_evaluator_and_exits_42():
    code, stdout, stderr, seconds = launch_in_process(
        2,
        evaluator=True,
        roles={"worker_0": "exit42", "worker_1": "exit42", "evaluator_0": "graceful"},
    )
    assert code == 42, stderr
    assert "[launch] every worker finished; stopping evaluator_0" in stderr
    assert "[evaluator_0] got SIGTERM" in stdout
    assert stderr.endswith(
        "[launch] PREEMPTED: worker_0, worker_1 exited 42; rerun the same command to continue "
        "(exit code 42)\n"
    )
    assert seconds < 15


def test_sigterm_to_the_launcher_reaches_the_evaluator_too():
    code, stdout, stderr, _ = launch_in_process(
        1,
        evaluator=True,
        roles={"worker_0": "graceful", "evaluator_0": "graceful"},
        after_ready=lambda: os.kill(os.getpid(), signal.SIGTERM),
    )
    assert code == 0, stderr
    assert "[launch] received SIGTERM; sent SIGTERM to every task" in stderr
    assert "[worker_0] got SIGTERM" in stdout and "[evaluator_0] got SIGTERM" in stdout


def test_the_help_lists_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        launch.main(["--help"])
    assert (
        "exit codes:\n  0     every task finished\n  42    preempted: tasks exited 42 after "
        "saving; rerun the same command to continue\n  1     a task failed"
    ) in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--num_workers=0", "--", "loops.bin.classifier"],
            "--num_workers=0: a cluster needs at least one worker; pass --num_workers=2",
        ),
        (
            ["--num_workers=2", "--num_ps=-1", "--", "loops.bin.classifier"],
            "--num_ps=-1 is negative",
        ),
        (
            ["--num_workers=2", "--grace_period=0", "--", "loops.bin.classifier"],
            "--grace_period=0.0 must be > 0 seconds",
        ),
        (
            ["--num_workers=2"],
            "no `--` and no command after it; e.g. loops-launch",
        ),
        (["--num_workers=2", "--"], "No command after `--`"),
        (
            ["--num_workers=2", "loops.bin.classifier"],
            "unexpected loops.bin.classifier; the launcher takes --num_workers",
        ),
        (["--num_worker=2", "--", "loops.bin.classifier"], "unexpected --num_worker=2"),
        (["--", "loops.bin.classifier"], "--num_workers is required: how many worker processes"),
        (["--num_workers=two", "--", "x"], "argument --num_workers: invalid int value: 'two'"),
        (
            ["--num_workers=2", "--network=none", "--", "x"],
            "argument --network: invalid choice: 'none' (choose from 'private', 'host')",
        ),
        (
            ["--num_workers=2", "--", "train.py"],
            "'train.py' looks like a script file; pass `python train.py`",
        ),
        (
            ["--num_workers=2", "--", "no such thing"],
            "is neither a program on PATH nor a Python module",
        ),
        (
            ["--num_workers=1", "--", "/no/such/program"],
            "Cannot start '/no/such/program' for worker_0 ([Errno 2] No such file or directory",
        ),
    ],
)
def test_argument_errors_say_what_to_do(capsys, argv, message):
    with pytest.raises(SystemExit) as raised:
        launch.main(argv)
    assert raised.value.code == 2
    assert message in capsys.readouterr().err


def test_a_module_runs_with_this_python_and_a_program_as_given():
    assert launch.resolve_command(["loops.bin.classifier", "--x=1"]) == [
        sys.executable,
        "-m",
        "loops.bin.classifier",
        "--x=1",
    ]
    assert launch.resolve_command([sys.executable, "-c", "pass"]) == [sys.executable, "-c", "pass"]
    assert launch.resolve_command(["env", "A=1"]) == ["env", "A=1"]


def test_the_launcher_starts_without_importing_tensorflow():
    check = (
        "import sys, loops, loops.cluster.launch; "
        "assert 'tensorflow' not in sys.modules, sorted(m for m in sys.modules if 'tensorflow' in m)[:3]; "  # noqa: E501
        "loops.Loop; assert 'tensorflow' in sys.modules; print('lazy')"
    )
    result = subprocess.run(
        [sys.executable, "-c", check],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "lazy"
