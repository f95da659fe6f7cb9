"""What a user of a removed API is told: what replaced a v2 Loop's run settings and methods,
and the Trainer's forwarding properties.

Until 3.0.0 a `loops.Loop` took the run's settings (`MyLoop(strategy=...,
train_data=...)`) and ran itself (`loop.train(n)`); since then a definition is
handed to a `loops.Trainer` with them (CHANGELOG.md, "3.0.0"). Without these
sentences the old calls fail with Python's own `TypeError: MyLoop() takes no
arguments` or a bare AttributeError.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable

from loops.vocabulary import settings

# The Trainer's arguments that are objects, not declared settings (a test holds these with
# the declared ones equal to `loops.Trainer.__init__`'s arguments and keyword overrides).
TRAINER_OBJECTS = (
    "config",
    "strategy",
    "train_data",
    "eval_data",
    "progress",
    "actions",
    "record",
    "table_plan",
    "warm_start",
)
TRAINER_KEYWORDS = frozenset(TRAINER_OBJECTS) | {s.name for s in settings.TRAINER_SETTINGS}
# What a v2 Loop did itself and a Trainer does now.
RUN_METHODS = frozenset(
    {"train", "evaluate", "request_stop", "save_checkpoint", "write_results", "close", "controller"}
)
_CHANGELOG = "CHANGELOG.md, 3.0.0"
_CHANGELOG_STATE = "CHANGELOG.md, the Trainer's state"


def check_no_run_settings(definition_class: type, keywords: Iterable[str]) -> None:
    """Raises TypeError naming the Trainer when a definition is given the run's settings.

    Only keywords the class's own `__init__` does not take count: a kind may take
    an argument of the same name (e.g. its own `clip_norm`) as one of its own.
    """
    given = TRAINER_KEYWORDS.intersection(keywords)
    if not given:
        return
    init = inspect.getattr_static(definition_class, "__init__")
    own = set() if init is object.__init__ else set(inspect.signature(init).parameters)
    refused = sorted(given - own)
    if not refused:
        return
    kind = definition_class.__name__
    arguments = ", ".join(f"{name}=..." for name in refused)
    definition = f"{kind}()" if own <= {"self"} else f"{kind}(...)"
    raise TypeError(
        f"{kind} takes no run settings (got {', '.join(refused)}): a definition says what a "
        f"step does, and a loops.Trainer runs it with the run's settings; write "
        f"loops.Trainer({definition}, {arguments}) ({_CHANGELOG})."
    )


def run_method_sentence(kind: str, name: str) -> str:
    """Why a definition has no `name` (a v2 Loop's run method), and what to call instead."""
    return (
        f"{kind} has no {name}: a definition does not run itself; a loops.Trainer runs it, "
        f"trainer = loops.Trainer({kind}(...), train_data=..., ...), and use trainer.{name} "
        f"({_CHANGELOG})."
    )


# The Trainer's properties until 3.x that forwarded to its parts, and what replaced each:
# its state (`trainer.state`), what its actions see (`trainer.run_context`), or a plain
# attribute. A read of an old name raises AttributeError with the sentence.
MOVED_TRAINER_MEMBERS = {
    "step": "trainer.state.step",
    "last_train_metrics": "trainer.state.last_train_metrics",
    "last_eval_metrics": "trainer.state.last_eval_metrics",
    "steps_per_second": "trainer.state.steps_per_second",
    "units_per_second": "trainer.state.units_per_second",
    "skipped_steps": "trainer.state.skipped_steps",
    "stop_reason": "trainer.state.stop_reason",
    "preempted": "trainer.state.preempted",
    "model_dir": "trainer.run_context.model_dir",
    "eval_every": "trainer.run_context.eval_every",
    "config": "trainer.run_context.config",
    "is_chief": "trainer.run_context.is_chief",
    "progress": "trainer.run_context.progress",
    "summaries": "trainer.run_context.summaries",
    "checkpointer": "trainer.run_context.checkpointer",
    "num_replicas": "trainer.strategy.num_replicas_in_sync",
    "leaves_out_nonfinite": "trainer.step_context.update.nonfinite.skips",
    "evaluate_eval_data": "trainer.run_context.evaluate_eval_data()",
    "eval_step_output_names": "trainer.run_context.eval_step_output_names()",
}


def moved_member_sentence(name: str) -> str | None:
    """What replaced the Trainer's old member `name`; None when `name` is no old member."""
    replacement = MOVED_TRAINER_MEMBERS.get(name)
    if replacement is None:
        return None
    kind = "its state" if replacement.startswith("trainer.state.") else "a part of it"
    return (
        f"Trainer.{name} was removed: the Trainer's public face is its methods and its parts; "
        f"read {replacement} ({kind}) instead ({_CHANGELOG_STATE})."
    )
