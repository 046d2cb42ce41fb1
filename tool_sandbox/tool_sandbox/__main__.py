"""`python -m tool_sandbox serve --host H --port P [--config tools.yaml]`; `python -m tool_sandbox
tool-types [--write api/toolrl_api/tool_types.json]`: the registered tool types as JSON, or the API
package's copy of them (toolrl_api/tool_types.json)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys

from tool_sandbox.config import ConfigError, ServerSettings, default_tools
from tool_sandbox.tools import load_tools


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command and its arguments; `serve`'s are checked here (serve_settings reads them)."""
    defaults = ServerSettings()
    parser = argparse.ArgumentParser(prog="tool_sandbox", description="Sandboxed tool server for RL rollouts")
    sub = parser.add_subparsers(dest="command", required=True)
    types = sub.add_parser(
        "tool-types", help="the registered tool types (description, input schema, capabilities) as JSON"
    )
    types.add_argument(
        "--write",
        metavar="PATH",
        help="write the API package's copy (api/toolrl_api/tool_types.json) to PATH instead",
    )
    serve = sub.add_parser("serve", help="run the HTTP tool server")
    serve.add_argument("--host", default=defaults.host)
    serve.add_argument("--port", type=int, default=defaults.port, help="the tool API, /healthz and /readyz")
    serve.add_argument(
        "--metrics-port", type=int, default=defaults.metrics_port, help="/metrics (and nothing else)"
    )
    serve.add_argument(
        "--config", help='tools.yaml ({"tools": [...]}, the job\'s spec.tools); default: one python tool'
    )
    serve.add_argument("--workers", type=int, default=defaults.workers, help="warm worker processes")
    serve.add_argument("--capacity", type=int, default=defaults.capacity, help="calls executing at once")
    serve.add_argument("--queue-size", type=int, default=defaults.queue_size, help="calls waiting before 429")
    serve.add_argument("--max-sessions", type=int, default=defaults.max_sessions)
    serve.add_argument("--session-idle-seconds", type=float, default=defaults.session_idle_seconds)
    serve.add_argument("--spares-per-worker", type=int, default=defaults.spares_per_worker)
    serve.add_argument("--workdir", default=defaults.workdir, help="where per-call directories are made")
    serve.add_argument(
        "--max-timeout-seconds",
        type=float,
        default=defaults.max_timeout_seconds,
        help="the most a /run_code request's run_timeout may ask for",
    )
    serve.add_argument(
        "--max-memory-mib",
        type=int,
        default=defaults.max_memory_mib,
        help="the most a /run_code request's memory_limit_MB may ask for (and what it gets when silent)",
    )
    serve.add_argument(
        "--max-output-bytes",
        type=int,
        default=defaults.max_output_bytes,
        help="/run_code output kept per stream",
    )
    serve.add_argument("--max-body-bytes", type=int, default=defaults.max_body_bytes)
    serve.add_argument(
        "--max-tasks",
        type=int,
        default=defaults.max_tasks,
        help="processes and threads all sandboxed code may run at once (the pod's pids budget)",
    )
    serve.add_argument("--max-connections", type=int, default=defaults.max_connections)
    serve.add_argument(
        "--ws-heartbeat-seconds",
        type=float,
        default=defaults.ws_heartbeat_seconds,
        help="OpenEnv WebSockets: ping interval; a client silent for half of it is closed",
    )
    serve.add_argument(
        "--header-timeout-seconds",
        type=float,
        default=defaults.header_timeout_seconds,
        help="a connection must send a request's headers within this",
    )
    serve.add_argument(
        "--drain-seconds",
        type=float,
        default=defaults.drain_seconds,
        help="on SIGTERM, how long calls in flight may still run (then they fail as the pool's fault)",
    )
    serve.add_argument("--no-landlock", action="store_true", help="do not use Landlock even if available")
    serve.add_argument(
        "--allow-no-landlock",
        action="store_true",
        help="become ready even without Landlock (children then rely on seccomp, uids and the pod)",
    )
    args = parser.parse_args(argv)
    if args.command != "serve":
        return args
    for name in (
        "workers",
        "capacity",
        "queue_size",
        "max_sessions",
        "max_timeout_seconds",
        "max_memory_mib",
        "max_output_bytes",
        "max_body_bytes",
        "max_tasks",
        "max_connections",
        "header_timeout_seconds",
        "ws_heartbeat_seconds",
    ):
        if not getattr(args, name) >= 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.metrics_port == args.port:
        parser.error(f"--metrics-port must differ from --port ({args.port}): /metrics has a port of its own")
    return args


def serve_settings(args: argparse.Namespace) -> tuple[ServerSettings, str | None]:
    """`serve`'s settings and the config's path."""
    settings = dataclasses.replace(
        ServerSettings(),
        host=args.host,
        port=args.port,
        metrics_port=args.metrics_port,
        workers=args.workers,
        capacity=args.capacity,
        queue_size=args.queue_size,
        max_sessions=args.max_sessions,
        session_idle_seconds=args.session_idle_seconds,
        spares_per_worker=args.spares_per_worker,
        workdir=args.workdir,
        max_timeout_seconds=args.max_timeout_seconds,
        max_memory_mib=args.max_memory_mib,
        max_output_bytes=args.max_output_bytes,
        max_body_bytes=args.max_body_bytes,
        max_tasks=args.max_tasks,
        max_connections=args.max_connections,
        ws_heartbeat_seconds=args.ws_heartbeat_seconds,
        header_timeout_seconds=args.header_timeout_seconds,
        drain_seconds=args.drain_seconds,
        landlock=not args.no_landlock,
        allow_no_landlock=args.allow_no_landlock,
    )
    return settings, args.config


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "tool-types":
        from tool_sandbox import tool_types

        sys.exit(tool_types.main(args.write))
    settings, config_path = serve_settings(args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        tools = load_tools(config_path) if config_path else default_tools()
    except ConfigError as exc:
        sys.exit(f"tool_sandbox: {exc}")
    from tool_sandbox.api.app import serve

    try:
        asyncio.run(serve(settings, tools))
    except ConfigError as exc:
        sys.exit(f"tool_sandbox: {exc}")


if __name__ == "__main__":
    main()
