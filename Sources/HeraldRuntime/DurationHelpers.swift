extension Duration {
    /// Whole milliseconds, truncated toward zero; saturates instead of overflowing.
    public var inMilliseconds: Int64 { scaled(1000) }

    /// Whole microseconds, truncated toward zero; saturates instead of overflowing.
    public var inMicroseconds: Int64 { scaled(1_000_000) }

    /// Whole nanoseconds, truncated toward zero; saturates instead of overflowing.
    public var inNanoseconds: Int64 { scaled(1_000_000_000) }

    /// Seconds as a floating-point number.
    public var inSeconds: Double {
        Double(components.seconds) + Double(components.attoseconds) / 1e18
    }

    /// Seconds as written in a `…_SECONDS` setting: "5", "0.5".
    public var secondsText: String {
        components.attoseconds == 0 ? "\(components.seconds)" : "\(inSeconds)"
    }

    private func scaled(_ perSecond: Int64) -> Int64 {
        let (seconds, attoseconds) = components
        let (whole, overflow) = seconds.multipliedReportingOverflow(by: perSecond)
        if overflow { return seconds < 0 ? .min : .max }
        let (total, overflowAgain) = whole.addingReportingOverflow(attoseconds / (1_000_000_000_000_000_000 / perSecond))
        return overflowAgain ? (seconds < 0 ? .min : .max) : total
    }
}

extension ContinuousClock.Instant {
    /// The timeout to hand poll(2) or epoll_wait to wake at this instant: whole milliseconds rounded up (so the
    /// wait never ends before it), 0 once it has passed, at most `cap`.
    public func pollMilliseconds(cappedAt cap: Duration) -> Int32 {
        let left = self - .now
        guard left > .zero else { return 0 }
        let millis = (min(left, cap) + .nanoseconds(999_999)).inMilliseconds
        return Int32(clamping: millis)
    }
}
