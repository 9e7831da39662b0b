// HeraldIngestTests: filled in by its issue.
