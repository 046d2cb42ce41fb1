"""The operator's command line: the namespaces it watches, its ports."""

from __future__ import annotations

from toolrl_operator.__main__ import namespaces, parse_args


def test_namespaces_from_repeated_and_comma_separated_flags() -> None:
    args = parse_args(["--namespace", "a,b", "--namespace", " c ", "--metrics-port", "9000"])
    assert namespaces(args.namespace) == ["a", "b", "c"]
    assert (args.metrics_port, args.liveness_port) == (9000, 8080)
    assert namespaces(parse_args([]).namespace) == []
