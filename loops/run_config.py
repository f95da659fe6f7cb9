"""The run's recorded configuration: config.json, and a warning when a resume changes it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from loops import reporting

# Config keys a resumed run may change without a warning: how long it trains, how
# often it evaluates and saves, where its outputs go, and the evaluator's settings
# (`Loop.config_free_to_change`).
CONFIG_FREE_TO_CHANGE = frozenset(
    {
        "mode",
        "evaluator_timeout",
        "train_steps",
        "model_dir",
        "export_dir",
        "verbosity",
        "eval_every",
        "checkpoint_every",
        "steps_per_loop",
        # Raising it is how a run that gave up recovering goes on.
        "max_recoveries",
    }
)


def record_config(
    model_dir: str,
    config: Mapping[str, Any],
    checkpoint_items: Mapping[str, Any],
    *,
    resuming: bool,
    free_to_change: frozenset[str],
    say: Callable[[str], None],
) -> None:
    """Warns about settings that differ from the run that wrote model_dir; records these.

    The settings are the run's config and the type of each checkpointed item.
    """
    current = {
        **config,
        **{f"checkpoint.{name}": type(item).__name__ for name, item in checkpoint_items.items()},
    }
    path = os.path.join(model_dir, "config.json")
    if resuming and os.path.exists(path):
        try:
            with open(path) as stream:
                previous = json.load(stream)
        except (OSError, ValueError):
            previous = {}
        changed = sorted(
            key
            for key in set(previous) | set(current)
            if key not in free_to_change and previous.get(key) != current.get(key)
        )
        for key in changed:
            say(
                f"warning: {key} was {previous.get(key)!r} in the run that wrote "
                f"{model_dir} and is {current.get(key)!r} now; the checkpoint is "
                "restored and training goes on with the new value. If that is not what "
                "you meant, stop and rerun with the old value or a new --model_dir."
            )
    reporting.write_json_atomic(path, current)
