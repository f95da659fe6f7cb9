"""Command-line binaries, one per kind of loop."""
