// HeraldCryptoTests: filled in by its issue.
