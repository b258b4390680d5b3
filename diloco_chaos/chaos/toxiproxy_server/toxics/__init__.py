"""One module per toxic; each registers itself with ``toxic.register`` when imported."""
