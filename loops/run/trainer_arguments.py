"""A Trainer's arguments as its checked settings: its `loops.RunConfig` with the keyword
overrides, and the step and run options made of its sections."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from loops.core import reporting
from loops.definition import step_options
from loops.definition.run_context import Definition
from loops.placement import Placement
from loops.run.actions import Action
from loops.run.controller_options import ControllerOptions
from loops.run.execution import loop_execution
from loops.run.faults import builtin_rules
from loops.vocabulary import settings
from loops.vocabulary.config_tree import unknown_setting
from loops.vocabulary.run_config_tree import RunConfig

# The settings `loops.Trainer` reads, in declaration order; it takes every setting of
# `loops.RunConfig` as a keyword override, the others only at their defaults.
KEYWORDS = tuple(setting.name for setting in settings.TRAINER_SETTINGS)


def checked_config(config: RunConfig | None, overrides: Mapping[str, Any]) -> RunConfig:
    """`config` (None: the defaults) with the Trainer's keyword `overrides`, each checked by
    its declaration as `RunConfig.replace` checks it.

    Every setting of the tree is taken either way; one a Trainer does not read (declared with
    `elsewhere`: the mode, the strategy's, ...) only at its default, so that none is ignored.

    Raises:
        TypeError: `config` is no RunConfig (a mapping of hyperparameters is `record=`),
            an override that is no setting (naming the closest), or a setting the Trainer
            does not read at another value than its default (`unread_setting`).
        ValueError: a bad value, named with the fix.
    """
    if config is not None and not isinstance(config, RunConfig):
        raise TypeError(
            f"config must be a loops.RunConfig, got a {type(config).__name__}; a mapping of "
            "your hyperparameters to record in results.json is record=... (CHANGELOG.md), "
            "and the run's settings are loops.RunConfig(...) or keyword arguments."
        )
    names = RunConfig.names()
    for name in overrides:
        if name not in names:
            raise TypeError(unknown_setting(name, KEYWORDS, "loops.Trainer"))
    checked = (config or RunConfig()).replace(**overrides)
    for name, value in checked.flat().items():
        setting = settings.BY_NAME[name]
        if not setting.loop and value != setting.default:
            raise TypeError(unread_setting(name, value))
    return checked


def unread_setting(name: str, value: Any) -> str:
    """Why a Trainer refuses `name`=`value`, a setting it does not read (given in its config or
    as a keyword alike), and where the setting goes instead (its declaration's `elsewhere`)."""
    setting = settings.BY_NAME[name]
    return (
        f"{name}={value!r} is not a loops.Trainer setting: {setting.elsewhere}. Leave it at its "
        f"default ({setting.default!r}) in the Trainer's settings (RunConfig.for_trainer() "
        "sets every such setting back to its default)."
    )


def checked_options(
    definition: Definition,
    placement: Placement,
    config: RunConfig,
    *,
    has_train_data: bool,
    progress: reporting.Progress | None,
    actions: Sequence[Action],
    record: Mapping[str, Any] | None,
) -> tuple[step_options.StepOptions, ControllerOptions]:
    """The step and run options of `config`, checked with the definition and where it runs
    (`placement`, read from the strategy and `config`'s parameter-server mode).

    Raises:
        ValueError: a bad option, one the definition cannot train with, or a
            definition handed to a Trainer already.
    """
    definition.check_unbound()
    # Made here too, before build, for their reactions: the run makes its own after build.
    own_rules = definition.bad_step_rules()
    options = step_options.of(config, {type(rule).__name__: rule.reaction for rule in own_rules})
    values = config.flat()
    loop_execution.check_can_run(
        type(definition),
        placement,
        reactions=builtin_rules.reactions_of(options),
        has_train_data=has_train_data or not definition.needs_train_data,
        model_dir=values["model_dir"],
        own_rules=own_rules,
    )
    definition.check_can_train(placement.strategy, options, has_train_data=has_train_data)
    return options, ControllerOptions(
        **config.controller.values(), progress=progress, actions=actions, config=record
    )
