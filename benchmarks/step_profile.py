"""Where a step's microseconds go: the profiler's self time of each event a step, per loop variant.

    python -m benchmarks.step_profile          # compute_bound, fixed_carried, read, executor
    python -m benchmarks.step_profile --modes=read,executor --steps=3000

Builds the variants of `benchmarks.inner_loop` (the 1-replica digits MLP by
default) with TensorFlow on one thread, so every kernel and every tf.data
call runs one after another and their times add up to the step. Each mode
runs `--steps` steps under TensorFlow's profiler; the trace's events (a
kernel, a dataset iterator's GetNext, a function run) are charged their self
time (their duration less the events nested in them on the same thread) and
summed by name, in us a step, with how many of them a step had ("Process"
is the graph executor's own work around each kernel). The profiler
adds its own cost to each event, so compare modes with each other, not with
`benchmarks.inner_loop`'s unprofiled times. Writes
benchmarks/results/step_profile.json.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import tempfile
import time

from benchmarks import inner_loop, report

DEFAULT_MODES = ("compute_bound", "fixed_carried", "read", "executor")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mlp", choices=("mlp", "cnn"))
    parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help="comma-separated")
    parser.add_argument("--steps", type=int, default=2000, help="profiled steps per mode")
    parser.add_argument("--chunk", type=int, default=50, help="as benchmarks.inner_loop's")
    parser.add_argument(
        "--min_us", type=float, default=0.3, help="events under this many us a step are left out"
    )
    parser.add_argument(
        "--output", default=os.path.join("benchmarks", "results", "step_profile.json")
    )
    args = parser.parse_args(argv)
    args.modes = [mode for mode in args.modes.split(",") if mode]
    unknown = sorted(set(args.modes) - set(inner_loop.MODES))
    if unknown or not args.modes:
        parser.error(f"--modes: unknown {unknown}; choose from {', '.join(inner_loop.MODES)}")
    if args.steps < 1 or args.steps % args.chunk:
        parser.error(f"--steps={args.steps} must be >= 1 and a multiple of --chunk={args.chunk}")
    return args


def self_times(xspace) -> dict[tuple[str, str], tuple[int, int]]:
    """(thread, event name) -> (self time in picoseconds, count) over the host's threads."""
    totals: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
    for plane in xspace.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        names = {key: meta.name for key, meta in plane.event_metadata.items()}
        for line in plane.lines:
            events = sorted(
                (event.offset_ps, event.duration_ps, names.get(event.metadata_id, "?"))
                for event in line.events
            )
            own = [duration for _, duration, _ in events]
            open_events: list[tuple[int, int]] = []  # (end, index), innermost last
            for index, (start, duration, _) in enumerate(events):
                while open_events and open_events[-1][0] <= start:
                    open_events.pop()
                if open_events:  # nested in the innermost open event: not its own time
                    own[open_events[-1][1]] -= duration
                open_events.append((start + duration, index))
            thread = line.name.split("/")[0]
            for (_, _, name), time_ps in zip(events, own):
                entry = totals[(thread, name.rsplit(":", 1)[-1])]
                entry[0] += time_ps
                entry[1] += 1
    return {key: (value[0], value[1]) for key, value in totals.items()}


def profile(runner, steps: int) -> tuple[float, dict[tuple[str, str], tuple[int, int]]]:
    """`runner(steps)` under the profiler: its wall time in us a step, and its TensorFlow
    threads' events' self times and counts (the Python thread only waits for them)."""
    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    with tempfile.TemporaryDirectory() as logdir:
        tf.profiler.experimental.start(logdir)
        try:
            started = time.perf_counter()
            runner(steps)
            wall_us = (time.perf_counter() - started) / steps * 1e6
        finally:
            tf.profiler.experimental.stop()
        (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        xspace = xplane_pb2.XSpace()
        with open(path, "rb") as handle:
            xspace.ParseFromString(handle.read())
    events = {key: value for key, value in self_times(xspace).items() if key[0] != "python"}
    return wall_us, events


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import loops

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    loops.configure_logical_cpus(1)
    loop_args = inner_loop.parse_args(
        [f"--model={args.model}", f"--steps={args.steps}", f"--chunk={args.chunk}", "--threads=1"]
    )
    runners = inner_loop.build_modes(loop_args)
    for name in args.modes:
        runners[name](args.steps)  # warm: the profiled run holds no first-call work
    rows = []
    walls = {}
    for name in args.modes:
        walls[name], events = profile(runners[name], args.steps)
        for (thread, event), (time_ps, count) in events.items():
            us_per_step = time_ps / 1e6 / args.steps
            rows.append(
                {
                    "mode": name,
                    "thread": thread,
                    "event": event,
                    "us_per_step": us_per_step,
                    "per_step": count / args.steps,
                }
            )
    shown = [row for row in rows if row["us_per_step"] >= args.min_us]
    shown.sort(key=lambda row: (args.modes.index(row["mode"]), -row["us_per_step"]))
    print(f"{'mode':14} {'thread':24} {'event':36} {'us/step':>8} {'a step':>7}")
    for row in shown:
        print(
            f"{row['mode']:14} {row['thread'][:24]:24} {row['event'][:36]:36} "
            f"{row['us_per_step']:8.2f} {row['per_step']:7.2f}"
        )
    for name in args.modes:
        traced = sum(row["us_per_step"] for row in rows if row["mode"] == name)
        print(f"{name}: {walls[name]:.1f} us a step profiled, {traced:.1f} of them in events")
    report.write(args, rows=rows, profiled_us_per_step=walls)
    return 0


if __name__ == "__main__":
    sys.exit(main())
