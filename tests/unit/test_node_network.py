"""raydiff/orchestrate/node_network.py: which node's CPU workers other nodes could not reach
(its host name resolves to a loopback address and GLOO_SOCKET_IFNAME is not set). The probe on
real nodes runs in the cluster tier (tests/cluster), whose nodes set the variable."""

from __future__ import annotations

import socket

from raydiff.orchestrate.node_network import gloo_address, unreachable_reason


def test_a_host_name_on_loopback_without_an_interface_is_named_with_the_fix() -> None:
    reason = unreachable_reason("10.0.0.7", ("worker-7", "127.0.1.1", False))
    assert reason is not None
    assert reason.startswith(
        "node 10.0.0.7 of the cluster resolves its host name 'worker-7' to 127.0.1.1, a loopback "
        "address, and GLOO_SOCKET_IFNAME is not set there"
    )
    assert "Set GLOO_SOCKET_IFNAME to the interface of its cluster address" in reason


def test_an_interface_named_a_routable_address_or_no_answer_passes() -> None:
    assert unreachable_reason("10.0.0.7", ("worker-7", "127.0.1.1", True)) is None
    assert unreachable_reason("10.0.0.7", ("worker-7", "10.0.0.7", False)) is None
    assert unreachable_reason("10.0.0.7", ("worker-7", "::1", True)) is None
    assert unreachable_reason("10.0.0.7", ("worker-7", "", False)) is None  # gloo says so itself


def test_the_probe_reads_this_machine(monkeypatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    name, address, interface_set = gloo_address()
    assert name == socket.gethostname() and not interface_set
    assert address in ("", socket.gethostbyname(name))
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    assert gloo_address()[2] is True
