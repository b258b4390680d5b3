"""Systems under test (docs/targets.md): the built-in learners and syncer, and torchft."""
