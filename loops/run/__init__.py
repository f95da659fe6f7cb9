"""The run around a step: the Loop a kind subclasses, its Controller and parts,
checkpoints, evaluation and faults."""
