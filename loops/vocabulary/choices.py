"""The names a run picks from (strategies, metric modes, precision policies), kept free of
TensorFlow so that a binary checks its flags before TensorFlow loads."""

# What a step whose loss or gradients are not finite leads to (`Loop`'s on_nonfinite).
NONFINITE_POLICIES = ("stop", "skip", "recover")
LOSS_SPIKE_POLICIES = ("ignore", "stop", "recover")
STRATEGY_NAMES = (
    "default",
    "one_device",
    "mirrored",
    "central_storage",
    "multi_worker_mirrored",
    "parameter_server",
    "tpu",
)
# Strategies whose replicas are this host's devices (GPUs, else logical CPUs),
# as many as the run asks for; the others take their devices from the machine
# or the cluster.
LOCAL_REPLICA_STRATEGIES = ("mirrored", "central_storage")
# Strategies that run in one process on this host's devices, without a TF_CONFIG cluster.
ONE_PROCESS_STRATEGIES = ("default", "one_device", *LOCAL_REPLICA_STRATEGIES)
# The strategies whose processes form a TF_CONFIG cluster (the others run in one process).
CLUSTER_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
# How --strategy=parameter_server applies a step: once, from every worker's gradients (exact),
# or per worker as each finishes (async).
PARAMETER_SERVER_MODES = ("exact", "async")
# Where a multi-process strategy's cluster comes from (`loops.cluster.scheduler_cluster`).
CLUSTER_SOURCES = ("auto", "tf_config", "slurm", "kubernetes")
# Whether a lower or a higher value of a watched eval metric is better.
METRIC_MODES = ("min", "max")
PRECISION_POLICIES = ("none", "mixed_bfloat16", "mixed_float16")
