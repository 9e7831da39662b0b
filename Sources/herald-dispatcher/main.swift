import HeraldRuntime

let usage = """
    herald-dispatcher — Consumes herald.jobs, resolves targets in Redis, sends to APNs, dead-letters failures.

    Usage: herald-dispatcher [--help]

    Configuration is read from HERALD_* environment variables; see README.md.
    """

if CommandLineTool.helpRequested() { CommandLineTool.exitWithUsage(usage) }
CommandLineTool.exitWithConfigurationError("herald-dispatcher", ConfigurationError("herald-dispatcher", "not built yet; see the open issues"))
