"""loops: custom training loops on tf.distribute that give the same numbers on any replica count.

The public names load their modules (and TensorFlow) on first use, so tools
that need none of them, such as the launcher (`loops-launch`),
start without importing TensorFlow.
"""

import importlib

# Public name -> the module that defines it (the module itself when its last part is the name).
_EXPORTS = {
    "Action": "loops.run.actions",
    "BadStep": "loops.definition.bad_step_rules",
    "BadStepRule": "loops.definition.bad_step_rules",
    "EarlyStopping": "loops.run.actions",
    "ExportOnEnd": "loops.run.actions",
    "KeepBest": "loops.run.actions",
    "UnknownMetricError": "loops.run.actions",
    "ClassifierLoop": "loops.kinds.classifier",
    "Controller": "loops.run.controller",
    "sparse_softmax_cross_entropy": "loops.kinds.classifier",
    "distribute": "loops.input.distributed_input",
    "Environment": "loops.input.environments",
    "environments": "loops.input.environments",
    "GANLoop": "loops.kinds.gan",
    "split_global_batches": "loops.input.distributed_input",
    "SeekableBatches": "loops.input.random_access",
    "random_access": "loops.input.random_access",
    "LanguageModelLoop": "loops.kinds.lm",
    "CTRLoop": "loops.kinds.ctr",
    "RatingLoop": "loops.kinds.rating",
    "RetrievalLoop": "loops.kinds.retrieval",
    "Loop": "loops.definition.loop",
    "Flag": "loops.core.outputs",
    "Highest": "loops.core.outputs",
    "Last": "loops.core.outputs",
    "Mean": "loops.core.outputs",
    "Ratio": "loops.core.outputs",
    "Sum": "loops.core.outputs",
    "Update": "loops.core.update",
    "EmbeddingTable": "loops.tables.embedding_tables",
    "DynamicTable": "loops.tables.dynamic_tables",
    "AdmissionPolicy": "loops.tables.id_map",
    "initial_rows": "loops.tables.id_rows",
    "RowwiseAdagrad": "loops.tables.rowwise_adagrad",
    "LazyAdam": "loops.tables.lazy_adam",
    "TablePlan": "loops.tables.table_plan",
    "TablePartitioner": "loops.placement",
    "any_bad": "loops.core.update",
    "UpdateContext": "loops.core.update_context",
    "UpdateOptions": "loops.core.update_context",
    "NonFiniteUpdates": "loops.core.nonfinite_updates",
    "NonFiniteError": "loops.vocabulary.errors",
    "LossSpikeError": "loops.vocabulary.errors",
    "DamagedCheckpointError": "loops.vocabulary.errors",
    "mixed_precision": "loops.core.mixed_precision",
    "reduction": "loops.core.reduction",
    "replica_random": "loops.core.replica_random",
    "all_finite": "loops.core.gradients",
    "apply_gradients": "loops.core.gradients",
    "apply_if_finite": "loops.core.gradients",
    "global_count": "loops.core.reduction",
    "gather_global_rows": "loops.core.global_rows",
    "global_row_offset": "loops.core.global_rows",
    "scale_to_global_batch": "loops.core.reduction",
    "sum_over_replicas": "loops.core.reduction",
    "ActorCriticLoop": "loops.kinds.rl.actor_critic",
    "DQNLoop": "loops.kinds.rl.dqn",
    "EnvironmentLoop": "loops.kinds.rl.environment_loop",
    "evaluate_checkpoints": "loops.run.sidecar",
    "find_learning_rate": "loops.run.lr_finder",
    "STRATEGY_NAMES": "loops.cluster.strategies",
    "configure_logical_cpus": "loops.cluster.strategies",
    "make_strategy": "loops.cluster.strategies",
    "testing": "loops.testing",
    "Trainer": "loops.run.trainer",
    "WarmStart": "loops.model_dir.warm_start",
    "RunConfig": "loops.vocabulary.run_config_tree",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module_name = _EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'loops' has no attribute {name!r}")
    module = importlib.import_module(module_name)
    value = module if module_name.rsplit(".", 1)[-1] == name else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
