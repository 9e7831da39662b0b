import HeraldRuntime

let usage = """
    herald-apns-sim — A strict local APNs stand-in (HTTP/2 over TLS) for tests, benchmarks and the local stack.

    Usage: herald-apns-sim [--help]

    Configuration is read from HERALD_* environment variables; see README.md.
    """

if CommandLineTool.helpRequested() { CommandLineTool.exitWithUsage(usage) }
CommandLineTool.exitWithConfigurationError("herald-apns-sim", ConfigurationError("herald-apns-sim", "not built yet; see the open issues"))
