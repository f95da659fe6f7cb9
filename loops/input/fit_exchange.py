"""The statistics pass of a sharded log split over the workers of a cluster: each worker fits
its share of the chunks (`streaming_fit.fit_partials` with part=(index, count)), writes it into
a folder every worker reads (under the run's model_dir), and merges every worker's share in
chunk order (`streaming_fit.fit_log`), so every worker holds one process's statistics bit for
bit after reading 1/count of the log. A worker whose share found a bad field writes the
sentence instead, which every worker raises. A share that does not come (the folder not on
storage the workers share, or a worker far behind) is fitted by the waiting worker itself after
a while: the pass is never wrong and never hangs, only slower.

A share is JSON: each value count as [repr(value), count] pairs (a value read back by
`ast.literal_eval`: text, whole numbers and tuples of them keep their type), each float as
Python writes it (exact both ways). The folder is named by a hash of what the pass fits (the
log's identity, the spec, the split), so shares of another log or split are never read.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import ast
import collections
import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from loops.input.feature_tables import FeatureSpec, FittedFeatures
from loops.input.sharded_logs import ShardedLog
from loops.input.streaming_fit import FitPartials, FitShare, Moments, Sketch, fit_log, fit_partials

# Where the shares are written, under the folder the workers share.
SHARES_FOLDER = ".fit_shares"


def _partials_json(partials: FitPartials) -> dict[str, Any]:
    return {
        "counts": {
            name: [[repr(value), count] for value, count in counter.items()]
            for name, counter in partials.counts.items()
        },
        "moments": {name: vars(moments) for name, moments in partials.moments.items()},
        "sketches": {
            name: [sketch.values.tolist(), sketch.weights.tolist()]
            for name, sketch in partials.sketches.items()
        },
        "labels": partials.labels,
        "label_values": sorted(partials.label_values),
        "rows": partials.rows,
    }


def _partials_of(saved: dict[str, Any]) -> FitPartials:
    return FitPartials(
        counts={
            name: collections.Counter({ast.literal_eval(v): c for v, c in pairs})
            for name, pairs in saved["counts"].items()
        },
        moments={name: Moments(**figures) for name, figures in saved["moments"].items()},
        sketches={
            name: Sketch(np.asarray(values, np.float64), np.asarray(weights, np.float64))
            for name, (values, weights) in saved["sketches"].items()
        },
        labels=list(saved["labels"]),
        label_values=set(saved["label_values"]),
        rows=int(saved["rows"]),
    )


def share_json(share: FitShare) -> str:
    """A worker's share as JSON text (`share_of` reads it back, equal)."""
    return json.dumps(
        {
            "totals": _partials_json(share.totals),
            "chunks": {str(chunk): _partials_json(p) for chunk, p in share.chunks.items()},
        }
    )


def share_of(text: str) -> FitShare:
    saved = json.loads(text)
    chunks = {int(chunk): _partials_of(p) for chunk, p in saved["chunks"].items()}
    return FitShare(_partials_of(saved["totals"]), chunks)


def shares_folder(root: str, basis: Any) -> str:
    """The folder of the shares of the pass `basis` (JSON) describes, under `root`."""
    digest = hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(root, SHARES_FOLDER, digest)


def _write_atomic(path: str, text: str) -> None:
    partial = f"{path}.partial-{os.getpid()}"
    with open(partial, "w") as stream:
        stream.write(text)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(partial, path)


def fit_split(
    spec: FeatureSpec,
    log: ShardedLog,
    band: tuple[float, float],
    *,
    folder: str,
    worker: tuple[int, int],
    wait_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> FittedFeatures:
    """The statistics of the rows of `band`, this worker (index, count) reading its chunks
    alone and the others' shares from `folder` (`shares_folder`), written there as each is
    done; equal to `fit_log` of one process. A share not there after `wait_s` (default: 60 s,
    or twice this worker's own pass if longer) this worker fits itself.

    Raises:
        ValueError: a field a column does not take, in this worker's chunks or another's
            (its sentence, and which worker found it).
    """
    index, count = worker
    os.makedirs(folder, exist_ok=True)
    own = os.path.join(folder, f"share-{index}-of-{count}.json")
    started = time.monotonic()
    try:
        share = fit_partials(spec, log, band, part=(index, count))
    except ValueError as error:
        _write_atomic(own, json.dumps({"error": str(error)}))
        raise
    _write_atomic(own, share_json(share))
    if wait_s is None:
        wait_s = max(60.0, 2 * (time.monotonic() - started))
    shares: dict[int, FitShare] = {index: share}
    waited, pause = 0.0, 0.05
    while len(shares) < count:
        for other in range(count):
            path = os.path.join(folder, f"share-{other}-of-{count}.json")
            if other in shares or not os.path.isfile(path):
                continue
            with open(path) as stream:
                text = stream.read()
            found = json.loads(text).get("error") if text.startswith('{"error"') else None
            if found is not None:
                raise ValueError(f"{found} (found by worker {other} of the statistics pass)")
            shares[other] = share_of(text)
        if len(shares) < count:
            if waited >= wait_s:  # not coming here: this worker reads those chunks too
                for other in sorted(set(range(count)) - set(shares)):
                    shares[other] = fit_partials(spec, log, band, part=(other, count))
                break
            sleep(pause)
            waited, pause = waited + pause, min(pause * 2, 1.0)
    return fit_log(spec, log, band, shares=[shares[i] for i in range(count)])
