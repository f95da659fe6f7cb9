"""What a run does about faults: bad steps (non-finite updates, loss spikes) stopped or recovered
from, a preemption signal turned into a checkpoint, a failed call's frames cleared."""
