// HeraldAPNsTests: filled in by its issue.
