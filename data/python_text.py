"""Python's own standard-library source as a byte-level text corpus: documents, splits, batches.

Every Python installation holds these files, so the corpus needs no download,
and nobody on this project wrote them. A document is one top-level block of
a module (a function, a class, or the statements between them), so documents
have very different lengths. The split is by module: every `EVAL_EVERY`-th
module of `MODULES` (in that fixed order) is the eval split, the others
train. An example is a window of up to `sequence_length + 1` bytes of one
document, right-padded with 0; its `length` says how many bytes are real, so
a step's real-token count depends on which examples it holds.

The text is the running interpreter's copy of these modules, so the corpus
differs a little between Python versions (`corpus_summary` says what was
read).
"""

from __future__ import annotations

import math
import os
import platform
import re
import sysconfig
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from loops.vocabulary.whole_numbers import check_whole
from loops_data import compressors
from loops_data.in_memory import batches_in_memory, endless_batches_in_memory

# Pure-Python modules present in every supported Python (3.10 and later).
MODULES = (
    "abc", "argparse", "ast", "base64", "bisect", "calendar", "cmd", "code",
    "codecs", "codeop", "collections", "colorsys", "configparser", "contextlib",
    "copy", "copyreg", "csv", "dataclasses", "datetime", "difflib", "dis",
    "enum", "filecmp", "fileinput", "fnmatch", "fractions", "ftplib",
    "functools", "genericpath", "getopt", "gettext", "glob", "graphlib",
    "gzip", "hashlib", "heapq", "hmac", "html", "imaplib", "inspect", "io",
    "ipaddress", "json", "keyword", "linecache", "locale", "logging",
    "lzma", "mailbox", "mimetypes", "netrc", "ntpath", "numbers", "opcode",
    "operator", "optparse", "os", "pdb", "pickle", "pickletools", "pkgutil",
    "platform", "plistlib", "poplib", "posixpath", "pprint", "profile",
    "pstats", "py_compile", "pyclbr", "queue", "quopri", "random",
    "reprlib", "rlcompleter", "runpy", "sched", "secrets", "selectors",
    "shelve", "shlex", "shutil", "signal", "smtplib", "socket",
    "socketserver", "ssl", "stat", "statistics", "string", "stringprep",
    "struct", "subprocess", "symtable", "tabnanny", "tarfile", "tempfile",
    "textwrap", "threading", "timeit", "token", "tokenize", "trace",
    "traceback", "tracemalloc", "types", "typing", "uuid", "warnings",
    "wave", "weakref", "webbrowser", "zipapp", "zipimport",
)  # fmt: skip
EVAL_EVERY = 8
VOCAB_SIZE = 256  # bytes
SPLITS = ("train", "eval")
# A top-level block starts at a line that begins in column 0 with one of these.
_BLOCK_START = re.compile(rb"^(?:def |async def |class |@)", re.MULTILINE)


def module_names(split: str) -> list[str]:
    """The modules of a split, in `MODULES` order."""
    _check_split(split)
    chosen = [
        name for index, name in enumerate(MODULES) if (index % EVAL_EVERY == 0) == (split == "eval")
    ]
    return chosen


def module_source(name: str) -> bytes:
    """The source bytes of a standard-library module (its __init__.py for a package).

    Read from the standard library's folder, not through the import system:
    some modules (os, io, ...) are frozen into the interpreter and have no
    source origin there.

    Raises:
        FileNotFoundError: the module has no Python source here (a stripped install).
    """
    folder = sysconfig.get_paths()["stdlib"]
    for path in (os.path.join(folder, name + ".py"), os.path.join(folder, name, "__init__.py")):
        if os.path.isfile(path):
            with open(path, "rb") as stream:
                return stream.read()
    raise FileNotFoundError(
        f"The standard-library module {name!r} has no .py source in {folder}; the text "
        "corpus reads Python's own source files. Use a Python installation that ships "
        "them (python.org, pyenv and distribution builds do)."
    )


def documents(split: str) -> list[bytes]:
    """The split's documents: each module's top-level blocks, in order, empty ones left out."""
    found = []
    for name in module_names(split):
        source = module_source(name)
        starts = sorted({0, *(match.start() for match in _BLOCK_START.finditer(source))})
        for start, end in zip(starts, [*starts[1:], len(source)]):
            block = source[start:end].strip(b"\n")
            if len(block) >= 2:
                found.append(block + b"\n")
    return found


