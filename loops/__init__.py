"""loops: custom training loops on tf.distribute that give the same numbers on any replica count."""

import os

# TF 2.21's oneDNN CPU kernels give a replica that holds no example (a partial
# final batch) a wrongly shaped convolution result, and the synchronized batch
# norm collectives then abort ("expected shape [1] but another member in the
# group expected shape [32]"). The plain Eigen kernels are right. Set before
# TensorFlow initializes; export TF_ENABLE_ONEDNN_OPTS=1 to choose otherwise.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

from loops.classifier import ClassifierLoop, sparse_softmax_cross_entropy
from loops.distributed_input import distribute, split_global_batches
from loops.loop import Loop
from loops import reduction
from loops.reduction import (all_finite, apply_gradients, apply_if_finite, global_count,
                             scale_to_global_batch, sum_over_replicas)
from loops.strategies import STRATEGY_NAMES, configure_logical_cpus, make_strategy
from loops import testing

__all__ = [
    "ClassifierLoop",
    "all_finite",
    "apply_if_finite",
    "Loop",
    "STRATEGY_NAMES",
    "apply_gradients",
    "configure_logical_cpus",
    "distribute",
    "global_count",
    "make_strategy",
    "reduction",
    "scale_to_global_batch",
    "sparse_softmax_cross_entropy",
    "split_global_batches",
    "sum_over_replicas",
    "testing",
]
