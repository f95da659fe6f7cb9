"""The run around a definition: the Trainer it is handed to, its Controller and parts,
checkpoints, evaluation and faults."""
