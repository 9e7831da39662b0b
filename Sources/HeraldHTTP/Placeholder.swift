// HeraldHTTP: filled in by its issue (see Package.swift for what this target is for).
