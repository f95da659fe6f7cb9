"""loops: custom training loops on tf.distribute that give the same numbers on any replica count."""

from loops.classifier import ClassifierLoop, sparse_softmax_cross_entropy
from loops.distributed_input import distribute, split_global_batches
from loops.loop import Loop
from loops.reduction import apply_gradients, global_count, scale_to_global_batch, sum_over_replicas
from loops.strategies import STRATEGY_NAMES, configure_logical_cpus, make_strategy

__all__ = [
    "ClassifierLoop",
    "Loop",
    "STRATEGY_NAMES",
    "apply_gradients",
    "configure_logical_cpus",
    "distribute",
    "global_count",
    "make_strategy",
    "scale_to_global_batch",
    "sparse_softmax_cross_entropy",
    "split_global_batches",
    "sum_over_replicas",
]
