"""What watching the loss for spikes (`on_loss_spike`) costs the host after each executor call.

    python -m benchmarks.loss_spike_cost

The watch runs on the host after each call, over the per-step losses the call
already returns: a scan of those values in Python, then one assign of its
state variable. Times both for calls of 100 and 1,000 steps (medians over
--rounds), as microseconds per call and per step, and writes
benchmarks/results/loss_spike_cost.json. The compiled step is unchanged,
so this is the whole cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "loss_spike_cost.json")
    )
    args = parser.parse_args(argv)
    import numpy as np

    from loops.run.faults.loss_spikes import LossSpikeRule, LossSpikeWatch

    watch = LossSpikeWatch(LossSpikeRule(factor=4.0, steps=3, window=100))
    rows = []
    for steps in (100, 1000):
        losses = np.random.default_rng(0).uniform(1.0, 2.0, steps).astype(np.float32)
        scans, commits = [], []
        for _ in range(args.rounds):
            started = time.perf_counter()
            _, state = watch.scan(losses, 0)
            scanned = time.perf_counter()
            watch.commit(state)
            scans.append(scanned - started)
            commits.append(time.perf_counter() - scanned)
        scan_us, commit_us = statistics.median(scans) * 1e6, statistics.median(commits) * 1e6
        rows.append(
            {
                "steps_per_call": steps,
                "scan_us_per_call": round(scan_us, 1),
                "assign_us_per_call": round(commit_us, 1),
                "us_per_step": round((scan_us + commit_us) / steps, 3),
            }
        )
        print(
            f"{steps} steps a call: scan {scan_us:.0f} us + assign {commit_us:.0f} us a call, "
            f"{(scan_us + commit_us) / steps:.2f} us a step"
        )
    os.makedirs(os.path.dirname(args.output) or ".", exist_ok=True)
    with open(args.output, "w") as stream:
        json.dump({"rows": rows, "load_average": os.getloadavg()}, stream, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
