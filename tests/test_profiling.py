"""--profile_steps: a profiler trace of exactly the chosen steps' inner loops, chief only."""

import glob
import io
import os
import re

import pytest
from test_new_step import WeightedRegression, data

import loops
from conftest import make_trainer, run_module
from loops.run.profiling import check_profile_steps


def build(strategy, progress=None, **args):
    return make_trainer(
        WeightedRegression,
        strategy=strategy,
        train_data=data(),
        steps_per_loop=3,
        progress=progress or loops.testing.quiet_progress(),
        **args,
    )


def traces(model_dir):
    pattern = os.path.join(
        model_dir, "summaries", "train", "plugins", "profile", "*", "*.xplane.pb"
    )
    return glob.glob(pattern)


def test_the_trace_holds_the_chosen_steps_inner_loops(tmp_path):
    stream = io.StringIO()
    loop = build(
        loops.testing.replica_strategy(2),
        model_dir=str(tmp_path),
        profile_steps=(4, 5),
        progress=loops.core.reporting.Progress(stream),
    )
    loop.train(8)
    loop.close()
    found = traces(str(tmp_path))
    assert len(found) == 1 and os.path.getsize(found[0]) > 0
    # Inner loops (of 3 steps) end at step 3, before the trace, and at 5, its end.
    ends = [int(m) for m in re.findall(r"^step (\d+)/8", stream.getvalue(), flags=re.M)]
    assert ends == [3, 5, 8]
    line = next(line for line in stream.getvalue().splitlines() if line.startswith("profiled"))
    assert f"profiled steps 4-5 into {tmp_path}/summaries/train/plugins/profile" in line
    assert f"tensorboard --logdir {tmp_path}/summaries" in line


def test_nothing_is_traced_without_the_option(tmp_path):
    loop = build(loops.testing.replica_strategy(1), model_dir=str(tmp_path))
    loop.train(4)
    loop.close()
    assert not os.path.exists(os.path.join(str(tmp_path), "summaries", "train", "plugins"))


def test_a_resumed_run_past_the_range_traces_nothing(tmp_path):
    first = build(loops.testing.replica_strategy(1), model_dir=str(tmp_path))
    first.train(6)
    first.close()
    resumed = build(
        loops.testing.replica_strategy(1), model_dir=str(tmp_path), profile_steps=(2, 3)
    )
    resumed.train(9)
    resumed.close()
    assert traces(str(tmp_path)) == []


@pytest.mark.parametrize("value", [(0, 3), (5, 4), (1,), "1,2", (1.0, 2)])
def test_bad_profile_steps_name_the_value(value):
    assert check_profile_steps(None) is None and check_profile_steps((2, 2)) == (2, 2)
    with pytest.raises(ValueError, match=re.escape(repr(value))):
        check_profile_steps(value)


def test_the_flag_traces_from_a_binary_and_refuses_a_bad_range(tmp_path, digits_dir):
    common = [f"--data_dir={digits_dir}", "--train_steps=6", "--steps_per_loop=10"]
    done = run_module(
        "loops.bin.classifier", f"--model_dir={tmp_path}/run", "--profile_steps=2,3", *common
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(traces(f"{tmp_path}/run")) == 1
    assert "profiled steps 2-3" in done.stdout
    bad = run_module(
        "loops.bin.classifier", f"--model_dir={tmp_path}/bad", "--profile_steps=3,2", *common
    )
    assert bad.returncode != 0
    assert "--profile_steps must be START,END with 1 <= START <= END" in bad.stderr
    assert not os.path.exists(f"{tmp_path}/bad")
