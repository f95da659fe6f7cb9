"""Language-model throughput in real tokens per second: loops vs Keras fit vs the compute bound.

    python -m benchmarks.lm_throughput                   # 1 and 2 replicas
    python -m benchmarks.lm_throughput --replicas=1 --steps=5 --rounds=1

Every mode trains the same byte-level Transformer (the `loops-lm` default,
same initial weights) with Adam on the same padded windows of Python's
standard-library source, under the same strategy, in one process; rounds are
interleaved across modes and each mode's median is reported:

- compute_bound: the LM's train step repeated in one tf.function on one
  fixed batch: no input pipeline, no host reads.
- loops: `LanguageModelLoop.train`, end to end.
- keras_fit: `Model.fit` (its defaults) on the same batches, the padding
  masked by per-token sample weights.

Tokens per second are steps per second times the mean real (predicted)
tokens of the stream's batches, the same for every mode.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from benchmarks import report
from benchmarks.throughput import interleaved_rates, repeated_step

MODES = ("compute_bound", "loops", "keras_fit")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="1,2", help="comma-separated replica counts")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per mode per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (median taken)")
    parser.add_argument("--global_batch_size", type=int, default=32)
    parser.add_argument("--sequence_length", type=int, default=128)
    parser.add_argument("--steps_per_loop", type=int, default=20)
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "lm_throughput.json")
    )
    args = parser.parse_args(argv)
    args.replicas = [int(r) for r in args.replicas.split(",") if r]
    if any(r < 1 for r in args.replicas) or args.steps < 1 or args.rounds < 1:
        parser.error("--replicas, --steps and --rounds must be >= 1")
    return args


class Setup:
    """One replica count, shared by every mode."""

    def __init__(self, replicas: int, args):
        import loops
        from loops_data import python_text
        from loops_models import lm

        self.args = args
        self.strategy = loops.testing.replica_strategy(replicas)
        self.model_fn = lambda: lm.transformer_lm(sequence_length=args.sequence_length, seed=0)
        self.data_fn = lambda: python_text.global_batches(
            "train",
            sequence_length=args.sequence_length,
            global_batch_size=args.global_batch_size,
            shuffle_seed=0,
            repeat=True,
        )


def mean_tokens_per_step(setup: Setup, batches: int = 200) -> float:
    lengths = [
        float((batch_lengths - 1).sum())
        for _, batch_lengths in setup.data_fn().take(batches).as_numpy_iterator()
    ]
    return statistics.fmean(lengths)


def lm_loop(setup: Setup, **loop_args):
    import keras

    import loops

    return loops.Trainer(
        loops.LanguageModelLoop(
            model_fn=setup.model_fn,
            optimizer_fn=lambda: keras.optimizers.Adam(1e-3),
            sequence_length=setup.args.sequence_length,
            sample_prompts=(),
        ),
        strategy=setup.strategy,
        train_data=setup.data_fn,
        progress=loops.testing.quiet_progress(),
        **loop_args,
    )


def compute_bound(setup: Setup):
    return repeated_step(lm_loop(setup), setup.strategy, setup.data_fn)


def loops_mode(setup: Setup):
    loop = lm_loop(setup, steps_per_loop=setup.args.steps_per_loop)
    return lambda steps: loop.train(loop.state.step + steps)


def keras_fit(setup: Setup):
    import keras
    import tensorflow as tf

    with setup.strategy.scope():
        model = setup.model_fn()
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )

    def weighted(tokens, lengths):
        mask = tf.sequence_mask(lengths - 1, tf.shape(tokens)[1] - 1, dtype=tf.float32)
        return tokens[:, :-1], tokens[:, 1:], mask

    dataset = setup.data_fn().map(weighted)
    return lambda steps: model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)


def measure(args) -> list[dict]:
    rows = []
    for replicas in args.replicas:
        setup = Setup(replicas, args)
        tokens = mean_tokens_per_step(setup)
        runners = {}
        for name, build in (
            ("compute_bound", compute_bound),
            ("loops", loops_mode),
            ("keras_fit", keras_fit),
        ):
            try:
                runner = build(setup)
                runner(min(args.steps, args.steps_per_loop))  # trace and warm up
                runners[name] = runner
            except Exception as error:  # a mode that cannot run here is reported, not fatal
                runners[name] = f"failed: {type(error).__name__}: {str(error).splitlines()[0]}"
        samples = interleaved_rates(runners, args.steps, args.rounds)
        rates = {name: statistics.median(values) for name, values in samples.items()}
        for name in MODES:
            row = {"replicas": replicas, "mode": name, "tokens_per_step": tokens}
            if name in rates:
                row.update(
                    steps_per_second=rates[name],
                    tokens_per_second=rates[name] * tokens,
                    ratio_to_bound=rates[name] / rates.get("compute_bound", float("nan")),
                    ratio_to_fit=rates[name] / rates.get("keras_fit", float("nan")),
                    samples=samples[name],
                )
            else:
                row["error"] = runners[name]
            rows.append(row)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import loops

    loops.configure_logical_cpus(max(args.replicas))
    rows = measure(args)
    print(
        f"{'replicas':>8} {'mode':14} {'tokens/s':>10} {'steps/s':>8} {'x bound':>8} {'x fit':>6}"
    )
    for row in rows:
        if "error" in row:
            print(f"{row['replicas']:>8} {row['mode']:14} {row['error']}")
            continue
        print(
            f"{row['replicas']:>8} {row['mode']:14} {row['tokens_per_second']:10.0f} "
            f"{row['steps_per_second']:8.2f} {row['ratio_to_bound']:8.2f} "
            f"{row['ratio_to_fit']:6.2f}"
        )
    report.write(args, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
