// HeraldDispatcherTests: filled in by its issue.
