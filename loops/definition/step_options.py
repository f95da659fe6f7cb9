"""How a definition's steps compute, beside how its run goes
(`loops.run.controller_options`): checked when made."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from loops.core import mixed_precision as mixed_precision_lib
from loops.core.update_context import UpdateOptions
from loops.definition import recovery
from loops.vocabulary import settings
from loops.vocabulary.run_config_tree import RunConfig, StepSettings


@dataclasses.dataclass(frozen=True)
class StepOptions(StepSettings, UpdateOptions):
    """The options of a definition's steps and of the `loops.Update`s they make, checked:
    the `step` and `update` sections of a run's `loops.RunConfig` (`of`).

    Each is declared, with its type, default, help and check, in
    loops/vocabulary/settings.py (as the flags are; the sections' fields are generated
    from there); this says what it means to a step. The options every `loops.Update`
    follows (mixed_precision, loss_scale_growth_steps, grad_accum_steps, ema_decay,
    jit_compile, health_every) are `UpdateOptions`' fields, which it inherits; under
    "mixed_float16" `build` runs in the Keras dtype policy, and `of` fills in the loss
    scale's default growth (2000).

    Attributes:
        seed: the seed steps key their randomness on.
        run_eagerly: run steps without `tf.function`, for debugging.
        on_nonfinite: what a step whose loss or gradients are not finite on
            some replica (its `nonfinite` output is set) leads to. "stop":
            the inner loop ends right after it, nothing is saved after it,
            the loop goes back to its last checkpoint and NonFiniteError
            names the step (without a checkpoint, the loop then refuses to
            train on). "skip": its update is not applied on any replica and
            training goes on; every update then waits for the finiteness
            check (`Loop.apply_update`). "recover": as "stop", but then
            training goes on from the last checkpoint (step s) with the train
            stream moved past every batch from there to the bad step b, so
            steps s + 1, ... read the batches that came after step b's; each
            recovery is logged (progress, TensorBoard `recoveries`,
            results.json `recoveries`) and checkpointed. Weights found not
            finite after an inner loop recover the same way, b being its last
            step. Needs a model_dir (a checkpoint of step 0 is saved when
            there is none) and train_data, and does not run under
            ParameterServerStrategy's asynchronous mode.
        max_recoveries: under "recover", how many recoveries a run may make
            (counted over resumes: the count is checkpointed) before the next
            non-finite step raises NonFiniteError (default 3).
        on_loss_spike: what a loss spike leads to (`loops.run.faults.loss_spikes`):
            "ignore"; "stop": back to the last checkpoint, and LossSpikeError
            names the spike; "recover": as on_nonfinite's "recover", counted
            against the same max_recoveries (then LossSpikeError).
        loss_spike_factor, loss_spike_steps, loss_spike_window: the rule: a
            loss above factor times its slow moving average (over a window
            of steps) for `steps` steps in a row is a spike.

    Made by `of`, which fills in the defaults of None.
    """


def of(config: RunConfig, own_reactions: Mapping[str, str] | None = None) -> StepOptions:
    """A run's step options: its `step` and `update` sections (checked as `config` was made);
    None: the default. `own_reactions`: the definition's own bad-step rules' class names ->
    their reactions, which max_recoveries may apply to.

    Raises:
        ValueError: max_recoveries without a policy that recovers, or two options
            that do not go together, named with the fix.
    """
    values = config.flat()
    named = {**config.step.values(), **config.update.values()}
    named["max_recoveries"] = recovery.check_max_recoveries(
        values["max_recoveries"],
        {name: values[name] for name in settings.REACTIONS},
        own_reactions,
    )
    _check_combinations(values)
    growth_steps = values["loss_scale_growth_steps"] or settings.DEFAULT_LOSS_SCALE_GROWTH_STEPS
    return StepOptions(**{**named, "loss_scale_growth_steps": growth_steps})


def _check_combinations(values: Mapping[str, Any]) -> None:
    """Raises ValueError, with the fix, for two step options that do not go together."""
    mixed_precision, growth_steps = values["mixed_precision"], values["loss_scale_growth_steps"]
    if growth_steps is not None and not mixed_precision_lib.needs_loss_scale(mixed_precision):
        raise ValueError(
            f"loss_scale_growth_steps={growth_steps!r} applies only to "
            f"mixed_precision='mixed_float16' (got {mixed_precision!r}); drop it or "
            "switch to float16."
        )
    if values["jit_compile"] and values["run_eagerly"]:
        raise ValueError(
            "jit_compile=True compiles each replica's pass through the model inside the "
            "step's tf.function, and run_eagerly=True runs the steps without one. Set one "
            "of them to False (--jit_compile=false or --run_eagerly=false)."
        )
