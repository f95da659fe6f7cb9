"""A table placed by the strategy against a replicated one on synchronous replicas: the memory
a process grows by, each step's speed and the bytes a step exchanges.

    python -m benchmarks.placed_tables --replicas=2,4  # memory: 2M x 64; speed: 1M, 10M rows
    python -m benchmarks.placed_tables --memory_rows=200000 --rows=100000 --replicas=2

Modes, each trained through `loops.Update` with Adagrad on the table (the table and its
accumulator: twice the table's bytes), a global batch of ids 2 an example:
- replicated: a `keras.layers.Embedding`, a whole copy (and accumulator) on every replica,
  its rows' gradients all-gathered and applied on every copy (`loops.Update`'s sparse path);
- placed: a `loops.EmbeddingTable`, one block of rows (and its accumulator) per replica,
  lookups and row gradients exchanged by all-reduce (`loops.tables.table_blocks`);
- planned (memory, one process): the replicated mode's `keras.layers.Embedding` made under a
  `loops.TablePlan`, which places it as the placed mode's table.

Memory: each (mode, layout) in a process of its own (no strategy in force, 1 and 4
replicas), its resident memory (VmRSS) read after the strategy is made and after
--memory_steps steps; the growth between is what the table costs that process, also given
over the bytes of the table and its accumulator (`/ table`); then each mode on the two tasks
of a 2-worker MultiWorkerMirroredStrategy cluster (loops-launch on this host, one replica a
worker), each task's growth (`worker_0`, `worker_1`). The targets: a placed table grows a
process by at most 1.2x its bytes on every layout of one process, and on 4 replicas by at
most 1.2x what one replica grows it by. Speed: both modes' steps timed in interleaved
rounds in one process (`benchmarks.embedding_tables.steps_per_second`), `placed/replicated`
their ratio (the target: >= 0.8 at 1M rows, above 1 at 10M).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from benchmarks import embedding_tables, report

MODES = ("replicated", "placed")
# A plain Embedding placed by a loops.TablePlan: the placed mode's table, measured for memory.
PLANNED = "planned"
LOOKUPS, RATE = embedding_tables.LOOKUPS, embedding_tables.RATE
MEMORY_REPLICAS = (1, 4)
# `--case`'s replicas for a task of a 2-worker cluster, and for no strategy in force.
WORKERS = "workers"
DEFAULT = "default"


def parse_args(argv=None):
    memory = {
        "memory_rows": dict(type=int, default=2_000_000, help="rows of the memory table"),
        "memory_dim": dict(type=int, default=64, help="width of the memory table"),
        "memory_steps": dict(type=int, default=3, help="steps before memory is read"),
        "dim": dict(type=int, default=32, help="width of the speed tables"),
        "case": dict(help="(internal) MODE,REPLICAS: measure one memory case"),
        "speed_case": dict(help="(internal) REPLICAS,ROWS: time one speed case"),
    }
    return embedding_tables.table_arguments(
        argv,
        __doc__.split("\n\n")[0],
        rows="1000000,10000000",
        batch=4096,
        smallest=LOOKUPS,
        output="placed_tables.json",
        **memory,
    )


def make_model(mode: str, rows: int, dim: int):
    import keras

    import loops

    ids = keras.Input((LOOKUPS,), dtype="int32")
    if mode == "placed":
        table = loops.EmbeddingTable(rows, dim, keras.optimizers.Adagrad(RATE), name="table")
    elif mode == PLANNED:  # takes the Update's table optimizer
        with loops.TablePlan(min_rows=1).placing():
            table = keras.layers.Embedding(rows, dim, name="table")
    else:
        table = keras.layers.Embedding(rows, dim, name="table")
    vectors = table(ids)
    head = keras.layers.Dense(1, name="head")
    return keras.Model(ids, head(keras.ops.mean(vectors, axis=1)))


def make_step(strategy, mode: str, rows: int, dim: int, global_batch_size: int):
    """() -> loss: one step of `loops.Update` on `mode`'s table (Adagrad) and a Dense head
    (SGD), its batch split over the replicas."""
    import keras
    import tensorflow as tf

    import loops

    with strategy.scope():
        model = make_model(mode, rows, dim)
        context = loops.UpdateContext(
            strategy=strategy,
            global_step=tf.Variable(0, dtype=tf.int64, trainable=False),
            nonfinite=loops.NonFiniteUpdates(strategy, skips=False),
        )
        tables = None
        if mode == "replicated":
            tables = keras.optimizers.Adagrad(RATE)
            tables.build([model.get_layer("table").embeddings])
        elif mode == PLANNED:
            tables = keras.optimizers.Adagrad(RATE)
        dense = keras.optimizers.SGD(RATE)
        dense.build(model.get_layer("head").trainable_variables)
        update = loops.Update(context, dense, model, table_optimizer=tables)

    def replica_loss(ids, targets):
        count = loops.global_count(tf.shape(targets)[0])
        errors = tf.squeeze(model(ids, training=True), -1) - targets
        return loops.scale_to_global_batch(errors**2, count), {}

    step = tf.function(lambda *args: update(replica_loss, args=args).sums["loss"])
    args = embedding_tables.batch(strategy, rows, global_batch_size)
    return lambda: step(*args)


def resident_bytes() -> int:
    with open("/proc/self/status") as stream:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", stream.read(), re.M).group(1)) * 1024


def memory_case(args) -> dict:
    """In this process: the resident memory before and after `--case`'s table trained."""
    import loops

    mode, replicas = args.case.split(",")
    if replicas == WORKERS:  # a task of loops-launch's cluster: one replica a worker
        strategy = loops.make_strategy("multi_worker_mirrored")
    elif replicas == DEFAULT:  # no strategy in force: TensorFlow's default one
        import tensorflow as tf

        strategy = tf.distribute.get_strategy()
    else:
        loops.configure_logical_cpus(max(MEMORY_REPLICAS))
        strategy = loops.testing.replica_strategy(int(replicas))
    before = resident_bytes()
    step = make_step(strategy, mode, args.memory_rows, args.memory_dim, args.global_batch_size)
    for _ in range(args.memory_steps):
        float(step())
    return {"mode": mode, "replicas": replicas, "before": before, "after": resident_bytes()}


