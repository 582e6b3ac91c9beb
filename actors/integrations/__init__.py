"""Where fractor meets other systems: the home of the integrations to come.

Each integration is a module (or a folder) of its own here: MCP (tools served by MCP
servers, as ``Tool``\\ s), OpenTelemetry (the runtime's events and traces as spans) and
the Ray agent host (agents run on a Ray cluster behind the same ``AgentRef``).

The dependency rule they follow (``tests/test_layers.py`` checks it): an integration
imports the agent core (the modules of ``actors`` itself), ``fractor.actors.providers`` and
the public surface of the kernel (``runtime``, ``runtime.lowlevel``); never the
command line (``actors.cli`` may use an integration, not the reverse), never another
package's private modules, never ``benchmarks``. Nothing below imports an
integration: neither the core, the providers nor the kernel. An integration's
optional dependency (``mcp``, ``opentelemetry``, ``ray``) is imported by that
integration alone.
"""
