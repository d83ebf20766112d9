"""Nodes whose CPU workers other nodes could not reach, refused before a run starts.

CPU workers form their process group with gloo, which binds the address its node's host name
resolves to unless ``GLOO_SOCKET_IFNAME`` names an interface. Where the host name resolves to a
loopback address (a common ``/etc/hosts`` entry in containers and on fresh VMs: ``127.0.1.1
name``), that node's workers announce 127.x to the others, and a run spanning nodes fails at its
start with "Gloo connectFullMesh failed ... remote=[127.0.0.1]" and a traceback per worker. A
driver joined to a cluster of several nodes that may host workers asks each (one pinned zero-CPU
task per node) what its host name resolves to and whether the variable is set, and refuses the
run in one line naming the node and the fix. GPU runs (NCCL) are not concerned; nor is one
machine (its Ray nodes share one address), where loopback reaches every worker.
"""

from __future__ import annotations

import ipaddress
import os
import socket

from raydiff.errors import UserInputError
from raydiff.orchestrate.node_probe import ask_each_node

GLOO_INTERFACE_VARIABLE = "GLOO_SOCKET_IFNAME"


def gloo_address() -> tuple[str, str, bool]:
    """On this node: its host name, what that resolves to ('' if nothing), and whether
    ``GLOO_SOCKET_IFNAME`` is set (then gloo binds that interface instead)."""
    name = socket.gethostname()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        address = ""
    return name, address, bool(os.environ.get(GLOO_INTERFACE_VARIABLE))


def unreachable_reason(node: str, answer: tuple[str, str, bool]) -> str | None:
    """Why CPU workers on ``node`` could not be reached by other nodes' (None: they can)."""
    name, address, interface_set = answer
    if interface_set or not address or not ipaddress.ip_address(address).is_loopback:
        return None
    return (
        f"node {node} of the cluster resolves its host name {name!r} to {address}, a loopback "
        f"address, and {GLOO_INTERFACE_VARIABLE} is not set there: CPU workers (gloo) on other "
        f"nodes could not connect to its workers. Set {GLOO_INTERFACE_VARIABLE} to the "
        "interface of its cluster address (e.g. eth0) in the environment of `ray start` on "
        "every node, or map the host name to that address in /etc/hosts"
    )


def refuse_unreachable_gloo_nodes(*, use_gpu: bool, num_workers: int) -> None:
    """Raise :class:`UserInputError` for the first node that may host a CPU worker whose
    workers other nodes could not reach (see the module docstring), for a run of up to
    ``num_workers`` workers. Call it once connected to the run's cluster, before anything
    starts there."""
    if use_gpu or num_workers < 2:  # NCCL; or no process group peers to reach
        return
    import ray

    nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
    if len({n["NodeManagerAddress"] for n in nodes}) < 2:
        return  # one machine (several Ray nodes of one included): loopback reaches every worker
    question = "which address gloo binds there"
    for address, seen in ask_each_node(gloo_address, nodes=nodes, question=question):
        reason = unreachable_reason(address, tuple(seen))
        if reason is not None:
            raise UserInputError(reason)
