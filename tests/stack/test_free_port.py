"""free_port() hands out ports that outgoing connections cannot take before the service binds."""

from __future__ import annotations

import socket

from services.stack.supervisor import PORTS_FROM, ephemeral_start, free_port


def test_free_ports_come_from_below_the_ephemeral_range_distinct_and_bindable() -> None:
    # A clean-clone CI run lost a test stack's ingest to EADDRINUSE: free_port had returned a
    # port of the ephemeral range, and an outgoing connection took it before ingest bound it.
    low_end = ephemeral_start()
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(PORTS_FROM <= port < low_end for port in ports), [p for p in ports if not PORTS_FROM <= p < low_end]
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))
