// HeraldRedisTests: filled in by its issue.
