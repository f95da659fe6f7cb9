"""Training on data read from disk by index: throughput against the input and compute bounds.

    python -m benchmarks.streaming                     # 100,000 images, cnn, 1 and 2 replicas
    python -m benchmarks.streaming --train_examples=2000 --replicas=1 --steps=20 --rounds=1

Generates the colored-digits dataset (JPEG-encoded 32x32x3 images in several
TFRecord shards, a TFDS dataset) and trains on it as `loops-classifier
--data_dir=DATASET --input_from=disk --augment=crop_flip` does: every example
read by index, decoded and augmented on the fly, the whole dataset shuffled
each epoch. In one process, rounds interleaved across modes, medians:

- input_bound: the train input alone (the iterator loops reads, each batch
  handed to the replicas), no model.
- compute_bound: the classifier's train step repeated on one fixed batch.
- loops: `ClassifierLoop.train` on the stream, end to end, its input
  threads at `--input_nice` (the binary's default).
- loops_nice_19: the same with `--input_nice=19` (the input's own threads,
  lowered).
- keras_fit: `Model.fit` with its defaults on the stream with `--input_nice=0`
  (tf.data's own threads).
- loops_beside_busy, loops_nice_19_beside_busy: loops and loops_nice_19 while
  `--busy_processes` other processes (a Python busy loop each) share the
  cores, as on a machine shared with other jobs: a niceness counts against
  every process, not only the step. `--busy_processes=0` leaves them out.

Each mode's rate is given against two limits: min(input bound, compute
bound), reached only where the input runs beside the step on cores of its
own; and the additive bound 1 / (1 / input bound + 1 / compute bound), where
they take turns on the same cores (each bound is measured using every core).

Then, in fresh processes of the binary: seconds from process start to the
end of the first training step, resuming at step 0 and at a late step
(`resume_seconds`). And the resident memory of the input over many epochs.
Writes benchmarks/results/streaming.json.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import report, throughput
from benchmarks.memory import resident_bytes

MODES = (
    "input_bound",
    "compute_bound",
    "loops",
    "loops_nice_19",
    "keras_fit",
    "loops_beside_busy",
    "loops_nice_19_beside_busy",
)
BUSY_LOOP = "while True: pass"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="cnn", help="comma-separated: mlp, cnn")
    parser.add_argument("--replicas", default="1,2", help="comma-separated replica counts")
    parser.add_argument("--train_examples", type=int, default=100_000)
    parser.add_argument("--test_examples", type=int, default=1_000)
    parser.add_argument("--num_shards", type=int, default=8)
    parser.add_argument(
        "--data_dir",
        default=None,
        help="where the generated dataset is kept and reused (default: a temporary folder)",
    )
    parser.add_argument("--steps", type=int, default=200, help="timed steps per mode per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median taken)")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--steps_per_loop", type=int, default=50)
    parser.add_argument(
        "--input_nice",
        type=int,
        default=settings_default("input_nice"),
        help="niceness of the input threads of the loops mode (loops-classifier's default)",
    )
    parser.add_argument(
        "--busy_processes",
        type=int,
        default=2,
        help="busy processes beside the *_beside_busy modes (0: leave those modes out)",
    )
    parser.add_argument(
        "--resume_step", type=int, default=50_000, help="the late step a run resumes at"
    )
    parser.add_argument("--resume_rounds", type=int, default=3)
    parser.add_argument(
        "--memory_epochs", type=int, default=10, help="epochs of input read for the memory"
    )
    parser.add_argument("--output", default=os.path.join("benchmarks", "results", "streaming.json"))
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.replicas = [int(r) for r in args.replicas.split(",") if r]
    for name in args.models:
        if name not in ("mlp", "cnn"):
            parser.error(f"--models: unknown model {name!r}; use mlp and/or cnn")
    for name in ("train_examples", "test_examples", "steps", "rounds", "resume_rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.busy_processes < 0:
        parser.error(f"--busy_processes must be >= 0, got {args.busy_processes}")
    if any(r < 1 for r in args.replicas) or args.memory_epochs < 2 or args.resume_step < 1:
        parser.error("--replicas and --resume_step must be >= 1, --memory_epochs >= 2")
    return args


def settings_default(name: str):
    from loops_data import settings

    (setting,) = (s for s in settings.IMAGE_CLASSIFICATION if s.name == name)
    return setting.flag_default


def train_streams(dataset_dir: str, args, input_nice: int | None = None):
    """The streams `loops-classifier --input_from=disk --augment=crop_flip` reads (its niceness)."""
    from loops_data import image_streams

    return image_streams.from_tfds_directory(
        dataset_dir,
        train_split="train",
        eval_split="test",
        global_batch_size=args.global_batch_size,
        seed=0,
        augment="crop_flip",
        input_nice=args.input_nice if input_nice is None else input_nice,
    )


class Setup:
    """One (model, replica count) on the streamed dataset, as `benchmarks.throughput` uses it."""

    def __init__(self, model_name: str, replicas: int, dataset_dir: str, args):
        import loops
        import loops_models as models

        self.args = args
        self.strategy = loops.testing.replica_strategy(replicas)
        self.batch = args.global_batch_size
        streams = train_streams(dataset_dir, args)
        self.data_fn = streams.train
        self.dataset_dir = dataset_dir
        self.model_fn = lambda: models.build_classifier(
            model_name, input_shape=streams.spec.input_shape, num_classes=10, seed=0
        )


def input_bound(setup: Setup):
    """steps -> None: the loop's train iterator read `steps` times in one tf.function, no model."""
    import tensorflow as tf

    from loops.input import distributed_input

    strategy = setup.strategy
    iterator = distributed_input.train_iterator(strategy, setup.data_fn)

    @tf.function
    def read(steps):
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            batch = distributed_input.next_batch(iterator, strategy)
            # Each replica touches its slice, as a step would.
            sums = strategy.run(
                lambda images, labels: tf.reduce_sum(tf.cast(labels, tf.float32)), args=batch
            )
            total += strategy.reduce(tf.distribute.ReduceOp.SUM, sums, axis=None)
        return total

    return lambda steps: read(tf.constant(steps)).numpy()


