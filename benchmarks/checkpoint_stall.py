"""How long training stalls for a checkpoint, written synchronously or in the background.

    python -m benchmarks.checkpoint_stall                # 105 MB model (315 MB with Adam)
    python -m benchmarks.checkpoint_stall --width=512 --steps=20 --rounds=1   # a quick look

Trains an MLP on the bundled digits in one process, one `Trainer.train` call
of --steps steps for each mode and round, side by side: no checkpoint but the
final one, a checkpoint every --every steps written synchronously, and the
same written in the background (`async_checkpoints`). The stall of a save is
the extra wall time over the run without them, divided by the saves (the
final save, waited for by every mode, cancels out). Writes
benchmarks/results/checkpoint_stall.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

MODES = ("final_only", "sync", "async")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--width", type=int, default=2560, help="units of each hidden layer")
    parser.add_argument("--layers", type=int, default=4, help="hidden layers")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10, help="steps between checkpoints")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "checkpoint_stall.json")
    )
    args = parser.parse_args(argv)
    if not 0 < args.every < args.steps:
        parser.error(f"--every must lie in (0, --steps), got {args.every}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    import loops
    import loops_data as data

    def model_fn():
        hidden = [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)]
        return keras.Sequential(
            [keras.Input((8, 8, 1)), keras.layers.Flatten(), *hidden, keras.layers.Dense(10)]
        )

    def timed_run(mode: str) -> tuple[float, int]:
        """(seconds of one train call, bytes of the variables) in `mode`."""
        with tempfile.TemporaryDirectory() as model_dir:
            trainer = loops.Trainer(
                loops.ClassifierLoop(
                    model_fn=model_fn, optimizer_fn=lambda: keras.optimizers.Adam(1e-4)
                ),
                train_data=lambda: data.global_batches(
                    "digits", "train", global_batch_size=64, shuffle_seed=0, repeat=True
                ),
                steps_per_loop=args.every,
                checkpoint_every=None if mode == "final_only" else args.every,
                model_dir=model_dir,
                async_checkpoints=mode == "async",
                progress=loops.core.reporting.Progress(stream=open(os.devnull, "w")),
            )
            trainer.train(1)  # traces the step and makes the first save's copies
            started = time.perf_counter()
            trainer.train(1 + args.steps)
            seconds = time.perf_counter() - started
            size = sum(
                variable.numpy().nbytes
                for item in trainer.saved_items().values()
                for variable in getattr(item, "variables", [])
            )
            trainer.close()
        return seconds, size

    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    size = 0
    for _ in range(args.rounds):
        for mode in MODES:
            seconds, size = timed_run(mode)
            samples[mode].append(seconds)
    saves = args.steps // args.every - (1 if args.steps % args.every == 0 else 0)
    median = {mode: statistics.median(values) for mode, values in samples.items()}
    stall = {mode: (median[mode] - median["final_only"]) / saves for mode in ("sync", "async")}
    report = {
        "config": vars(args),
        "variable_bytes": size,
        "saves_per_run": saves,
        "seconds": samples,
        "stall_seconds_per_save": stall,
        "async_over_sync": stall["async"] / stall["sync"] if stall["sync"] > 0 else None,
    }
    print(
        f"variables {size / 2**20:.0f} MiB, {saves} saves a run, median of {args.rounds}: "
        f"stall per save sync {stall['sync'] * 1e3:.0f} ms, async {stall['async'] * 1e3:.0f} ms "
        f"(async / sync {report['async_over_sync']:.2f})"
    )
    loops.core.reporting.write_json_atomic(args.output, report)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
