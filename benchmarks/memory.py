"""Resident memory and tracing over a long classifier run: does anything grow?

    python -m benchmarks.memory                   # 10,000 steps, 2 replicas
    python -m benchmarks.memory --steps=2000 --checkpoint_every=500

Trains the digits classifier with checkpoints, evaluation and summaries on
(the binary's defaults otherwise) and samples the process's resident memory at
the inner-loop boundaries. Reports the growth between step 1,000 (after
warm-up) and the last step, and the number of traces of the train and eval
functions. Writes benchmarks/results/memory.json.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile


def resident_bytes() -> int:
    with open("/proc/self/statm") as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--baseline_step", type=int, default=1_000)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--steps_per_loop", type=int, default=100)
    parser.add_argument("--checkpoint_every", type=int, default=1_000)
    parser.add_argument("--output", default=os.path.join("benchmarks", "results", "memory.json"))
    args = parser.parse_args(argv)
    if not 0 < args.baseline_step < args.steps:
        parser.error(f"--baseline_step must lie in (0, --steps), got {args.baseline_step}")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    import loops
    import loops_data as data
    import loops_models as models

    strategy = loops.testing.replica_strategy(args.replicas)
    samples: dict[int, int] = {}

    class Sampling(loops.core.reporting.Progress):
        def train(self, step, total, metrics, steps_per_second):
            samples[step] = resident_bytes()

    def batches(split, seed, repeat):
        return lambda: data.global_batches(
            "digits", split, global_batch_size=64, shuffle_seed=seed, repeat=repeat
        )

    with tempfile.TemporaryDirectory() as model_dir:
        loop = loops.Trainer(
            loops.ClassifierLoop(
                model_fn=lambda: models.mlp(input_shape=(8, 8, 1), num_classes=10),
                optimizer_fn=lambda: keras.optimizers.Adam(1e-3),
            ),
            strategy=strategy,
            train_data=batches("train", 0, True),
            eval_data=batches("test", None, False),
            steps_per_loop=args.steps_per_loop,
            checkpoint_every=args.checkpoint_every,
            eval_every=args.checkpoint_every,
            model_dir=model_dir,
            progress=Sampling(),
        )
        loop.train(args.steps)
        traces = {
            "train": loop.executor.train_function.experimental_get_tracing_count(),
            "eval": loop.executor.eval_function.experimental_get_tracing_count(),
        }
        loop.close()
    baseline = samples[min(s for s in samples if s >= args.baseline_step)]
    final = samples[max(samples)]
    report = {
        "steps": args.steps,
        "replicas": args.replicas,
        "rss_mib_at_baseline": baseline / 2**20,
        "rss_mib_at_end": final / 2**20,
        "growth": final / baseline - 1.0,
        "traces": traces,
        "samples_mib": {step: rss / 2**20 for step, rss in sorted(samples.items())},
    }
    print(
        f"resident memory: {baseline / 2**20:.1f} MiB at step {args.baseline_step}, "
        f"{final / 2**20:.1f} MiB at step {max(samples)}: growth {report['growth']:+.2%}; "
        f"traces: train {traces['train']}, eval {traces['eval']}"
    )
    loops.core.reporting.write_json_atomic(args.output, report)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
