import HeraldRuntime

let usage = """
    heraldctl — Operator CLI: keys, topics, dead-letter inspection, replay, test sends.

    Usage: heraldctl [--help]

    Configuration is read from HERALD_* environment variables; see README.md.
    """

if CommandLineTool.helpRequested() { CommandLineTool.exitWithUsage(usage) }
CommandLineTool.exitWithConfigurationError("heraldctl", ConfigurationError("heraldctl", "not built yet; see the open issues"))
