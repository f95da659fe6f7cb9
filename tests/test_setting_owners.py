"""Every setting of `loops.RunConfig` given to a Trainer is read by the part it belongs to or
refused with where it goes, alike as a keyword and in a RunConfig (issue 52)."""

import types

import numpy as np
import pytest
import tensorflow as tf
from absl import flags
from absl.testing import flagsaver

import loops
from conftest import OneWeight
from loops.bin import classifier  # noqa: F401  (defines the binaries' flags)
from loops.cli import flags as loop_flags
from loops.run import trainer_arguments
from loops.run.actions import EarlyStopping, KeepBest
from loops.vocabulary import settings


def _another_value(setting, tmp_path):
    """A value `setting` takes that is not its default, derived from its declaration."""
    default = setting.default
    if setting.path:
        return str(tmp_path / setting.name)
    if setting.annotation.startswith("tuple"):
        return (1, 2)
    if setting.kind == "bool":
        return not default
    if setting.kind == "enum":
        return next(choice for choice in setting.choices if choice != default)
    if setting.kind == "integer":
        return 2 if default is None else default + 1
    if setting.kind == "float":
        return 0.5 if default is None else default * 2
    return "loss"  # a string: the metrics and losses these name


def _train_data():
    return tf.data.Dataset.from_tensor_slices(np.ones((8, 1), np.float32)).batch(4).repeat()


def _outcome(**arguments):
    """("refused", the error's type and sentence), or ("read", {setting: (part, value)}): what
    the Trainer's parts (step options, run options, update options) hold of each setting."""
    try:
        trainer = loops.Trainer(
            OneWeight(),
            train_data=_train_data(),
            progress=loops.testing.quiet_progress(),
            **arguments,
        )
    except (TypeError, ValueError) as error:
        return ("refused", type(error).__name__, str(error))
    with trainer:
        # The Trainer places the run by these two itself: the global batch travels with its
        # Placement, and the mode is Placement.of's argument (it changes the placement of a
        # parameter-server strategy alone; tests/test_exact_parameter_server.py).
        placed = types.SimpleNamespace(
            global_batch_size=trainer.placement.global_batch_size,
            parameter_server_mode=trainer.run_config.placement.parameter_server_mode,
        )
        parts = (
            trainer.step_options,
            trainer.controller.options,
            trainer.step_context.update.options,
            placed,
        )
        return (
            "read",
            {
                name: [
                    (type(part).__name__, getattr(part, name))
                    for part in parts
                    if hasattr(part, name)
                ]
                for name in loops.RunConfig.names()
            },
        )


@pytest.mark.parametrize("name", loops.RunConfig.names())
def test_a_setting_as_a_keyword_and_in_a_run_config_reaches_the_same_part_or_is_refused_alike(
    name, tmp_path
):
    setting = settings.BY_NAME[name]
    value = setting.checked(_another_value(setting, tmp_path))
    as_keyword = _outcome(**{name: value})
    in_config = _outcome(config=loops.RunConfig().replace(**{name: value}))
    assert as_keyword == in_config
    if not setting.loop:
        # Only a binary acts on it: refused, naming it, where it goes and the way out.
        assert setting.elsewhere, f"{name} is neither read by a Trainer nor says where it goes"
        assert in_config == ("refused", "TypeError", trainer_arguments.unread_setting(name, value))
        assert in_config[2].startswith(f"{name}={value!r} is not a loops.Trainer setting: ")
    elif in_config[0] == "read":
        # Read by at least one part, with the value given (refusals of a combination that
        # needs another setting, e.g. max_recoveries without a policy that recovers, are
        # compared above).
        read = in_config[1][name]
        assert read and all(seen == value for _, seen in read), (name, read)


def test_every_setting_is_either_read_by_the_trainer_or_says_where_it_goes():
    for setting in settings.SETTINGS:
        assert setting.loop != bool(setting.elsewhere), setting.name
    read = {setting.name for setting in settings.SETTINGS if setting.loop}
    assert set(trainer_arguments.KEYWORDS) == read
    assert len(read) == 29 and len(settings.SETTINGS) - len(read) == 18


def test_early_stopping_and_keeping_the_best_are_the_trainers_actions_first(tmp_path):
    mine = loops.Action()
    trainer = loops.Trainer(
        OneWeight(),
        loops.RunConfig().replace(early_stopping_metric="loss", early_stopping_patience=5),
        train_data=_train_data(),
        model_dir=str(tmp_path),
        eval_every=2,
        keep_best_metric="accuracy",
        keep_best_mode="max",
        actions=[mine],
        progress=loops.testing.quiet_progress(),
    )
    with trainer:
        stop, best, given = trainer.controller.options.actions
    assert type(stop) is EarlyStopping and type(best) is KeepBest and given is mine
    assert (stop.metric, stop.mode, stop.patience) == ("loss", "min", 5)
    assert (best.metric, best.mode) == ("accuracy", "max")


def test_a_string_strategy_is_refused_as_the_setting_is():
    with pytest.raises(TypeError) as refused:
        loops.Trainer(OneWeight(), strategy="parameter_server")
    assert str(refused.value) == (
        "strategy='parameter_server' is not a loops.Trainer setting: the binaries make their "
        "tf.distribute strategy by it; give a Trainer the strategy it runs in as strategy= "
        "(default: the current one). Leave it at its default ('mirrored') in the Trainer's "
        "settings (RunConfig.for_trainer() sets every such setting back to its default)."
    )


def test_for_trainer_sets_back_only_what_a_trainer_does_not_read():
    config = loops.RunConfig().replace(
        strategy="one_device", train_steps=9, clip_norm=1.0, seed=4, keep_best_metric="loss"
    )
    assert config.for_trainer() == loops.RunConfig().replace(seed=4, keep_best_metric="loss")


def test_a_binary_gives_its_trainer_the_settings_it_reads_and_acts_on_the_rest_itself():
    argv = [
        "loops-classifier",
        "--model_dir=/run",
        "--strategy=one_device",
        "--train_steps=8",
        "--steps_per_loop=4",
        "--keep_best_metric=loss",
        "--early_stopping_metric=loss",
        "--learning_rate=0.5",
        "--clip_norm=2",
    ]
    with flagsaver.flagsaver():
        flags.FLAGS.unparse_flags()
        flags.FLAGS(argv)
        arguments = loop_flags.loop_arguments("a strategy", "/run", actions=["an export"])
        flags.FLAGS(["loops-classifier", "--mode=evaluate_checkpoints", *argv[1:]])
        evaluator = loop_flags.loop_arguments("a strategy", "/run", actions=["an export"])
    config = arguments["config"]
    assert config.for_trainer() == config and arguments["actions"] == ["an export"]
    assert (config.controller.keep_best_metric, config.controller.early_stopping_metric) == (
        "loss",
        "loss",
    )
    assert (config.strategy.strategy, config.run.train_steps, config.run.clip_norm) == (
        "mirrored",
        None,
        None,
    )
    assert arguments["record"]["train_steps"] == 8 and arguments["record"]["clip_norm"] == 2
    # An evaluator neither stops early nor keeps a best checkpoint of its own.
    assert evaluator["config"].controller.keep_best_metric is None
    assert (
        evaluator["config"].controller.early_stopping_metric is None and evaluator["actions"] == []
    )
