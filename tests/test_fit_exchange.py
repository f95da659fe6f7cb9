"""The statistics pass split over workers: two workers, each reading its own chunks of a log
and the other's share from a shared folder, fit exactly one process's statistics; a bad field
in one worker's chunks is raised by both; a share that never comes is fitted by the waiting
worker; a share reads back equal; a task finds its place among the workers from TF_CONFIG."""

import json
import os
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loops.cluster import cluster_config
from loops.input import feature_tables, fit_exchange, sharded_logs, streaming_fit

SPEC = {
    "label": "clicked",
    "columns": [
        {"name": "n", "kind": "numeric", "normalize": "standard", "buckets": 6},
        {"name": "c", "kind": "categorical", "min_count": 2},
        {"name": "k", "kind": "categorical"},
    ],
}


def write_log(folder, rows=9000, group=60, bad_row=None):
    """150 row groups (3 chunks of 64 blocks): both workers of 2 fit a chunk or more."""
    rng = np.random.default_rng(5)
    columns = {
        "clicked": rng.integers(0, 2, rows),
        "n": rng.lognormal(2.0, 1.5, rows),
        "c": [f"v{v}" for v in rng.zipf(1.5, rows) % 300],
        "k": rng.integers(0, 40, rows),
    }
    if bad_row is not None:
        columns["n"] = columns["n"].astype(object)
        columns["n"][bad_row] = "many"
        columns["n"] = [str(v) for v in columns["n"]]
    os.makedirs(folder, exist_ok=True)
    table = pa.table(columns)
    for shard in range(3):
        part = table.slice(shard * rows // 3, rows // 3)
        pq.write_table(part, os.path.join(folder, f"part-{shard}.parquet"), row_group_size=group)
    return sharded_logs.ShardedLog.open(str(folder))


def split_fit(log, folder, count=2, **keywords):
    spec = feature_tables.FeatureSpec.from_json(SPEC)
    band = streaming_fit.Split(0.2).bands()["train"]
    found, errors = {}, {}

    def worker(index):
        try:
            found[index] = fit_exchange.fit_split(
                spec, log, band, folder=str(folder), worker=(index, count), **keywords
            )
        except ValueError as error:
            errors[index] = str(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return found, errors, streaming_fit.fit_log(spec, log, band) if not errors else None


def test_two_workers_fit_one_processs_statistics_each_reading_its_own_chunks(tmp_path):
    log = write_log(tmp_path / "log")
    assert len(log.blocks) == 150
    found, errors, one = split_fit(log, tmp_path / "shares")
    assert errors == {}
    for index in (0, 1):
        assert found[index].to_json() == one.to_json(), index
    fitted = json.loads(one.to_json())
    assert len(fitted["boundaries"]["n"]) == 5 and len(fitted["vocabularies"]["k"]) == 40
    files = sorted(os.listdir(tmp_path / "shares"))
    assert files == ["share-0-of-2.json", "share-1-of-2.json"]
    # A share reads back as it was written.
    spec = feature_tables.FeatureSpec.from_json(SPEC)
    share = streaming_fit.fit_partials(spec, log, (0.2, 1.0), part=(1, 2))
    again = fit_exchange.share_of(fit_exchange.share_json(share))
    assert fit_exchange.share_json(again) == fit_exchange.share_json(share)
    assert (
        sorted(again.chunks) == [1] and again.totals.counts["k"][7] == share.totals.counts["k"][7]
    )


def test_a_bad_field_is_raised_by_both_workers_and_a_share_that_never_comes_is_fitted_here(
    tmp_path,
):
    # Row 8,500 lies in the third chunk (blocks 128..149), worker 0's of 2.
    log = write_log(tmp_path / "log", bad_row=8500)
    found, errors, _ = split_fit(log, tmp_path / "shares")
    assert found == {} and sorted(errors) == [0, 1]
    assert "'many'" in errors[0] and errors[1].startswith(errors[0])
    assert errors[1].endswith("(found by worker 0 of the statistics pass)")
    clean = write_log(tmp_path / "clean")
    spec = feature_tables.FeatureSpec.from_json(SPEC)
    alone = fit_exchange.fit_split(
        spec, clean, (0.2, 1.0), folder=str(tmp_path / "alone"), worker=(0, 3), wait_s=0
    )
    assert alone.to_json() == streaming_fit.fit_log(spec, clean, (0.2, 1.0)).to_json()
    assert os.listdir(tmp_path / "alone") == ["share-0-of-3.json"]


def test_a_task_finds_its_place_among_the_workers_that_run_the_pass(monkeypatch):
    cluster = {"chief": ["a:1"], "worker": ["b:2", "c:3"]}
    for task, place in ((("chief", 0), 0), (("worker", 0), 1), (("worker", 1), 2)):
        config = {"cluster": cluster, "task": {"type": task[0], "index": task[1]}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(config))
        assert cluster_config.pass_worker("multi_worker_mirrored") == (place, 3)
        assert cluster_config.pass_worker("parameter_server") is None
    monkeypatch.delenv("TF_CONFIG")
    assert cluster_config.pass_worker("multi_worker_mirrored") is None
