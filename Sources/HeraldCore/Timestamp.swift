import Foundation

/// RFC 3339 times with milliseconds in UTC, as in jobs, dead letters and API bodies.
public enum Timestamp {
    /// `2026-11-30T06:03:18.123Z`: whole milliseconds, truncated (as Foundation's ISO 8601 style writes them).
    ///
    /// Written by hand for 1970–9999: Foundation's format style was a few percent of herald-ingest's CPU per
    /// event (every job gets a `createdAt`). Other times go through Foundation.
    public static func rfc3339(_ date: Date) -> String {
        let interval = date.timeIntervalSince1970
        let whole = interval.rounded(.down)
        guard whole >= 0, whole < 253_402_300_800 else { // 1970-01-01 ... 9999-12-31
            return foundationRFC3339(date)
        }
        return format(seconds: Int64(whole), millis: min(999, Int((interval - whole) * 1000)))
    }

    /// `rfc3339` of a time in whole milliseconds since 1970, exact (no trip through a `Double`'s fraction): a
    /// registration stores its last-seen time in milliseconds and readers format it from them.
    public static func rfc3339(milliseconds: Int64) -> String {
        guard milliseconds >= 0, milliseconds < 253_402_300_800_000 else {
            return foundationRFC3339(Date(timeIntervalSince1970: Double(milliseconds) / 1000))
        }
        return format(seconds: milliseconds / 1000, millis: Int(milliseconds % 1000))
    }

    /// `YYYY-MM-DDTHH:MM:SS.sssZ` of a time in 1970–9999.
    private static func format(seconds: Int64, millis: Int) -> String {
        let (days, secondOfDay) = (seconds / 86_400, Int(seconds % 86_400))
        let (year, month, day) = civil(fromDays: days)
        return String(unsafeUninitializedCapacity: 24) { buffer in
            func put(_ value: Int, _ digits: Int, at offset: Int) {
                var value = value
                for index in stride(from: offset + digits - 1, through: offset, by: -1) {
                    buffer[index] = UInt8(ascii: "0") + UInt8(value % 10)
                    value /= 10
                }
            }
            put(year, 4, at: 0); buffer[4] = UInt8(ascii: "-")
            put(month, 2, at: 5); buffer[7] = UInt8(ascii: "-")
            put(day, 2, at: 8); buffer[10] = UInt8(ascii: "T")
            put(secondOfDay / 3600, 2, at: 11); buffer[13] = UInt8(ascii: ":")
            put(secondOfDay / 60 % 60, 2, at: 14); buffer[16] = UInt8(ascii: ":")
            put(secondOfDay % 60, 2, at: 17); buffer[19] = UInt8(ascii: ".")
            put(millis, 3, at: 20); buffer[23] = UInt8(ascii: "Z")
            return 24
        }
    }

    /// Foundation's formatting, for years outside 1970–9999 and as the reference in tests.
    public static func foundationRFC3339(_ date: Date) -> String {
        date.formatted(.iso8601.year().month().day().dateSeparator(.dash).time(includingFractionalSeconds: true)
            .timeSeparator(.colon).timeZone(separator: .omitted))
    }

    public static func parse(_ text: String) -> Date? {
        if let date = try? Date(text, strategy: .iso8601.year().month().day().dateSeparator(.dash)
            .time(includingFractionalSeconds: true).timeSeparator(.colon).timeZone(separator: .omitted)) { return date }
        return try? Date(text, strategy: .iso8601)
    }

    /// Whether `parse` accepts `text`. The shape `rfc3339` writes, with every field in range, is checked by hand
    /// (`PushJob.validate` checks the `createdAt` of every job built); anything else is left to `parse`.
    public static func isValid(_ text: String) -> Bool {
        isCanonical(text) || parse(text) != nil
    }

    /// `YYYY-MM-DDTHH:MM:SS.sssZ` naming a real day of years 1970–9999 and a time before 24:00.
    static func isCanonical(_ text: String) -> Bool {
        let bytes = text.utf8
        guard bytes.count == 24 else { return false }
        var digits: [Int] = []
        digits.reserveCapacity(17)
        for (index, byte) in bytes.enumerated() {
            switch index {
            case 4, 7: guard byte == UInt8(ascii: "-") else { return false }
            case 10: guard byte == UInt8(ascii: "T") else { return false }
            case 13, 16: guard byte == UInt8(ascii: ":") else { return false }
            case 19: guard byte == UInt8(ascii: ".") else { return false }
            case 23: guard byte == UInt8(ascii: "Z") else { return false }
            default:
                guard byte >= UInt8(ascii: "0"), byte <= UInt8(ascii: "9") else { return false }
                digits.append(Int(byte - UInt8(ascii: "0")))
            }
        }
        func number(_ range: Range<Int>) -> Int { digits[range].reduce(0) { $0 * 10 + $1 } }
        let (year, month, day) = (number(0..<4), number(4..<6), number(6..<8))
        let (hour, minute, second) = (number(8..<10), number(10..<12), number(12..<14))
        guard year >= 1970, (1...12).contains(month), hour < 24, minute < 60, second < 60 else { return false }
        let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
        let monthDays = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        return (1...monthDays[month - 1]).contains(day)
    }

    /// Gregorian year, month and day of a count (≥ 0) of days since 1970-01-01 (H. Hinnant's `civil_from_days`).
    private static func civil(fromDays days: Int64) -> (year: Int, month: Int, day: Int) {
        let shifted = days + 719_468
        let era = shifted / 146_097
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        return (Int(yearOfEra + era * 400 + (month <= 2 ? 1 : 0)), Int(month), Int(day))
    }
}
