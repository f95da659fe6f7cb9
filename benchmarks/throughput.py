"""Side-by-side training throughput: loops vs Keras fit vs the tutorial loop vs the compute bound.

    python -m benchmarks.throughput                     # mlp and cnn, 1 and 2 replicas
    python -m benchmarks.throughput --models=mlp --replicas=1 --steps=50 --rounds=1

Every mode trains the same model (same initial weights) with the same Adam
optimizer on the same digits batches under the same strategy, in one process;
rounds are interleaved across modes and each mode's median is reported, in
steps/s and as a ratio of the compute bound:

- compute_bound: the loops classifier's train step repeated in one
  tf.function on one fixed batch, its outputs summed: no input pipeline, no
  host reads.
- loops: `ClassifierLoop.train`, end to end (input, inner loop, metrics).
- keras_fit: `Model.fit` with steps_per_execution=1 (its default).
- keras_fit_spe: `Model.fit` with steps_per_execution=steps_per_loop.
- tutorial: one `strategy.run` step per Python call (the TF tutorial loop).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

from benchmarks import report

MODES = ("compute_bound", "loops", "keras_fit", "keras_fit_spe", "tutorial")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn")
    parser.add_argument("--replicas", default="1,2", help="comma-separated replica counts")
    parser.add_argument(
        "--steps",
        type=int,
        default=300,
        help="timed steps per mode per round, at least (see --min_seconds)",
    )
    parser.add_argument(
        "--min_seconds",
        type=float,
        default=2.0,
        help="raise the steps per round so the compute bound takes about this "
        "long: short timings of fast models are mostly noise",
    )
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median taken)")
    parser.add_argument("--global_batch_size", type=int, default=64)
    parser.add_argument("--steps_per_loop", type=int, default=50)
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "throughput.json")
    )
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.replicas = [int(r) for r in args.replicas.split(",") if r]
    for name in args.models:
        if name not in ("mlp", "cnn"):
            parser.error(f"--models: unknown model {name!r}; use mlp and/or cnn")
    if any(r < 1 for r in args.replicas):
        parser.error(f"--replicas must be >= 1, got {args.replicas}")
    if args.steps < 1 or args.rounds < 1:
        parser.error("--steps and --rounds must be >= 1")
    if args.min_seconds < 0:
        parser.error(f"--min_seconds must be >= 0, got {args.min_seconds}")
    return args


class Setup:
    """One (model, replica count) configuration, shared by every mode."""

    def __init__(self, model_name: str, replicas: int, args):
        import loops
        import loops_data as data
        import loops_models as models

        self.args = args
        self.strategy = loops.testing.replica_strategy(replicas)
        self.batch = args.global_batch_size
        self.model_fn = lambda: models.build_classifier(
            model_name, input_shape=(8, 8, 1), num_classes=10, seed=0
        )
        self.data_fn = lambda: data.global_batches(
            "digits", "train", global_batch_size=self.batch, shuffle_seed=0, repeat=True
        )


def compute_bound(setup: Setup):
    import keras

    import loops

    loop = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=setup.model_fn, optimizer_fn=lambda: keras.optimizers.Adam(1e-3)
        ),
        strategy=setup.strategy,
        train_data=setup.data_fn,
        progress=loops.testing.quiet_progress(),
    )
    return repeated_step(loop, setup.strategy, setup.data_fn)


def repeated_step(loop, strategy, data_fn):
    """steps -> None: the definition's `train_step` that many times in one tf.function, one batch.

    The compute bound: no input pipeline and no host reads between steps.
    """
    import tensorflow as tf

    import loops

    batch = next(iter(loops.distribute(strategy, data_fn, repeat=True)))

    class FixedBatch:
        """Stands in for the input iterator: every step gets the same batch."""

        def __next__(self):
            return batch

    @tf.function
    def repeat(steps):
        # The step's outputs are consumed, as the loop consumes them: unused,
        # they would be pruned from the graph and the bound would skip work
        # that the train step does.
        total = tf.constant(0.0)
        for _ in tf.range(steps):
            outputs = tf.nest.flatten(loop.definition.train_step(FixedBatch()))  # typed outputs
            total += tf.add_n([tf.cast(value, tf.float32) for value in outputs])
        return total

    def run(steps):
        repeat(tf.constant(steps)).numpy()

    return run


def loops_mode(setup: Setup):
    import keras

    import loops

    loop = loops.Trainer(
        loops.ClassifierLoop(
            model_fn=setup.model_fn, optimizer_fn=lambda: keras.optimizers.Adam(1e-3)
        ),
        strategy=setup.strategy,
        train_data=setup.data_fn,
        steps_per_loop=setup.args.steps_per_loop,
        progress=loops.testing.quiet_progress(),
    )
    return lambda steps: loop.train(loop.state.step + steps)


def keras_fit(setup: Setup, steps_per_execution: int):
    import keras

    with setup.strategy.scope():
        model = setup.model_fn()
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            steps_per_execution=steps_per_execution,
        )
    dataset = setup.data_fn()
    return lambda steps: model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)


def tutorial(setup: Setup):
    import keras
    import tensorflow as tf

    strategy = setup.strategy
    with strategy.scope():
        model = setup.model_fn()
        optimizer = keras.optimizers.Adam(1e-3)
        optimizer.build(model.trainable_variables)
    iterator = iter(strategy.experimental_distribute_dataset(setup.data_fn()))

    def replica_step(images, labels):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=setup.batch)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def step(batch):
        losses = strategy.run(replica_step, args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    def run(steps):
        for _ in range(steps):
            loss = step(next(iterator))
        float(loss)

    return run


def build_modes(setup: Setup) -> dict:
    return warmed_up(
        {
            "compute_bound": lambda: compute_bound(setup),
            "loops": lambda: loops_mode(setup),
            "keras_fit": lambda: keras_fit(setup, 1),
            "keras_fit_spe": lambda: keras_fit(setup, setup.args.steps_per_loop),
            "tutorial": lambda: tutorial(setup),
        },
        setup.args,
    )


def warmed_up(builders: dict, args) -> dict:
    """name -> runner (steps -> None), each built, traced and warmed up; or the reason it failed."""
    runners = {}
    for name, build in builders.items():
        try:
            runner = build()
            runner(min(args.steps, args.steps_per_loop))  # trace and warm up
            runners[name] = runner
        except Exception as error:  # a mode that cannot run here is reported, not fatal
            runners[name] = f"failed: {type(error).__name__}: {str(error).splitlines()[0][:160]}"
    return runners


def timed_steps(runners: dict, args) -> int:
    """Steps per round: args.steps, raised so the compute bound runs about min_seconds."""
    bound = runners.get("compute_bound")
    if not callable(bound) or args.min_seconds == 0:
        return args.steps
    started = time.perf_counter()
    bound(args.steps)
    rate = args.steps / (time.perf_counter() - started)
    loops_per_round = math.ceil(rate * args.min_seconds / args.steps_per_loop)
    return max(args.steps, loops_per_round * args.steps_per_loop)


def interleaved_rates(runners: dict, steps: int, rounds: int) -> dict[str, list[float]]:
    """Steps per second of each runnable mode, `rounds` times, the modes taking turns."""
    samples: dict[str, list[float]] = {
        name: [] for name, runner in runners.items() if callable(runner)
    }
    for _ in range(rounds):
        for name in samples:
            started = time.perf_counter()
            runners[name](steps)
            samples[name].append(steps / (time.perf_counter() - started))
    return samples


def measure(args) -> list[dict]:
    rows = []
    for model_name in args.models:
        for replicas in args.replicas:
            setup = Setup(model_name, replicas, args)
            runners = build_modes(setup)
            steps = timed_steps(runners, args)
            samples = interleaved_rates(runners, steps, args.rounds)
            bound = (
                statistics.median(samples["compute_bound"]) if "compute_bound" in samples else None
            )
            for name in MODES:
                row = {"model": model_name, "replicas": replicas, "mode": name, "steps": steps}
                if name in samples:
                    rate = statistics.median(samples[name])
                    row.update(
                        steps_per_second=rate,
                        ratio_to_bound=rate / bound if bound else None,
                        samples=samples[name],
                    )
                else:
                    row["error"] = runners[name]
                rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'model':6} {'replicas':>8} {'mode':14} {'steps/s':>10} {'x bound':>8} {'x fit':>7}"]
    fit = {
        (r["model"], r["replicas"]): r.get("steps_per_second")
        for r in rows
        if r["mode"] == "keras_fit"
    }
    for row in rows:
        if "error" in row:
            lines.append(f"{row['model']:6} {row['replicas']:>8} {row['mode']:14} {row['error']}")
            continue
        base = fit.get((row["model"], row["replicas"]))
        versus_fit = f"{row['steps_per_second'] / base:7.2f}" if base else f"{'-':>7}"
        lines.append(
            f"{row['model']:6} {row['replicas']:>8} {row['mode']:14} "
            f"{row['steps_per_second']:10.1f} {row['ratio_to_bound']:8.2f} {versus_fit}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    return report.run(argv, parse_args, measure, format_table)


if __name__ == "__main__":
    sys.exit(main())
