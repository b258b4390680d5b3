"""Chaos-testing harness: learners, the central synchronizer, and the wire between them."""
