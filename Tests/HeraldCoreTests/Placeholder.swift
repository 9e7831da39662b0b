// HeraldCoreTests: filled in by its issue.
