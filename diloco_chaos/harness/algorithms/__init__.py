"""One descriptor module per training algorithm, and the registry they fill (base.py); docs/api.md says how to
add one."""
