"""Where a definition's steps run: the strategy check, the coordinator, the executor."""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from loops import topology
from loops.run import bad_steps, exact_parameter_server, executors
from loops.run.bad_step_rules import BadStepRule, NonFiniteSteps
from loops.run.loss_spikes import LossSpikes


def check_can_run(
    loop_class: type,
    strategy: tf.distribute.Strategy,
    *,
    on_nonfinite: str,
    has_train_data: bool,
    model_dir: str | None,
    on_loss_spike: str = "ignore",
    parameter_server_mode: str = exact_parameter_server.EXACT,
    own_rules: Sequence[BadStepRule] = (),
) -> None:
    """Raises ValueError when a loop of `loop_class` cannot train under `strategy` so.

    Args:
        loop_class: the definition's class; its `supports_parameter_server` says
            whether its steps are right for asynchronous workers.
        has_train_data: whether the loop has train data, or makes its own.
        own_rules: the definition's own bad-step rules (`Loop.bad_step_rules`),
            refused as the built-in ones are where they recover and cannot.
    """
    name = loop_class.__name__
    if topology.strategy_name(strategy) == "parameter_server":
        check_parameter_server_mode(loop_class, parameter_server_mode)
    if on_loss_spike != "ignore" and getattr(loop_class, "watched_loss", "loss") is None:
        raise ValueError(
            f"on_loss_spike={on_loss_spike!r} watches a loss for spikes, and {name} names "
            "none (its watched_loss is None: its losses grow as it learns, which is no "
            "sign of divergence). Pass on_loss_spike='ignore', or set watched_loss in a "
            "subclass to an output bounded below by 0."
        )
    rules: tuple[tuple[type[BadStepRule], str], ...] = (
        (NonFiniteSteps, on_nonfinite),
        (LossSpikes, on_loss_spike),
        *((type(rule), rule.reaction) for rule in own_rules),
    )
    for rule, policy in rules:
        if policy == "recover":
            bad_steps.check_can_recover(
                name,
                strategy,
                rule,
                has_train_data=has_train_data,
                model_dir=model_dir,
                parameter_server_mode=parameter_server_mode,
            )


def check_parameter_server_mode(loop_class: type, mode: str) -> None:
    """Raises ValueError, with the reason and the fix, when a loop of `loop_class` does not
    train in parameter-server mode `mode`.

    Every loop right for asynchronous workers (`supports_parameter_server`) trains in
    both modes; one whose steps are built on `loops.Update` alone
    (`supports_exact_parameter_server`) in the exact mode only.
    """
    name = loop_class.__name__
    asynchronous = getattr(loop_class, "supports_parameter_server", False)
    exact = asynchronous or getattr(loop_class, "supports_exact_parameter_server", False)
    reason = getattr(loop_class, "parameter_server_reason", "its steps need synchronous replicas")
    if mode == exact_parameter_server.EXACT and not exact:
        raise ValueError(
            f"{name} does not train under ParameterServerStrategy ({reason}). Use "
            "--strategy=multi_worker_mirrored or mirrored."
        )
    if mode == exact_parameter_server.ASYNC and not asynchronous:
        exact_fix = "--parameter_server_mode=exact (the default), or " if exact else ""
        raise ValueError(
            f"{name} does not train under ParameterServerStrategy with "
            f"parameter_server_mode='async' ({reason}). Use {exact_fix}"
            "--strategy=multi_worker_mirrored or mirrored."
        )


def coordinator(
    strategy: tf.distribute.Strategy,
) -> tf.distribute.experimental.coordinator.ClusterCoordinator | None:
    """Under ParameterServerStrategy, the coordinator this process is; else None.

    There the steps run asynchronously on the workers (loops/run/parameter_server.py).
    """
    if topology.strategy_name(strategy) != "parameter_server":
        return None
    return tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)


def make_executor(
    definition: executors.StepDefinition,
    *,
    coordinator: tf.distribute.experimental.coordinator.ClusterCoordinator | None,
    run_eagerly: bool,
    stop_on_nonfinite: bool,
    parameter_server_mode: str = exact_parameter_server.EXACT,
    worker_gradients: object = None,
) -> executors.Executor:
    """The executor of a loop's steps: applied once by the chief from the workers' gradients
    (exact), scheduled on the workers (async), eager, or compiled."""
    if coordinator is not None and parameter_server_mode == exact_parameter_server.EXACT:
        return exact_parameter_server.ExactExecutor(
            definition, stop_on_nonfinite=stop_on_nonfinite, worker_gradients=worker_gradients
        )
    if coordinator is not None:
        return executors.ScheduledExecutor(definition, coordinator=coordinator)
    executor_class = executors.EagerExecutor if run_eagerly else executors.Executor
    return executor_class(definition, stop_on_nonfinite=stop_on_nonfinite)
