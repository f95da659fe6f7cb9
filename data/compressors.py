"""What general-purpose compressors reach on a text given what came before it: bits per byte.

A language model's eval bits per byte means little alone; a compressor that
is shown the train text first and then compresses the eval text is a
baseline every reader knows. Each figure is (size of compress(train + eval)
minus size of compress(train)) x 8 / bytes of eval, at the compressor's
strongest setting: gzip -9, bzip2 -9 and xz -9e (Python's own `gzip`, `bz2`
and `lzma`). xz takes seconds on a few MB, so the figures are remembered
per text under the user's cache directory ($XDG_CACHE_HOME or ~/.cache,
loops/compressors), keyed by a hash of the bytes; the cache is safe to lose.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import json
import lzma
import os
from collections.abc import Callable

from loops.core import reporting

# name -> compress(bytes) at its strongest setting.
COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: gzip.compress(data, compresslevel=9, mtime=0),
    "bzip2": lambda data: bz2.compress(data, compresslevel=9),
    "xz": lambda data: lzma.compress(data, preset=9 | lzma.PRESET_EXTREME),
}


def bits_per_byte(before: bytes, text: bytes) -> dict[str, float]:
    """Each compressor's bits per byte of `text` once it has seen `before`; cached per text.

    Raises:
        ValueError: `text` is empty.
    """
    if not text:
        raise ValueError("text is empty: there is nothing to measure bits per byte of.")
    digest = hashlib.sha256(len(before).to_bytes(8, "little") + before + text).hexdigest()
    cache_file = _cache_path(digest[:32])
    cached = _read(cache_file)
    if cached is not None:
        return cached
    figures = {}
    for name, compress in COMPRESSORS.items():
        extra = len(compress(before + text)) - len(compress(before))
        figures[name] = extra * 8 / len(text)
    _write(cache_file, figures)
    return figures


def _cache_path(key: str) -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "loops", "compressors", f"{key}.json")


def _read(cache_file: str) -> dict[str, float] | None:
    """The cached figures; None when missing, damaged or not of every compressor."""
    try:
        with open(cache_file) as stream:
            cached = json.load(stream)
    except (OSError, ValueError):
        return None
    if not isinstance(cached, dict) or sorted(cached) != sorted(COMPRESSORS):
        return None
    if not all(type(value) is float for value in cached.values()):
        return None
    return {name: cached[name] for name in COMPRESSORS}


def _write(cache_file: str, figures: dict[str, float]) -> None:
    """Replaces the cache file at once; one that cannot be written only costs a rerun's time."""
    try:
        reporting.write_text_atomic(cache_file, json.dumps(figures))
    except OSError:
        pass
