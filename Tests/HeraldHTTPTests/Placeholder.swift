// HeraldHTTPTests: filled in by its issue.
