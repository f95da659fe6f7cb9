"""Every Trainer setting reaches a line that reads it (issue 65).

A setting the Trainer takes lands in the options of the part that reads it (the step
options and the Updates' options they are, the Controller's options) or in the run's
Placement. A field that received a setting and that no code read would take the value and
ignore it; `test_setting_owners.py` checks where each setting lands, this test that it is
read there: each Trainer setting, at a value other than its default, while a Trainer is made
and trains a few steps, is read from its part by code other than the dataclass machinery
(made, compared, checked by its declaration when made).
"""

import collections
import contextlib
import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from test_setting_owners import _another_value

import loops
from conftest import ROOT, OneWeight
from loops.core.update_context import UpdateOptions
from loops.definition.step_options import StepOptions
from loops.placement import Placement
from loops.run.controller_options import ControllerOptions
from loops.vocabulary import settings

PARTS = (StepOptions, UpdateOptions, ControllerOptions, Placement)
# Reads that are no reader's: a dataclass making, comparing or copying itself, and the
# checks every field gets by its declaration when the options are made.
_MACHINERY = frozenset({"__post_init__", "__eq__", "__repr__", "__hash__"})
# Read where they apply alone, by their own tests: the global batch bounds the lookups of an
# embedding table split over replicas (test_placed_tables.py, test_ctr.py), the mode places a
# parameter-server strategy (test_exact_parameter_server.py, test_placement.py), the seed
# keys the draws of a step that draws (test_gan.py, test_lm.py, test_rl.py).
WHERE_THEY_APPLY = {
    "global_batch_size": ("placement.py", "derived_lookups"),
    "parameter_server_mode": ("run/trainer.py", "Placement.of"),
    "seed": ("kinds/gan.py", "self.options.seed"),
}


@contextlib.contextmanager
def recorded_reads():
    """Inside, {setting name: the files that read it from one of PARTS}."""
    reads = collections.defaultdict(set)
    dataclasses_file = os.path.realpath(sys.modules["dataclasses"].__file__)

    def getattribute(self, name):
        caller = sys._getframe(1).f_code
        machinery = caller.co_name in _MACHINERY or caller.co_filename == dataclasses_file
        if not machinery and not name.startswith("__"):
            reads[name].add(os.path.relpath(caller.co_filename, ROOT))
        return object.__getattribute__(self, name)

    for part in PARTS:
        part.__getattribute__ = getattribute
    try:
        yield reads
    finally:
        for part in PARTS:
            del part.__getattribute__


class EvaluatedWeight(OneWeight):
    """OneWeight with an eval pass: its loss on the eval batches, for the settings that act
    on evaluations (eval_every, early stopping, the best checkpoint)."""

    def eval_step(self, batch):
        losses = self.strategy.run(lambda x: {"loss": tf.reduce_sum(self.model(x))}, args=(batch,))
        return {"loss": loops.Mean(loops.sum_over_replicas(self.strategy, losses)["loss"])}


def _train_data():
    return tf.data.Dataset.from_tensor_slices(np.ones((8, 1), np.float32)).batch(4).repeat()


# Values a short run of OneWeight can train with, where `_another_value`'s would stop it.
_RUNNABLE = {
    "steps_per_loop": 2,
    "eval_every": 2,
    "checkpoint_every": 2,
    "profile_steps": (1, 2),
    "loss_scale_growth_steps": 100,
    "early_stopping_patience": 5,
}
# What a setting needs beside it to act at all.
_WITH = {
    "loss_scale_growth_steps": {"mixed_precision": "mixed_float16"},
    "max_recoveries": {"on_nonfinite": "recover"},
    "early_stopping_mode": {"early_stopping_metric": "loss", "eval_every": 2},
    "early_stopping_patience": {"early_stopping_metric": "loss", "eval_every": 2},
    "early_stopping_metric": {"eval_every": 2},
    "keep_best_mode": {"keep_best_metric": "loss"},
    **{f"loss_spike_{rule}": {"on_loss_spike": "stop"} for rule in ("factor", "steps", "window")},
}


@pytest.mark.parametrize(
    "name", [s.name for s in settings.TRAINER_SETTINGS if s.name not in WHERE_THEY_APPLY]
)
def test_a_trainer_setting_is_read_by_its_part_while_a_run_trains(name, tmp_path):
    setting = settings.BY_NAME[name]
    value = _RUNNABLE.get(name, setting.checked(_another_value(setting, tmp_path)))
    arguments = {"steps_per_loop": 2, **_WITH.get(name, {}), name: value}
    if name in ("keep_best_metric", "keep_best_mode", "max_recoveries", "async_checkpoints"):
        arguments.setdefault("model_dir", str(tmp_path / "run"))
    with recorded_reads() as reads:
        trainer = loops.Trainer(
            EvaluatedWeight(),
            train_data=_train_data(),
            eval_data=lambda: _train_data().take(2),
            progress=loops.testing.quiet_progress(),
            **arguments,
        )
        with trainer:
            trainer.train(4)
    readers = sorted(reads.get(name, ()))
    assert readers, (
        f"the Trainer setting {name}={value!r} reached no reader: no code read it from "
        f"{', '.join(part.__name__ for part in PARTS)} while a run trained"
    )
    assert all(reader.startswith("loops" + os.sep) for reader in readers), readers


def test_the_settings_read_where_they_apply_are_read_there():
    for name, (file, reader) in WHERE_THEY_APPLY.items():
        path = os.path.join(ROOT, "loops", file)
        with open(path, encoding="utf-8") as source:
            text = source.read()
        assert reader in text and name in text, (name, file)
    where = Placement.of(tf.distribute.get_strategy(), "exact", global_batch_size=6)
    with recorded_reads() as reads:
        assert where.derived_lookups(2) == 12
    assert reads["global_batch_size"] == {os.path.join("loops", "placement.py")}
