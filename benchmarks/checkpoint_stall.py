"""How long training stalls for a checkpoint, written synchronously or in the background.

    python -m benchmarks.checkpoint_stall                # 105 MB model (315 MB with Adam)
    python -m benchmarks.checkpoint_stall --width=512 --steps=20 --rounds=1   # a quick look

Trains an MLP on the bundled digits in one process, side by side in each
round: inner loops of --every steps with no checkpoint between them, then with
a checkpoint after each written synchronously, then written in the background
(`async_checkpoints`). The time between two progress lines is an inner loop
plus what a save costs the training; the stall of a save is the median of
those intervals minus the median without saves (medians over every interval
of every round, so a busy moment of the machine moves them little). Writes
benchmarks/results/checkpoint_stall.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

MODES = ("no_saves", "sync", "async")


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
    from loops.core import reporting

    def model_fn():
        hidden = [keras.layers.Dense(args.width, activation="relu") for _ in range(args.layers)]
        return keras.Sequential(
            [keras.Input((8, 8, 1)), keras.layers.Flatten(), *hidden, keras.layers.Dense(10)]
        )

    class Stamps(reporting.Progress):
        """Records when each inner loop's progress line comes."""

        def __init__(self):
            super().__init__(stream=open(os.devnull, "w"))
            self.times: list[float] = []

        def train(self, *args, **kwargs):
            self.times.append(time.perf_counter())

    def intervals(mode: str) -> tuple[list[float], int]:
        """(seconds between progress lines after the first, bytes of the variables) in `mode`."""
        stamps = Stamps()
        with tempfile.TemporaryDirectory() as model_dir:
            trainer = loops.Trainer(
                loops.ClassifierLoop(
                    model_fn=model_fn, optimizer_fn=lambda: keras.optimizers.Adam(1e-4)
                ),
                train_data=lambda: data.global_batches(
                    "digits", "train", global_batch_size=64, shuffle_seed=0, repeat=True
                ),
                steps_per_loop=args.every,
                checkpoint_every=None if mode == "no_saves" else args.every,
                model_dir=model_dir,
                async_checkpoints=mode == "async",
                progress=stamps,
            )
            trainer.train(args.steps)
            size = sum(
                variable.numpy().nbytes
                for item in trainer.saved_items().values()
                for variable in getattr(item, "variables", [])
            )
            trainer.close()
        # The first inner loop holds the tracing; each later one follows a save (but "no_saves").
        times = stamps.times[1:]
        return [later - earlier for earlier, later in zip(times, times[1:])], size

    samples: dict[str, list[float]] = {mode: [] for mode in MODES}
    size = 0
    for _ in range(args.rounds):
        for mode in MODES:
            found, size = intervals(mode)
            samples[mode].extend(found)
    median = {mode: statistics.median(values) for mode, values in samples.items()}
    stall = {mode: median[mode] - median["no_saves"] for mode in ("sync", "async")}
    report = {
        "config": vars(args),
        "variable_bytes": size,
        "interval_seconds": samples,
        "median_interval_seconds": median,
        "stall_seconds_per_save": stall,
        "async_over_sync": stall["async"] / stall["sync"] if stall["sync"] > 0 else None,
    }
    print(
        f"variables {size / 2**20:.0f} MiB, {len(samples['sync'])} saves, median over "
        f"{args.rounds} round(s): "
        f"stall per save sync {stall['sync'] * 1e3:.0f} ms, async {stall['async'] * 1e3:.0f} ms "
        f"(async / sync {report['async_over_sync']:.2f})"
    )
    reporting.write_json_atomic(args.output, report)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
