"""What a finished run says: report.json, metrics, timeline, errors, HTML, results JSON, compare, tolerances."""
