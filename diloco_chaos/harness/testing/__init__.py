"""For test suites: the pytest plugin, hostile peers, process hygiene, kept failed runs."""
