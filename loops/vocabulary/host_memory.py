"""This machine's physical memory: what the checks of a model's or a file's size measure against
before any work (`loops_models.settings`, `loops.input.interaction_logs`)."""

from __future__ import annotations

import os


def memory_bytes() -> int:
    """This machine's physical memory in bytes (0 where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


def in_units(count: int) -> str:
    """A count of bytes as a sentence says it: "2.0 GiB", "1.6 MiB", "999 bytes"."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,} bytes"