def table_mib(args) -> float:
    """The table and its Adagrad accumulator (one float an element each), in MiB."""
    return 2 * 4 * args.memory_rows * args.memory_dim / 2**20


def memory(args) -> list[dict]:
    """Each memory case in a process of its own, as `memory_case` reads it: no strategy in
    force (TensorFlow's default), 1 and 4 mirrored replicas, each task of 2 workers; each
    case's growth also over the bytes of the table and its accumulator (`over_table`)."""
    cases = []
    for mode in (*MODES, PLANNED):
        for replicas in (DEFAULT, *MEMORY_REPLICAS):
            case = _in_own_process(
                [
                    f"--case={mode},{replicas}",
                    f"--memory_rows={args.memory_rows}",
                    f"--memory_dim={args.memory_dim}",
                    f"--global_batch_size={args.global_batch_size}",
                ]
            )
            case["grown_mb"] = (case["after"] - case["before"]) / 2**20
            case["over_table"] = case["grown_mb"] / table_mib(args)
            cases.append(case)
            print(f"memory {mode} on {replicas}: +{case['grown_mb']:,.0f} MB", flush=True)
        if mode == PLANNED:
            continue  # the placed mode's table, on 2 workers too
        for task, case in _on_two_workers(args, mode).items():
            grown = (case["after"] - case["before"]) / 2**20
            case.update(replicas=task, grown_mb=grown, over_table=grown / table_mib(args))
            cases.append(case)
            print(f"memory {mode} on {task} of 2: +{case['grown_mb']:,.0f} MB", flush=True)
    return cases


def _on_two_workers(args, mode: str) -> dict[str, dict]:
    """`memory_case` of `mode` in each task of a 2-worker MultiWorkerMirroredStrategy cluster
    (loops-launch on this host), by task."""
    case = [f"--case={mode},{WORKERS}", f"--memory_rows={args.memory_rows}"]
    case += [f"--memory_dim={args.memory_dim}", f"--global_batch_size={args.global_batch_size}"]
    command = [sys.executable, "-m", "loops.cluster.launch", "--num_workers=2", "--"]
    command += [sys.executable, "-m", "benchmarks.placed_tables", *case]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = re.findall(r"^\[(worker_\d)\] (\{.*\})$", done.stdout, re.M)
    return {task: json.loads(line) for task, line in found}


