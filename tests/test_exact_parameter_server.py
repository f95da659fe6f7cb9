"""The parameter-server modes: exact (the numbers of one process, resumable mid-stream) and
async (each batch scheduled once, resumed at the first batch not yet scheduled)."""

import json
import os
import sys

import pytest

import loops
from conftest import ROOT, SUBPROCESS_ENV, tiny_batches
from loops.run import exact_parameter_server
from loops.vocabulary import settings


def run_exact(tmp_path, workers, servers, steps):
    """tests/ps_exact_run.py's report; it asserts the parity itself (AssertionError)."""
    import subprocess

    completed = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "tests", "ps_exact_run.py"),
            str(workers),
            str(servers),
            str(steps),
            str(tmp_path / "model"),
        ],
        capture_output=True,
        text=True,
        env=SUBPROCESS_ENV,
        timeout=400,
        cwd=ROOT,
    )
    lines = [line for line in completed.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"exit code {completed.returncode}:\n{completed.stderr[-4000:]}"
    return json.loads(lines[0].removeprefix("RESULT "))


def test_two_workers_and_two_servers_give_one_replicas_and_two_mirrored_replicas_numbers(
    tmp_path,
):
    report = run_exact(tmp_path, workers=2, servers=2, steps=7)
    # 21 examples in batches of 8: steps 3 and 6 read the partial batch of 5, split [3, 2].
    assert report["num_examples"] == [8, 8, 5, 8, 8, 5, 8]
    assert report["1 replica"] <= 1e-5 and report["2 mirrored"] <= 1e-5
    assert report["loss"][-1] < report["loss"][1]
    # Stopped after step 4 and resumed by a new Trainer: the uninterrupted run's weights.
    assert report["restored_step"] == 4
    assert report["resumed"] <= 1e-5
    # The asynchronous mode reads the same stream in order, each batch scheduled once, and a
    # resume after step 4 goes on with the batches of positions 4, 5, 6 (8, 5, 8 examples).
    assert report["async_first_num_examples"] == [8, 8, 5, 8]
    assert report["async_resumed_num_examples"] == [8, 5, 8]
    assert report["async_counts"] == {
        "mode": "async",
        "scheduled_steps": 3,
        "step_runs": 3,
        "retried_steps": 0,
    }


def test_the_mode_is_a_setting_whose_default_is_exact():
    setting = settings.BY_NAME["parameter_server_mode"]
    assert setting.default == setting.flag_default == "exact"
    assert setting.choices == ("exact", "async")
    with pytest.raises(
        ValueError, match="parameter_server_mode must be one of exact, async, got 'sync'"
    ):
        loops.Trainer(loops.Loop(), train_data=tiny_batches(), parameter_server_mode="sync")


def test_only_parameter_server_strategies_are_exact_or_asynchronous():
    strategy = type("ParameterServerStrategyV2", (), {})()
    assert exact_parameter_server.is_exact(strategy, "exact")
    assert not exact_parameter_server.is_asynchronous(strategy, "exact")
    assert exact_parameter_server.is_asynchronous(strategy, "async")
    mirrored = type("MirroredStrategy", (), {})()
    assert not exact_parameter_server.is_exact(mirrored, "exact")
    assert not exact_parameter_server.is_asynchronous(mirrored, "async")
