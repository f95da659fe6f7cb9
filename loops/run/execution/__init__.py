"""How a run's train steps execute: where they run (the executor, the coordinator), the schedule
of its inner loops, and each inner loop's calls, reports and bad-step checks."""
