"""Which strategy and cluster a process runs in: strategies by name, the wait for a
cluster's peers, and the local launcher."""
