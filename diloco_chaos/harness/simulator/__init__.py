"""Goodput simulator at the paper's scale (`diloco-chaos simulate`), calibrated on the harness's own runs."""
