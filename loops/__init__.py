"""loops: custom training loops on tf.distribute that give the same numbers on any replica count.

The public names load their modules (and TensorFlow) on first use, so tools
that need none of them, such as the launcher (`python -m loops.launch`),
start without importing TensorFlow.
"""

import importlib

# Public name -> the module that defines it (a module itself when the names match).
_EXPORTS = {
    "Action": "loops.actions",
    "EarlyStopping": "loops.actions",
    "ExportOnEnd": "loops.actions",
    "KeepBest": "loops.actions",
    "UnknownMetricError": "loops.actions",
    "ClassifierLoop": "loops.classifier",
    "Controller": "loops.controller",
    "sparse_softmax_cross_entropy": "loops.classifier",
    "distribute": "loops.distributed_input",
    "Environment": "loops.environments",
    "environments": "loops.environments",
    "GANLoop": "loops.gan",
    "split_global_batches": "loops.distributed_input",
    "SeekableBatches": "loops.random_access",
    "random_access": "loops.random_access",
    "LanguageModelLoop": "loops.lm",
    "Loop": "loops.loop",
    "Last": "loops.outputs",
    "Mean": "loops.outputs",
    "Ratio": "loops.outputs",
    "Sum": "loops.outputs",
    "Update": "loops.update",
    "NonFiniteError": "loops.errors",
    "DamagedCheckpointError": "loops.errors",
    "mixed_precision": "loops.mixed_precision",
    "reduction": "loops.reduction",
    "replica_random": "loops.replica_random",
    "all_finite": "loops.gradients",
    "apply_gradients": "loops.gradients",
    "apply_if_finite": "loops.gradients",
    "global_count": "loops.reduction",
    "gather_global_rows": "loops.global_rows",
    "global_row_offset": "loops.global_rows",
    "scale_to_global_batch": "loops.reduction",
    "sum_over_replicas": "loops.reduction",
    "ActorCriticLoop": "loops.rl.actor_critic",
    "DQNLoop": "loops.rl.dqn",
    "EnvironmentLoop": "loops.rl.environment_loop",
    "evaluate_checkpoints": "loops.sidecar",
    "STRATEGY_NAMES": "loops.strategies",
    "configure_logical_cpus": "loops.strategies",
    "make_strategy": "loops.strategies",
    "testing": "loops.testing",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'loops' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if module_name == f"loops.{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
