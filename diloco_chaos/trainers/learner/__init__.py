"""A learner's training logic without processes or sockets: per-chip state and its collective (`core`), the
training loops of every algorithm (`loops`), and the deterministic lockstep wait (`lockstep`)."""
