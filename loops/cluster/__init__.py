"""The side wing that starts a process's strategy: strategies by name, a cluster from
TF_CONFIG, SLURM or Kubernetes, the wait for its peers, the start-up watchdog and the
local launcher. Only the command line, the binaries, loops.testing and two parts of the
run import it; everything else reads a strategy through loops.topology."""
