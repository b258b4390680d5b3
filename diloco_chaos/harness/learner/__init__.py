"""A learner host's processes: the chip process, its link to the syncer, the link process and their shared state."""
