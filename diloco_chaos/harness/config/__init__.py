"""The scenario: its model, loading, checking, task resolution, generated reference and built-in scenarios."""
