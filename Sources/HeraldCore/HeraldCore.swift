/// Domain model and validation for Herald: apps, keys, subscriptions, registrations, push jobs. No I/O.
public enum HeraldCore {}
