import HeraldRuntime

let usage = """
    herald-ingest — HTTP API: device subscriptions, Live Activity registration, event intake → Kafka.

    Usage: herald-ingest [--help]

    Configuration is read from HERALD_* environment variables; see README.md.
    """

if CommandLineTool.helpRequested() { CommandLineTool.exitWithUsage(usage) }
CommandLineTool.exitWithConfigurationError("herald-ingest", ConfigurationError("herald-ingest", "not built yet; see the open issues"))
