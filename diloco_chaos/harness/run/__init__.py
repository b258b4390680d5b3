"""One run from start to end: the supervisor, the fault runner, process helpers, the run directory, the live progress,
replay."""
