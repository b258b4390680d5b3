"""Training-side building blocks for the Decoupled DiLoCo chaos-testing harness."""
