"""What a table of many numeric columns costs `loops-ctr`: the whole run of the binary on a CSV
of 300 rows, a label and N numeric columns, in a fresh process per column count.

    python -m benchmarks.ctr_columns                          # 100, 400 and 1000 columns
    python -m benchmarks.ctr_columns --columns=400 --train_steps=2

Each run is `loops-ctr --data=table.csv --spec=spec.json --train_steps=...` with the binary's
defaults otherwise (wide & deep, 2 replicas on the CPU, a global batch of 256, an export at
the end), under a timeout. It prints, per column count, the wall seconds until the first
evaluation's line, until the process ended, and its last evaluation line. The time goes
from the start of the process: TensorFlow's import and the CSV's read count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

ROWS = 300


def write_table(directory: str, columns: int) -> tuple[str, str]:
    """A CSV of ROWS rows (a 0/1 label and `columns` numbers) and its spec: their paths."""
    rng = np.random.default_rng(columns)
    values = rng.normal(size=(ROWS, columns))
    labels = (values[:, 0] + rng.normal(size=ROWS) > 0).astype(int)
    names = [f"x{k}" for k in range(columns)]
    table, spec = os.path.join(directory, "table.csv"), os.path.join(directory, "spec.json")
    with open(table, "w") as file:
        file.write(",".join(["label", *names]) + "\n")
        for label, row in zip(labels, values):
            file.write(",".join([str(label), *(f"{v:.4f}" for v in row)]) + "\n")
    with open(spec, "w") as file:
        json.dump(
            {"label": "label", "columns": [{"name": n, "kind": "numeric"} for n in names]}, file
        )
    return table, spec


def timed_run(columns: int, train_steps: int, timeout: float) -> tuple[float | None, float, str]:
    """(seconds to the first evaluation's line or None, seconds in all, last evaluation line)
    of one binary run on a table of `columns` numeric columns."""
    with tempfile.TemporaryDirectory() as scratch:
        table, spec = write_table(scratch, columns)
        command = [sys.executable, "-m", "loops.bin.ctr", f"--data={table}", f"--spec={spec}"]
        command += [f"--model_dir={scratch}/run", f"--train_steps={train_steps}"]
        start = time.monotonic()
        first_eval, evals = None, []
        with subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # each line as it is printed
        ) as process:
            watchdog = threading.Timer(timeout, process.kill)  # a run that hangs is ended
            watchdog.start()
            assert process.stdout is not None
            for line in process.stdout:
                if "eval at step" in line:
                    first_eval = first_eval or time.monotonic() - start
                    evals.append(line.strip())
            process.wait()
            watchdog.cancel()
        seconds = time.monotonic() - start
    return first_eval, seconds, evals[-1] if evals else "(no evaluation line)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--columns", default="100,400,1000", help="column counts, by commas")
    parser.add_argument("--train_steps", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    args = parser.parse_args()
    for columns in (int(count) for count in args.columns.split(",")):
        first_eval, seconds, last_eval = timed_run(columns, args.train_steps, args.timeout)
        reached = "none" if first_eval is None else f"{first_eval:.1f} s"
        print(f"{columns} columns: first evaluation {reached}, run {seconds:.1f} s | {last_eval}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
