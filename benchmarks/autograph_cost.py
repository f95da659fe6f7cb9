"""What AutoGraph's rewriting of loops' own functions costs a binary: the default classifier
run with loops' rule (`on`: loops' functions called as written, a user's and the kinds'
converted) and without it (`off`: AutoGraph rewrites every function a traced one calls).

    python -m benchmarks.autograph_cost                 # 2 rounds of 200 steps
    python -m benchmarks.autograph_cost --rounds=3 --train_steps=100

Each run is a fresh process (conversion is paid once per process), rounds interleaved;
it prints each run's CPU (user + system) and wall seconds, its last evaluation line (the
two modes train the same numbers), and the ratio of the medians' CPU.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time


def child(mode: str, model_dir: str, train_steps: int) -> None:
    """One classifier run in this process, with loops' AutoGraph rule or without it."""
    if mode == "off":
        from loops import tf_private

        tf_private.leave_unconverted_by_autograph = lambda package, **_: None
    from loops.bin import classifier

    sys.argv = ["loops-classifier", f"--model_dir={model_dir}", f"--train_steps={train_steps}"]
    classifier.run()


def timed_run(mode: str, train_steps: int) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, last evaluation line) of one child process."""
    with tempfile.TemporaryDirectory() as scratch:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.autograph_cost", f"--child={mode}"]
            + [f"--model_dir={scratch}/run", f"--train_steps={train_steps}"],
            capture_output=True,
            text=True,
            check=True,
        )
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    evals = [line for line in (done.stdout + done.stderr).splitlines() if "eval at step" in line]
    return cpu, wall, evals[-1] if evals else "(no evaluation line)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--train_steps", type=int, default=200)
    parser.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    parser.add_argument("--model_dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.model_dir, args.train_steps)
        return
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    for round_index in range(args.rounds):
        for mode in ("off", "on"):
            seconds, wall, last_eval = timed_run(mode, args.train_steps)
            cpu[mode].append(seconds)
            row = f"round {round_index + 1} {mode}: {seconds:.1f} s CPU, {wall:.1f} s wall"
            print(f"{row} | {last_eval}")
    ratio = statistics.median(cpu["on"]) / statistics.median(cpu["off"])
    print(f"CPU on / off (medians): {ratio:.2f}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
