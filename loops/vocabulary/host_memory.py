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
