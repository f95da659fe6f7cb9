"""What a run keeps in its model_dir: checkpoints, the one-writer lock, the recorded
settings, and exports."""
