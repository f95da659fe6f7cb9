"""The run around a step: the Loop a definition subclasses, the Trainer it is handed to, its
Controller and parts, checkpoints, evaluation and faults."""
