"""XLA on against off: loops training steps/s with and without `jit_compile`, side by side.

    python -m benchmarks.jit_compile                    # mlp, cnn and lm; 1 and 2 replicas
    python -m benchmarks.jit_compile --models=mlp --replicas=1 --steps=20 --rounds=1

For each model and replica count, two Trainers train the same model (same
initial weights, Adam, the same batches) end to end (`Trainer.train`), one
with `jit_compile=False` and one with `jit_compile=True`, in one process;
rounds are interleaved between them and each one's median steps/s reported,
with on/off. The classifiers are the throughput benchmark's (digits, global
batch 64); the LM is the `loops-lm` default Transformer on the LM
benchmark's windows (global batch 32, sequence length 128).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from benchmarks import report
from benchmarks.throughput import interleaved_rates, warmed_up

MODELS = ("mlp", "cnn", "lm")
MODES = ("off", "on")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,cnn,lm", help="comma-separated: mlp, cnn, lm")
    parser.add_argument("--replicas", default="1,2", help="comma-separated replica counts")
    parser.add_argument(
        "--steps", type=int, default=0, help="timed steps per mode per round; 0: the model's own"
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median taken)")
    parser.add_argument("--steps_per_loop", type=int, default=50)
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "jit_compile.json")
    )
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.replicas = [int(r) for r in args.replicas.split(",") if r]
    for name in args.models:
        if name not in MODELS:
            parser.error(f"--models: unknown model {name!r}; use {', '.join(MODELS)}")
    if any(r < 1 for r in args.replicas) or args.steps < 0 or args.rounds < 1:
        parser.error("--replicas and --rounds must be >= 1, --steps >= 0")
    return args


# Timed steps a round where --steps is 0: about 2 s a round on 2 cores.
DEFAULT_STEPS = {"mlp": 1000, "cnn": 500, "lm": 20}


def trainer(model_name: str, replicas: int, jit_compile: bool, args):
    """A Trainer of `model_name` on `replicas` replicas with jit_compile on or off."""
    import keras

    import loops

    settings = dict(
        steps_per_loop=args.steps_per_loop,
        progress=loops.testing.quiet_progress(),
        jit_compile=jit_compile,
    )
    if model_name == "lm":
        from benchmarks import lm_throughput

        lm_args = lm_throughput.parse_args([f"--replicas={replicas}"])
        setup = lm_throughput.Setup(replicas, lm_args)
        definition: loops.Loop = loops.LanguageModelLoop(
            model_fn=setup.model_fn,
            optimizer_fn=lambda: keras.optimizers.Adam(1e-3),
            sequence_length=lm_args.sequence_length,
            sample_prompts=(),
        )
    else:
        from benchmarks import throughput

        setup = throughput.Setup(model_name, replicas, throughput.parse_args([]))
        definition = loops.ClassifierLoop(
            model_fn=setup.model_fn, optimizer_fn=lambda: keras.optimizers.Adam(1e-3)
        )
    return loops.Trainer(definition, strategy=setup.strategy, train_data=setup.data_fn, **settings)


def measure(args) -> list[dict]:
    rows = []
    for model_name in args.models:
        steps = args.steps or DEFAULT_STEPS[model_name]
        for replicas in args.replicas:

            def runner(jit_compile: bool, model_name=model_name, replicas=replicas):
                loop = trainer(model_name, replicas, jit_compile, args)
                return lambda count: loop.train(loop.state.step + count)

            builders = {"off": lambda: runner(False), "on": lambda: runner(True)}
            runners = warmed_up(builders, argparse.Namespace(steps=steps, steps_per_loop=steps))
            samples = interleaved_rates(runners, steps, args.rounds)
            rates = {name: statistics.median(values) for name, values in samples.items()}
            row = {"model": model_name, "replicas": replicas, "steps": steps}
            for name in MODES:
                if name in rates:
                    row[name] = {"steps_per_second": rates[name], "samples": samples[name]}
                else:
                    row[name] = {"error": runners[name]}
            if len(rates) == len(MODES):
                row["on_over_off"] = rates["on"] / rates["off"]
            rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    lines = [f"{'model':6} {'replicas':>8} {'off steps/s':>12} {'on steps/s':>11} {'on/off':>7}"]
    for row in rows:
        rates = [row[name].get("steps_per_second") for name in MODES]
        if None in rates:
            errors = "; ".join(
                f"{name}: {row[name]['error']}" for name in MODES if "error" in row[name]
            )
            lines.append(f"{row['model']:6} {row['replicas']:>8} {errors}")
            continue
        lines.append(
            f"{row['model']:6} {row['replicas']:>8} {rates[0]:12.1f} {rates[1]:11.1f} "
            f"{row['on_over_off']:7.2f}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    return report.run(argv, parse_args, measure, format_table)


if __name__ == "__main__":
    sys.exit(main())
