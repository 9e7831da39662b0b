import Foundation
import HeraldRuntime

/// Reloads the apps file on every SIGHUP; a bad file is refused with a log line and the old one kept.
public struct AppsReloader: Service {
    let apps: AppRegistry
    let path: String
    let logger: Logger

    public init(apps: AppRegistry, path: String, logger: Logger) {
        self.apps = apps
        self.path = path
        self.logger = logger
    }

    /// Runs until cancelled.
    public func run() async {
        let signals = SignalWaiter(signals: [SIGHUP])
        await withTaskCancellationHandler {
            while await signals.next() != nil {
                do {
                    try apps.reload(path: path)
                    logger.info("apps file reloaded", ["apps": "\(apps.directory.apps.count)"])
                } catch {
                    logger.error("apps file refused; keeping the previous one", ["error": "\(error)"])
                }
            }
        } onCancel: {
            signals.cancel()
        }
    }
}
