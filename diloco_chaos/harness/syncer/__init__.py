"""The synchronizer process: service, transport, per-algorithm handlers, accounting, checkpoints, evaluator, shards."""