def at_nice(setup: Setup, input_nice: int):
    """The same setup on the stream read at `input_nice`."""
    other = copy.copy(setup)
    other.data_fn = train_streams(setup.dataset_dir, setup.args, input_nice=input_nice).train
    return other


def beside_busy(run, count: int):
    """`run` (steps -> None) timed while `count` busy processes share the cores."""

    def run_beside_busy(steps):
        busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
        try:
            return run(steps)
        finally:
            for process in busy:
                process.kill()
                process.wait()

    return run_beside_busy


def build_modes(setup: Setup) -> dict:
    builders = {
        "input_bound": lambda: input_bound(setup),
        "compute_bound": lambda: throughput.compute_bound(setup),
        "loops": lambda: throughput.loops_mode(setup),
        "loops_nice_19": lambda: throughput.loops_mode(at_nice(setup, 19)),
        "keras_fit": lambda: throughput.keras_fit(at_nice(setup, 0), 1),
    }
    busy = setup.args.busy_processes
    if busy:
        builders["loops_beside_busy"] = lambda: beside_busy(throughput.loops_mode(setup), busy)
        builders["loops_nice_19_beside_busy"] = lambda: beside_busy(
            throughput.loops_mode(at_nice(setup, 19)), busy
        )
    return throughput.warmed_up(builders, setup.args)


def measure(args, dataset_dir: str) -> list[dict]:
    rows = []
    for model_name in args.models:
        for replicas in args.replicas:
            setup = Setup(model_name, replicas, dataset_dir, args)
            runners = build_modes(setup)
            samples = throughput.interleaved_rates(runners, args.steps, args.rounds)
            rates = {name: statistics.median(values) for name, values in samples.items()}
            input_rate = rates.get("input_bound", float("inf"))
            compute_rate = rates.get("compute_bound", float("inf"))
            bound = min(input_rate, compute_rate)
            additive_bound = 1 / (1 / input_rate + 1 / compute_rate)
            errors = {name: runner for name, runner in runners.items() if not callable(runner)}
            built = [name for name in MODES if name in runners]
            # Input threads that read with Python must end while Python runs.
            runners.clear()
            gc.collect()
            for name in built:
                row = {"model": model_name, "replicas": replicas, "mode": name}
                if name in rates:
                    row.update(
                        steps_per_second=rates[name],
                        ratio_to_bound=rates[name] / bound,
                        ratio_to_additive_bound=rates[name] / additive_bound,
                        ratio_to_fit=rates[name] / rates.get("keras_fit", float("nan")),
                        samples=samples[name],
                    )
                else:
                    row["error"] = errors[name]
                rows.append(row)
    return rows


