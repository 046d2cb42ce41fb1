"""Listening ports for the local cluster's components come from outside the kernel's ephemeral range, so
an outgoing connection cannot take one between its choice and the component's bind."""

from __future__ import annotations

import socket
from pathlib import Path

from harness.localcluster.cluster import LISTEN_PORTS, free_port


def test_ports_are_free_and_below_the_ephemeral_range() -> None:
    low, _ = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert LISTEN_PORTS[1] < low, (LISTEN_PORTS, low)
    for _ in range(20):
        port = free_port()
        assert LISTEN_PORTS[0] <= port <= LISTEN_PORTS[1]
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free to listen on
