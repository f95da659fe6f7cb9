"""A run's chain of delta exports as it trains (`--export_deltas`): each export-worthy point
(an evaluation that keeps a best, the run's export) adds the delta from the export the chain
last gave to this one as the next link in MODEL_DIR/deltas, and keeps a copy of the export it
gives, named by its fingerprint, for the next link to follow.

Crash safety comes from the order: the copy is in place before its link is, and older copies
go only after it, so the export the newest link gives is always there to follow; a kill
anywhere leaves the links before it a valid chain.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from loops.model_dir import export, export_deltas

DELTAS = "deltas"  # in MODEL_DIR: the links, NNNNNN
BASES = "delta_bases"  # in MODEL_DIR: the export each newest link gives, by fingerprint
_STAGING = ".base-"  # then the writer's PID, "-" and 8 random characters


class DeltaChain:
    """The delta chain of the run in `model_dir`, going on from `follows` (the export of the
    run it continues: the first link's base)."""

    def __init__(self, model_dir: str, follows: str):
        self.model_dir, self.follows = model_dir, follows
        self.deltas = os.path.join(model_dir, DELTAS)
        self.bases = os.path.join(model_dir, BASES)

    def tip(self) -> str:
        """The export the next link follows: the kept copy of the export the newest link
        gives, else `follows` (no link yet, or links of another chain only)."""
        paths = export_deltas.delta_paths([self.deltas]) if os.path.isdir(self.deltas) else []
        if paths:
            kept = os.path.join(self.bases, export_deltas.read_delta(paths[-1])["gives"])
            if os.path.isdir(kept):
                return kept
        return self.follows

    def staging(self) -> str:
        """A new directory path (not made) under the bases' folder for an export to write,
        which `extend` then adds to the chain."""
        os.makedirs(self.bases, exist_ok=True)
        export.remove_abandoned_staging(self.bases, _STAGING)
        return os.path.join(
            tempfile.mkdtemp(dir=self.bases, prefix=f"{_STAGING}{os.getpid()}-"), "export"
        )

    def extend(self, export_dir: str) -> str | None:
        """Adds the link from `tip` to `export_dir` (an export of this run: a `staging` one
        is moved into place, another copied) and returns its path; None where `export_dir`
        holds what the tip holds (nothing to send).

        Raises:
            ValueError: either directory holds no SavedModel.
            OSError: it could not be written (the links before stay as they were).
        """
        base = self.tip()
        gives = export_deltas.fingerprint(export_dir)
        if gives == export_deltas.fingerprint(base):
            self._drop_staging(export_dir)
            return None
        kept = os.path.join(self.bases, gives)
        if not os.path.isdir(kept):
            staged = self.staging() if not self._is_staging(export_dir) else export_dir
            if staged != export_dir:
                shutil.copytree(export_dir, staged)
            os.replace(staged, kept)
            shutil.rmtree(os.path.dirname(staged), ignore_errors=True)
        else:
            self._drop_staging(export_dir)
        link = export_deltas.write_delta(base, kept, self.deltas)
        for name in os.listdir(self.bases):
            if name != gives and not name.startswith(_STAGING):
                shutil.rmtree(os.path.join(self.bases, name), ignore_errors=True)
        return link

    def _is_staging(self, path: str) -> bool:
        parent = os.path.dirname(os.path.abspath(path))
        return os.path.dirname(parent) == os.path.abspath(self.bases) and os.path.basename(
            parent
        ).startswith(_STAGING)

    def _drop_staging(self, path: str) -> None:
        if self._is_staging(path):
            shutil.rmtree(os.path.dirname(os.path.abspath(path)), ignore_errors=True)
