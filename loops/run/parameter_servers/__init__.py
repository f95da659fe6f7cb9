"""The exact parameter-server mode: each step's slices computed on the workers and applied once
by the chief, and what a slice sends the chief."""
