"""Resident memory of every task of a parameter-server cluster training a sharded table.

    python -m benchmarks.sharded_tables                       # 4M x 64 float32 (1 GiB) on 2 servers
    python -m benchmarks.sharded_tables --rows=100000 --num_ps=3

Runs two clusters (loops-launch, 1 chief, --num_workers workers, --num_ps
servers), one with a --small_rows table and one with a --rows table, each a
`loops.EmbeddingTable` with Keras Adagrad (table + accumulator, twice the table's
bytes), and reads each task's VmRSS and VmHWM (peak) from /proc/PID/status
after the table is built, after --steps steps of --batch random ids, after a
checkpoint save and after its restore.
Each server should hold about 1/M of table + slots more than with the small
table, the chief and the workers nothing more. Writes
benchmarks/results/sharded_tables.json.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

PHASES = ("built", "trained", "saved", "restored")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4_000_000)
    parser.add_argument("--small_rows", type=int, default=1_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--num_ps", type=int, default=2)
    parser.add_argument("--num_workers", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--task", action="store_true", help="(internal) run as a cluster task")
    parser.add_argument("--go_dir", help="(internal) where the driver says go on")
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "sharded_tables.json")
    )
    return parser.parse_args(argv)


def status_bytes(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of process `pid`, in bytes."""
    with open(f"/proc/{pid}/status") as stream:
        found = dict(re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", stream.read(), re.M))
    return {"rss": int(found["VmRSS"]) * 1024, "peak": int(found["VmHWM"]) * 1024}


def run_cluster(args, rows: int) -> dict:
    """One cluster's tasks' memory per phase, and the chief's steps/s."""
    with tempfile.TemporaryDirectory() as go_dir:
        command = [sys.executable, "-m", "loops.cluster.launch"]
        command += [f"--num_workers={args.num_workers}", f"--num_ps={args.num_ps}", "--"]
        command += ["benchmarks.sharded_tables", "--task", f"--go_dir={go_dir}"]
        command += [f"--rows={rows}", f"--dim={args.dim}", f"--steps={args.steps}"]
        command += [f"--batch={args.batch}"]
        launcher = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        pids: dict[str, int] = {}
        result: dict = {"rows": rows, "memory": {}}
        for line in launcher.stdout:
            if started := re.match(r"\[launch\] (\S+) pid (\d+)", line):
                pids[started.group(1)] = int(started.group(2))
            if ready := re.match(r"\[chief_0\] measure (\w+)", line):
                phase = ready.group(1)
                result["memory"][phase] = {task: status_bytes(pid) for task, pid in pids.items()}
                open(os.path.join(go_dir, phase), "w").close()
            if rate := re.match(r"\[chief_0\] steps_per_second ([\d.]+)", line):
                result["steps_per_second"] = float(rate.group(1))
            if "FAILED" in line or "Traceback" in line:
                print(line, end="", flush=True)
        if launcher.wait() != 0 or set(result["memory"]) != set(PHASES):
            raise SystemExit(f"the cluster with {rows} rows failed (exit {launcher.returncode})")
    return result


def wait_to_go(args, phase: str) -> None:
    print(f"measure {phase}", flush=True)
    while not os.path.exists(os.path.join(args.go_dir, phase)):
        time.sleep(0.1)


def task(args) -> None:
    """A task of the cluster: the servers serve, the chief builds and trains the table."""
    import keras
    import tensorflow as tf

    import loops
    from loops.cluster import parameter_server

    parameter_server.serve_unless_chief()
    strategy = loops.make_strategy("parameter_server")
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        table = loops.EmbeddingTable(args.rows, args.dim, keras.optimizers.Adagrad(0.1))
        table.build()
    wait_to_go(args, "built")

    @tf.function
    def step(seed):
        ids = tf.random.stateless_uniform([args.batch], [seed, 0], maxval=args.rows, dtype=tf.int64)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(table(ids) ** 2)
        table.apply_gradients(tape.gradient(loss, table.shards))
        return loss

    coordinator.schedule(step, args=(tf.constant(0, tf.int64),))
    coordinator.join()  # the first step traces
    start = time.perf_counter()
    for seed in range(1, args.steps + 1):
        coordinator.schedule(step, args=(tf.constant(seed, tf.int64),))
    coordinator.join()
    print(f"steps_per_second {args.steps / (time.perf_counter() - start):.2f}", flush=True)
    wait_to_go(args, "trained")
    # Each server writes and reads its own rows of the checkpoint; the chief only the index.
    checkpoint = tf.train.Checkpoint(table=table)
    path = checkpoint.save(os.path.join(args.go_dir, "ckpt"))
    wait_to_go(args, "saved")
    checkpoint.restore(path).assert_consumed()
    wait_to_go(args, "restored")


def format_table(results: list[dict], args) -> str:
    tasks = sorted(results[0]["memory"]["built"])
    columns = " | ".join(f"RSS (peak), {result['rows']:,} rows, MiB" for result in results)
    lines = [
        f"| task | phase | {columns} | grew, MiB |",
        "| --- | --- |" + " --- |" * (len(results) + 1),
    ]
    for name in tasks:
        for phase in PHASES:
            cells = [r["memory"][phase][name] for r in results]
            text = [f"{c['rss'] / 2**20:,.0f} ({c['peak'] / 2**20:,.0f})" for c in cells]
            grew = (cells[-1]["rss"] - cells[0]["rss"]) / 2**20
            lines.append(f"| {name} | {phase} | {' | '.join(text)} | {grew:+,.0f} |")
    table_bytes = 2 * 4 * args.rows * args.dim
    lines.append(
        f"table + accumulator: {table_bytes / 2**20:,.0f} MiB; 1/{args.num_ps} of it: "
        f"{table_bytes / args.num_ps / 2**20:,.0f} MiB per server"
    )
    rates = ", ".join(f"{r['rows']:,} rows {r['steps_per_second']:.1f}" for r in results)
    lines.append(f"steps/s (batch {args.batch}): {rates}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.task:
        task(args)
        return 0
    results = [run_cluster(args, rows) for rows in (args.small_rows, args.rows)]
    from benchmarks import report

    report.write(args, clusters=results, table_bytes_with_slots=2 * 4 * args.rows * args.dim)
    print(format_table(results, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
