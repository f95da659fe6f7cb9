"""The outputs a run writes at fixed names, checked before any training: MODEL_DIR's
results.json and config.json hold no planted link (nor anything else that is no file of the
run's), and an existing export is replaced only when this run wrote it (its marker names this
--model_dir) or when the user asks.

Without it a link at results.json was refused only when the trained run wrote its results
(the test and the export then skipped), and an --export_dir naming another run's export was
replaced without a word. Imports no TensorFlow: the binaries check before its import.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import stat
from collections.abc import Iterator

from loops.core import own_files
from loops.model_dir import run_config

RESULTS_FILE = "results.json"
# The files every run writes into its model_dir at these names (the chief).
RUN_FILES = (RESULTS_FILE, run_config.CONFIG_FILE)
# Written into an export beside its SavedModel: the model_dir of the run that exported it.
EXPORT_MARKER = "exported_from.txt"
# The export's name inside a model_dir when no --export_dir is given (always the run's own).
DEFAULT_EXPORT = "export"
_MARKER_BYTES = 8192  # more than any path; a marker longer than this names no model_dir


def check_run_files(model_dir: str) -> None:
    """Refuses, before any work, what stands at a name in `model_dir` the run writes
    (`RUN_FILES`): a symbolic link (`own_files.planted_link`), or a directory or other thing
    that is no plain file, which the write at the end of training would fail on.

    Raises:
        own_files.PlantedLinkError: naming the path and the fix.
    """
    for name in RUN_FILES:
        path = os.path.join(model_dir, name)
        own_files.refuse_link(path)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "a special file"
            raise own_files.PlantedLinkError(
                f"{path} is no plain file ({what}), where this run writes its {name}, which "
                "would fail there after the work; remove it (or use another --model_dir) and "
                "run the same command again."
            )


# The model_dir whose exports are being written now (`exports_of`), for `marker_files`.
_EXPORTING_FOR: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "exporting_for", default=None
)


@contextlib.contextmanager
def exports_of(model_dir: str) -> Iterator[None]:
    """Marks the exports written inside as the run's in `model_dir`: each holds the marker
    (`marker_files`) from before it is renamed into place, so a kill never leaves one of its
    exports unmarked (a later run would refuse to replace it unasked)."""
    token = _EXPORTING_FOR.set(os.path.realpath(model_dir))
    try:
        yield
    finally:
        _EXPORTING_FOR.reset(token)


def marker_files() -> dict[str, str]:
    """{EXPORT_MARKER: the model_dir} inside `exports_of`, else {}: the files an export
    writes beside its SavedModel before its rename."""
    model_dir = _EXPORTING_FOR.get()
    return {} if model_dir is None else {EXPORT_MARKER: model_dir + "\n"}


def export_writer(export_dir: str) -> str | None:
    """The model_dir `export_dir`'s marker names (`exports_of`); None when it has none (an
    export of another program, or of a version before the markers) or it does not read."""
    path = os.path.join(export_dir, EXPORT_MARKER)
    try:
        text = own_files.read_own_file(path, _MARKER_BYTES)
    except OSError:  # missing, a link, or unreadable: it names no run
        return None
    return text.decode("utf-8", errors="replace").strip() or None


def is_this_runs_export(export_dir: str, model_dir: str | None) -> bool:
    """Whether the export in `export_dir` is the run's in `model_dir` (None: a new run's):
    it lies at MODEL_DIR/export, part of the run's own directory, or its marker names that
    model_dir (`exports_of`)."""
    if model_dir is None:
        return False
    default = os.path.join(model_dir, DEFAULT_EXPORT)
    if os.path.realpath(export_dir) == os.path.realpath(default):
        return True
    return export_writer(export_dir) == os.path.realpath(model_dir)


def check_export_replaceable(export_dir: str, model_dir: str | None, *, replace: bool) -> None:
    """Refuses, before any training, an existing export in `export_dir` that this run (in
    `model_dir`; None: a new one) would replace at its end and did not write, unless
    `replace` (--replace_export).

    Raises:
        ValueError: naming the export, whose run wrote it, and the fix.
    """
    if replace or not os.path.isdir(export_dir) or is_this_runs_export(export_dir, model_dir):
        return
    writer = export_writer(export_dir)
    whose = (
        f"the run in {writer} wrote it"
        if writer is not None
        else f"it has no {EXPORT_MARKER} naming the run that wrote it"
    )
    this_run = "a new --model_dir" if model_dir is None else f"--model_dir={model_dir}"
    raise ValueError(
        f"--export_dir={export_dir} holds another run's export ({whose}, not {this_run}), "
        "which the export at the end of training would replace, and its files with it; pass "
        "--replace_export to replace it, or a new --export_dir."
    )
