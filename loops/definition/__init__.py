"""What a definition is written against: the Loop base class, the context its step and hooks
are given, its options, the executors that run its step, and the bad-step rules it may add;
nothing of the run that trains it."""
