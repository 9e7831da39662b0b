import HeraldRuntime

/// The current apps file, swappable at run time (`SIGHUP`): readers always see one whole, checked version.
public final class AppRegistry: Sendable {
    private let current: Lock<AppDirectory>
    private let reader: AppDirectory.Reader

    public init(_ directory: AppDirectory, reader: AppDirectory.Reader = .dispatcher) {
        current = Lock(directory)
        self.reader = reader
    }

    /// Loads the apps file a service is configured with; a bad file is a `HERALD_APPS_FILE` configuration error.
    public convenience init(loading path: String, for reader: AppDirectory.Reader) throws {
        do { self.init(try AppDirectory.load(path: path, for: reader), reader: reader) } catch {
            throw ConfigurationError("HERALD_APPS_FILE", "\(error)")
        }
    }

    public var directory: AppDirectory { current.withLock { $0 } }

    /// Loads `path` and swaps it in; on any error the old directory stays and the error is thrown.
    public func reload(path: String) throws {
        let fresh = try AppDirectory.load(path: path, for: reader)
        current.withLock { $0 = fresh }
    }
}
