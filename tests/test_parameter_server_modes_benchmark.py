"""benchmarks/parameter_server_modes.py's table: one row a case and mode, each case's ratio to
its own async mode, the exact mode's closures and bytes as measured (no cluster here)."""

import importlib

import pytest

from conftest import ROOT


@pytest.fixture
def benchmark(monkeypatch):
    monkeypatch.syspath_prepend(ROOT)  # benchmarks/ is not installed; it runs from the root
    return importlib.import_module("benchmarks.parameter_server_modes")


def test_each_case_reports_every_mode_against_its_own_async_mode(benchmark):
    args = benchmark.parse_args(["--workers=2", "--servers=1", "--steps=4", "--rounds=2"])
    assert args.cases == ["classifier", "recommender"]
    samples = {
        ("classifier", "one_process"): [10.0, 12.0],
        ("classifier", "exact"): [40.0, 44.0],
        ("classifier", "async"): [20.0, 20.0],
        ("recommender", "one_process"): [1.0, 1.0],
        ("recommender", "exact"): [30.0, 30.0],
        ("recommender", "async"): [15.0, 15.0],
    }
    sent = {"classifier": [2.0, 77008.0], "recommender": [2.0, 17054.5]}
    rows = benchmark.rows_of(args, samples, sent)
    assert [(row["case"], row["mode"]) for row in rows] == list(samples)
    exact = rows[1]
    assert exact["wall_ms_per_step"] == 42.0 and exact["ratio_to_async"] == 2.1
    assert exact["closures_per_step"] == 2.0 and exact["bytes_to_chief_per_step"] == 77008.0
    assert rows[2]["closures_per_step"] == 1 and rows[2]["bytes_to_chief_per_step"] == 0
    assert rows[4]["ratio_to_async"] == 2.0
    table = benchmark.format_table(rows).splitlines()
    assert table[0].split() == [
        "case",
        "mode",
        "W",
        "M",
        "ms/step",
        "x",
        "async",
        "closures",
        "bytes",
    ]
    assert table[5].split() == ["recommender", "exact", "2", "1", "30.00", "2.00", "2", "17054"]


def test_a_table_of_no_rows_is_refused(benchmark, capsys):
    with pytest.raises(SystemExit):
        benchmark.parse_args(["--users=0"])
    assert "--users, --items and --dim must be >= 1" in capsys.readouterr().err
