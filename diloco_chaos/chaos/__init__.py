"""Fault injectors for the chaos-testing harness."""
