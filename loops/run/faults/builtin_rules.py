"""The run's built-in bad-step rules, named once, in the order they scan a call's steps: each
class knows its reaction's setting, how the step options make it, and what it asks of a
definition; a definition's own rules come after them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from loops.definition.bad_step_rules import BadStepRule, NonFiniteSteps, RuleSite
from loops.run.faults.loss_spikes import LossSpikes

# Each one's `setting` is a declared reaction (`settings.REACTIONS`, a test holds them equal):
# adding a rule is its class, its settings' declarations and its line here.
BUILTIN_RULES: tuple[type[BadStepRule], ...] = (NonFiniteSteps, LossSpikes)


def reactions_of(options: Any) -> dict[str, str]:
    """Each built-in rule's reaction in `options` (the run's step options), by its setting."""
    return {rule.setting: getattr(options, rule.setting) for rule in BUILTIN_RULES}


def run_rules(options: Any, site: RuleSite, own_rules: Sequence[BadStepRule]) -> list[BadStepRule]:
    """A run's bad-step rules: the built-in ones its step options turn on, then the
    definition's own (`Loop.bad_step_rules`)."""
    built = (rule.from_options(options, site) for rule in BUILTIN_RULES)
    return [*(rule for rule in built if rule is not None), *own_rules]
