"""What a step is written with: typed outputs, the one update, reductions to the global
batch, and their helpers."""
