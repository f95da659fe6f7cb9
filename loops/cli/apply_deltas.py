"""Applies a chain of delta exports to the export they follow: `loops-apply-deltas`.

    loops-apply-deltas --export=runs/day1/export --deltas=runs/day2/deltas,runs/day3/deltas \\
        --output=serving/day3

writes OUTPUT (new) as the export the last delta was taken from, bit for bit in its
variables and files (`loops.model_dir.export_deltas.apply_deltas`): the deltas are applied
in the order of their chain, each following the export the ones before it left. A delta that
follows no export of the chain (a gap, another model's) is refused naming it and both
fingerprints; nothing is written then. Exit code 0, or 2 for a refusal.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="loops-apply-deltas",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--export", required=True, help="the export the first delta follows")
    parser.add_argument(
        "--deltas",
        required=True,
        help="comma-separated deltas (MODEL_DIR/deltas/NNNNNN) or deltas/ folders, any order",
    )
    parser.add_argument("--output", required=True, help="where the patched export goes (new)")
    return parser


def main(argv: Sequence[str]) -> int:
    """Parses `argv` (without the program name), applies the deltas, returns the exit code."""
    parser = _parser()
    options = parser.parse_args(list(argv))
    deltas = [path for path in options.deltas.split(",") if path]
    from loops.model_dir import export_deltas

    try:
        done = export_deltas.apply_deltas(options.export, deltas, options.output)
    except ValueError as error:
        parser.error(str(error))
    print(
        f"applied {len(done['applied'])} deltas to {options.export}: {options.output} "
        f"(fingerprint {done['fingerprint'][:16]})"
    )
    return 0


def run() -> None:
    """Console-script entry point (loops-apply-deltas)."""
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    run()
