"""The exit codes of a loops binary and of loops-launch, so a scheduler can tell runs apart."""

# A run that finished (or stopped early by an action) exits 0.
FINISHED = 0
# A run preempted by SIGTERM exits with this code after saving every completed
# step; rerunning the same command continues from there. TensorFlow's own
# preemption handler (tf.distribute.experimental.PreemptionCheckpointHandler)
# uses the same number.
PREEMPTED = 42
