"""Where a definition's steps run: the strategy check, the coordinator, the executor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

from loops.definition import executors
from loops.definition.bad_step_rules import BadStepRule
from loops.placement import Placement
from loops.run.faults import bad_steps, builtin_rules
from loops.run.parameter_servers import exact_parameter_server


def check_can_run(
    loop_class: type,
    placement: Placement,
    *,
    reactions: Mapping[str, str],
    has_train_data: bool,
    model_dir: str | None,
    own_rules: Sequence[BadStepRule] = (),
) -> None:
    """Raises ValueError when a loop of `loop_class` cannot train where `placement` runs it so.

    Args:
        loop_class: the definition's class; its `supports_parameter_server` says
            whether its steps are right for asynchronous workers.
        placement: where the run's variables live and its steps run.
        reactions: the built-in bad-step rules' reactions by setting
            (`builtin_rules.reactions_of` the step options).
        has_train_data: whether the loop has train data, or makes its own.
        own_rules: the definition's own bad-step rules (`Loop.bad_step_rules`),
            refused as the built-in ones are where they recover and cannot.
    """
    name = loop_class.__name__
    check_can_place(loop_class, placement)
    rules: list[tuple[type[BadStepRule], str]] = []
    for rule in builtin_rules.BUILTIN_RULES:
        rule.check_definition(loop_class, reactions[rule.setting])
        rules.append((rule, reactions[rule.setting]))
    rules += [(type(rule), rule.reaction) for rule in own_rules]
    for rule_class, policy in rules:
        if policy == "recover":
            bad_steps.check_can_recover(
                name, placement, rule_class, has_train_data=has_train_data, model_dir=model_dir
            )


def check_can_place(loop_class: type, placement: Placement) -> None:
    """Raises ValueError, with the reason and the fix, when a loop of `loop_class` does not
    train where `placement` puts its variables and runs its steps.

    Only parameter servers refuse a loop: every loop right for asynchronous workers
    (`supports_parameter_server`) trains in both modes; one whose steps are built on
    `loops.Update` alone (`supports_exact_parameter_server`) in the exact mode only.
    """
    if not placement.variables_on_servers:
        return
    name = loop_class.__name__
    asynchronous = getattr(loop_class, "supports_parameter_server", False)
    exact = asynchronous or getattr(loop_class, "supports_exact_parameter_server", False)
    reason = getattr(loop_class, "parameter_server_reason", "its steps need synchronous replicas")
    if placement.exact_parameter_server and not exact:
        raise ValueError(
            f"{name} does not train under ParameterServerStrategy ({reason}). Use "
            "--strategy=multi_worker_mirrored or mirrored."
        )
    if placement.steps_out_of_order and not asynchronous:
        exact_fix = "--parameter_server_mode=exact (the default), or " if exact else ""
        raise ValueError(
            f"{name} does not train under ParameterServerStrategy with "
            f"parameter_server_mode='async' ({reason}). Use {exact_fix}"
            "--strategy=multi_worker_mirrored or mirrored."
        )


def coordinator(
    placement: Placement,
) -> tf.distribute.experimental.coordinator.ClusterCoordinator | None:
    """Where the variables live on parameter servers, the coordinator this process is; else
    None. It schedules functions on the workers (`loops.placement`)."""
    if not placement.variables_on_servers:
        return None
    return tf.distribute.experimental.coordinator.ClusterCoordinator(placement.strategy)


def make_executor(
    definition: executors.StepDefinition,
    *,
    coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator | None,
    run_eagerly: bool,
    stop_on_nonfinite: bool,
    worker_gradients: object = None,
) -> executors.Executor:
    """The executor of a loop's steps: applied once by the chief from the gradients the
    workers compute (`worker_gradients`, the exact parameter-server mode), scheduled on the
    workers (`coordinator` alone, the asynchronous mode), eager, or compiled."""
    if worker_gradients is not None:
        return exact_parameter_server.ExactExecutor(
            definition, stop_on_nonfinite=stop_on_nonfinite, worker_gradients=worker_gradients
        )
    if coordinator is not None:
        return executors.ScheduledExecutor(definition, coordinator=coordinator)
    executor_class = executors.EagerExecutor if run_eagerly else executors.Executor
    return executor_class(definition, stop_on_nonfinite=stop_on_nonfinite)
