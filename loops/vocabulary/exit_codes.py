"""The exit codes of a loops binary and of loops-launch, so a scheduler can tell runs apart,
and the signals that preempt a run."""

import signal

# A run that finished (or stopped early by an action) exits 0.
FINISHED = 0
# A run preempted by one of PREEMPTION_SIGNALS exits with this code after saving
# every completed step; rerunning the same command continues from there.
# TensorFlow's own preemption handler
# (tf.distribute.experimental.PreemptionCheckpointHandler) uses the same number.
PREEMPTED = 42
# What schedulers send before they stop a job: SIGTERM (Kubernetes, most
# managers, `kill`), and SIGUSR1 where a job asks for a warning ahead of its
# time limit (SLURM's `--signal=USR1@90`, often with `--requeue`).
PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