def windows(docs: Sequence[bytes], sequence_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Cuts documents into examples of `sequence_length + 1` bytes (inputs and shifted targets).

    Consecutive windows of a document overlap by one byte, so every byte
    after a document's first is a target exactly once.

    Returns:
        tokens: int32 [examples, sequence_length + 1], right-padded with 0.
        lengths: int32 [examples], the real bytes of each (2 to sequence_length + 1).
    """
    if (
        isinstance(sequence_length, bool)
        or not isinstance(sequence_length, int)
        or sequence_length < 1
    ):
        raise ValueError(f"sequence_length must be a whole number >= 1, got {sequence_length!r}.")
    width = sequence_length + 1
    rows, lengths = [], []
    for doc in docs:
        for start in range(0, max(len(doc) - 1, 1), sequence_length):
            piece = doc[start : start + width]
            if len(piece) < 2:
                continue
            rows.append(np.frombuffer(piece.ljust(width, b"\0"), np.uint8))
            lengths.append(len(piece))
    return np.stack(rows).astype(np.int32), np.asarray(lengths, np.int32)


_cache: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}


def examples(split: str, sequence_length: int) -> tuple[np.ndarray, np.ndarray]:
    """`windows` of a split's documents (computed once per process)."""
    key = (split, sequence_length)
    if key not in _cache:
        _cache[key] = windows(documents(split), sequence_length)
    return _cache[key]


def global_batches(
    split: str,
    *,
    sequence_length: int,
    global_batch_size: int,
    shuffle_seed: int | None = None,
    repeat: bool = False,
) -> tf.data.Dataset:
    """(tokens, lengths) global batches of a split: one epoch (the last maybe partial) or endless.

    Endless streams (`repeat`) take a new permutation each pass, the same
    sequence every run, so skipping k batches resumes exactly.
    """
    check_whole("global_batch_size", global_batch_size)
    tokens, lengths = examples(split, sequence_length)
    if repeat:
        return endless_batches_in_memory((tokens, lengths), global_batch_size, shuffle_seed)
    return batches_in_memory((tokens, lengths), global_batch_size, shuffle_seed)


def unigram_perplexity(sequence_length: int) -> float:
    """The eval split's perplexity under the train split's byte frequencies (add-one smoothed).

    Counted over the bytes a model predicts (every real byte of a window but
    its first), in float64: the baseline a language model has to beat.
    """
    counts = np.ones(VOCAB_SIZE, np.float64)
    for split, into in (("train", counts), ("eval", None)):
        tokens, lengths = examples(split, sequence_length)
        targets = tokens[:, 1:][np.arange(sequence_length)[None, :] < (lengths[:, None] - 1)]
        if into is not None:
            into += np.bincount(targets, minlength=VOCAB_SIZE)
        else:
            log_probabilities = np.log(counts / counts.sum())
            return math.exp(-float(np.mean(log_probabilities[targets])))
    raise AssertionError("unreachable")


def corpus_summary(sequence_length: int) -> dict[str, int]:
    """Modules, documents, examples and predicted bytes of each split (for results and notes)."""
    summary = {}
    for split in SPLITS:
        tokens, lengths = examples(split, sequence_length)
        summary[f"{split}_modules"] = len(module_names(split))
        summary[f"{split}_examples"] = int(tokens.shape[0])
        summary[f"{split}_tokens"] = int(np.sum(lengths - 1))
    return summary


def splits(*, sequence_length: int, global_batch_size: int, seed: int) -> dict[str, Any]:
    """The Trainer's `train_data` and `eval_data`: endless, shuffled with `seed`; one pass."""
    return dict(
        train_data=lambda: global_batches(
            "train",
            sequence_length=sequence_length,
            global_batch_size=global_batch_size,
            shuffle_seed=seed,
            repeat=True,
        ),
        eval_data=lambda: global_batches(
            "eval", sequence_length=sequence_length, global_batch_size=global_batch_size
        ),
    )


def compressor_baselines() -> dict[str, float]:
    """gzip's, bzip2's and xz's bits per byte of the eval modules given the train modules.

    The same modules the eval split's windows are cut from, each split's sources
    joined in module order (`loops_data.compressors`).
    """
    train, text = (b"".join(module_source(name) for name in module_names(s)) for s in SPLITS)
    return compressors.bits_per_byte(train, text)


def corpus_notes(sequence_length: int) -> dict[str, Any]:
    """`loops.LanguageModelLoop`'s keywords about the text: the baselines, the corpus."""
    return dict(
        unigram_perplexity=unigram_perplexity(sequence_length),
        # The text is the running Python's own: another version reads other counts.
        corpus={
            "python": platform.python_version(),
            **corpus_summary(sequence_length),
            "compressors_bits_per_byte": compressor_baselines(),
        },
    )


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}.")
