// HeraldKafkaTests: filled in by its issue.