def input_memory(dataset_dir: str, args) -> dict:
    """Resident memory after each of `memory_epochs` epochs of the train input, read alone."""

    streams = train_streams(dataset_dir, args)
    samples = _resident_after_epochs(
        streams.train(),
        batches_per_epoch=max(1, args.train_examples // args.global_batch_size),
        epochs=args.memory_epochs,
    )
    gc.collect()  # its input threads read with Python: end them while Python runs
    return {
        "epochs": args.memory_epochs,
        "rss_mib_after_first_epoch": samples[0],
        "rss_mib_after_last_epoch": samples[-1],
        "growth": samples[-1] / samples[0] - 1.0,
        "rss_mib_per_epoch": samples,
    }


def _resident_after_epochs(dataset, *, batches_per_epoch: int, epochs: int) -> list[float]:
    import tensorflow as tf

    iterator = iter(dataset)

    @tf.function
    def epoch():
        total = tf.constant(0, tf.int64)
        for _ in tf.range(batches_per_epoch):
            total += tf.reduce_sum(next(iterator)[1])
        return total

    samples = []
    for _ in range(epochs):
        epoch().numpy()
        samples.append(resident_bytes() / 2**20)
    return samples


def binary_flags(model_dir: str, dataset_dir: str, args) -> list[str]:
    return [
        f"--model_dir={model_dir}",
        f"--data_dir={dataset_dir}",
        "--input_from=disk",
        "--augment=crop_flip",
        f"--model={args.models[0]}",
        f"--global_batch_size={args.global_batch_size}",
        "--steps_per_loop=1",
        "--eval_every=0",
        f"--input_nice={args.input_nice}",
    ]


def write_checkpoint_at(step: int, flags: list[str]) -> None:
    """Saves the binary's loop, as built from `flags`, with its step set to `step` (no training).

    Stands in for a run stopped at `step`: what a resume reads is the step,
    not the weights' values.
    """
    from absl import flags as absl_flags

    from loops.bin import classifier

    absl_flags.FLAGS(["classifier", *flags, f"--train_steps={step}"])
    loop = classifier.build_trainer()
    loop.global_step.assign(step)
    loop.controller.save_checkpoint()
    loop.close()


def seconds_to_first_step(model_dir: str, step: int, dataset_dir: str, args) -> float:
    """Seconds from starting the binary to its progress line for step `step` + 1."""
    command = [
        sys.executable,
        "-m",
        "loops.bin.classifier",
        *binary_flags(model_dir, dataset_dir, args),
        f"--train_steps={step + 1}",
    ]
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        for line in process.stdout:
            if line.startswith(f"step {step + 1}/"):
                return time.perf_counter() - started
        raise RuntimeError(f"{' '.join(command)} exited {process.wait()} before its first step")
    finally:
        process.kill()
        process.wait()


def resume_seconds(dataset_dir: str, args, work_dir: str) -> tuple[dict, dict]:
    """Median seconds to the first finished step when resuming at 0 and at `resume_step`."""
    prepared = {}
    for step in (0, args.resume_step):
        prepared[step] = os.path.join(work_dir, f"prepared_{step}")
        if step:
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "import sys; from benchmarks.streaming import write_checkpoint_at; "
                    "write_checkpoint_at(int(sys.argv[1]), sys.argv[2:])",
                    str(step),
                    *binary_flags(prepared[step], dataset_dir, args),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        else:
            os.makedirs(prepared[step])
    samples: dict[str, list[float]] = {str(step): [] for step in prepared}
    for round_ in range(args.resume_rounds):
        for step, source in prepared.items():
            model_dir = os.path.join(work_dir, f"run_{step}_{round_}")
            shutil.copytree(source, model_dir)
            samples[str(step)].append(seconds_to_first_step(model_dir, step, dataset_dir, args))
    return {step: statistics.median(values) for step, values in samples.items()}, samples


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import loops

    loops.configure_logical_cpus(max(args.replicas))
    from loops_data import colored_digits

    with tempfile.TemporaryDirectory() as work_dir:
        started = time.perf_counter()
        dataset_dir = colored_digits.generate(
            args.data_dir or os.path.join(work_dir, "data"),
            train_examples=args.train_examples,
            test_examples=args.test_examples,
            num_shards=args.num_shards,
        )
        generated_seconds = time.perf_counter() - started
        dataset_bytes = sum(
            os.path.getsize(os.path.join(dataset_dir, name)) for name in os.listdir(dataset_dir)
        )
        rows = measure(args, dataset_dir)
        memory = input_memory(dataset_dir, args)
        resumes, resume_samples = resume_seconds(dataset_dir, args, work_dir)

    print(
        f"{'model':6} {'replicas':>8} {'mode':26} {'steps/s':>9} {'x min bound':>11} "
        f"{'x additive':>10} {'x fit':>6}"
    )
    for row in rows:
        if "error" in row:
            print(f"{row['model']:6} {row['replicas']:>8} {row['mode']:26} {row['error']}")
            continue
        print(
            f"{row['model']:6} {row['replicas']:>8} {row['mode']:26} "
            f"{row['steps_per_second']:9.1f} {row['ratio_to_bound']:11.2f} "
            f"{row['ratio_to_additive_bound']:10.2f} {row['ratio_to_fit']:6.2f}"
        )
    for step, seconds in resumes.items():
        print(f"resume at step {step}: {seconds:.1f} s from process start to the first step")
    print(
        f"input memory: {memory['rss_mib_after_first_epoch']:.0f} MiB after epoch 1, "
        f"{memory['rss_mib_after_last_epoch']:.0f} MiB after epoch {memory['epochs']} "
        f"({memory['growth']:+.1%})"
    )
    report.write(
        args,
        dataset={
            "train_examples": args.train_examples,
            "shards": args.num_shards,
            "bytes": dataset_bytes,
            "generated_seconds": generated_seconds,
        },
        rows=rows,
        resume_seconds=resumes,
        resume_samples=resume_samples,
        memory=memory,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
