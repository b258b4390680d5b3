"""`diloco-chaos explore`: draw fault schedules from a scenario's `[explore]` table, run each with real processes,
judge them by the invariants, and shrink each failure to a minimal incident file (docs/explore.md)."""
