"""`python -m toolrl_operator`: run the operator (kopf) with liveness and metrics endpoints."""

from __future__ import annotations

import argparse
import logging

import kopf
from prometheus_client import start_http_server

from . import handlers  # noqa: F401  (importing registers the kopf handlers)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="toolrl_operator", description=__doc__)
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable, or comma-separated); default: all namespaces",
    )
    parser.add_argument("--liveness-port", type=int, default=8080, help="serves /healthz (default 8080)")
    parser.add_argument("--metrics-port", type=int, default=8000, help="serves /metrics (default 8000)")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    return parser.parse_args(argv)


def namespaces(values: list[str]) -> list[str]:
    """`--namespace a,b --namespace c` -> ['a', 'b', 'c']."""
    return [ns.strip() for value in values for ns in value.split(",") if ns.strip()]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:  # kopf logs every handler run at INFO: one line per watch event
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    watched = namespaces(args.namespace)
    start_http_server(args.metrics_port)
    kopf.run(
        standalone=True,
        clusterwide=not watched,
        namespaces=watched,
        liveness_endpoint=f"http://0.0.0.0:{args.liveness_port}/healthz",
    )


if __name__ == "__main__":
    main()