def exchanged_bytes(mode: str, replicas: int, global_batch_size: int, dim: int) -> int:
    """The bytes a step's collectives carry for the table (`table_blocks`' count): C ids a
    replica, C its share of the batch times the ids an example."""
    capacity = global_batch_size // replicas * LOOKUPS
    if replicas == 1:
        return 0
    rows = 4 * replicas * capacity * dim
    ids = 8 * replicas * capacity
    # placed: the ids, the rows forward and their gradients back; replicated: the gradients'
    # ids and rows, all-gathered.
    return ids + 2 * rows if mode == "placed" else ids + rows


def speed_case(args) -> dict:
    """In this process: both modes' steps on `--speed_case`'s replicas and rows, timed."""
    import loops

    replicas, table_rows = (int(part) for part in args.speed_case.split(","))
    loops.configure_logical_cpus(replicas)
    strategy = loops.testing.replica_strategy(replicas)
    steppers = {
        mode: make_step(strategy, mode, table_rows, args.dim, args.global_batch_size)
        for mode in MODES
    }
    for step in steppers.values():
        step()  # trace
        step()
    measured = embedding_tables.steps_per_second(steppers, args.steps, args.rounds)
    rates = {mode: measured[mode][0] for mode in MODES}
    return {
        "rows": table_rows,
        "dim": args.dim,
        "replicas": replicas,
        **{f"{mode}_steps_per_second": rates[mode] for mode in MODES},
        **{f"{mode}_cpu_ms_per_step": measured[mode][1] for mode in MODES},
        "placed_over_replicated": rates["placed"] / rates["replicated"],
        **{
            f"{mode}_bytes_exchanged": exchanged_bytes(
                mode, replicas, args.global_batch_size, args.dim
            )
            for mode in MODES
        },
    }


def speed(args) -> list[dict]:
    """Each (replicas, rows) in a process of its own (`speed_case`): one case's tables are
    gone before the next one's are made."""
    rows = []
    for replicas in args.replicas:
        for table_rows in args.rows:
            case = [f"--speed_case={replicas},{table_rows}", f"--dim={args.dim}"]
            case += [f"--steps={args.steps}", f"--rounds={args.rounds}"]
            rows.append(_in_own_process([*case, f"--global_batch_size={args.global_batch_size}"]))
            print(format_speed(rows[-1:]).splitlines()[-1], flush=True)
    return rows


def _in_own_process(arguments: list[str]) -> dict:
    """What this module prints last, run as `python -m benchmarks.placed_tables ARGUMENTS`."""
    command = [sys.executable, "-m", "benchmarks.placed_tables", *arguments]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(args) -> dict:
    return {"memory": memory(args), "speed": speed(args)}


def format_memory(cases: list[dict]) -> str:
    one = next(
        c["grown_mb"] for c in cases if (c["mode"], str(c["replicas"])) == ("replicated", "1")
    )
    lines = [f"{'mode':>10} {'replicas':>9} {'grown MB':>9} {'vs 1 replica':>12} {'/ table':>8}"]
    for case in cases:
        mode, replicas, mb = case["mode"], str(case["replicas"]), case["grown_mb"]
        lines.append(
            f"{mode:>10} {replicas:>9} {mb:9,.0f} {mb / one:12.2f} {case['over_table']:8.2f}"
        )
    return "\n".join(lines)


def format_speed(rows: list[dict]) -> str:
    lines = [
        f"{'rows':>9} {'replicas':>8} {'replicated steps/s':>18} {'placed steps/s':>14} "
        f"{'placed/replicated':>17} {'replicated MB/step':>18} {'placed MB/step':>14}"
    ]
    for row in rows:
        lines.append(
            f"{row['rows']:>9} {row['replicas']:>8} {row['replicated_steps_per_second']:18.1f} "
            f"{row['placed_steps_per_second']:14.1f} {row['placed_over_replicated']:17.2f} "
            f"{row['replicated_bytes_exchanged'] / 1e6:18.2f} "
            f"{row['placed_bytes_exchanged'] / 1e6:14.2f}"
        )
    return "\n".join(lines)


def format_table(results: dict) -> str:
    return format_memory(results["memory"]) + "\n\n" + format_speed(results["speed"])


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.case or args.speed_case:
        print(json.dumps(memory_case(args) if args.case else speed_case(args)), flush=True)
        return 0
    return report.run(argv, parse_args, measure, format_table)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sys.exit(main())
