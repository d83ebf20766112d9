"""Local paths that every node of a cluster must see, checked before a run starts.

A driver names its local inputs and outputs (``--data``, ``--output``, a checkpoint) as this
machine sees them, but Ray runs the workers and actors that read and write them on any node. On
a cluster whose nodes do not share that disk, the first write on another node fails, after
minutes or hours: Ray Train's "Unable to set up cluster storage" at the first checkpoint. So a
driver that joined a cluster asks every other node that may host a worker what it sees at each
local path, with one zero-CPU task pinned to that node, and refuses the run in one line when a
node sees nothing there, or something else. URIs (``s3://...``) are every node's by
construction and are not checked; nor is a local instance this driver started (one node, this
machine's disks).

What a node "sees" is compared by a fingerprint: a file's size and the hash of its first bytes;
a folder's top-level names, kinds and sizes (a run folder holds the driver's lock file, whose
content is this driver's own). Nodes that join later (an autoscaler's) cannot be asked now.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from raydiff.errors import UserInputError
from raydiff.orchestrate.node_probe import ask_each_node
from raydiff.storage import StoragePath, local_path

_HASHED_BYTES = 1 << 16


def fingerprint(path: str) -> str | None:
    """What is at ``path`` on this machine, as a comparable text; None when nothing is."""
    target = Path(path)
    try:
        if target.is_file():
            with target.open("rb") as file:
                head = hashlib.sha256(file.read(_HASHED_BYTES)).hexdigest()
            return f"file {target.stat().st_size} {head}"
        if target.is_dir():
            entries = sorted(
                (e.name, e.is_dir(), e.stat().st_size if e.is_file() else 0)
                for e in os.scandir(target)
            )
            return f"folder {entries}"
    except OSError as error:  # unreadable here: not what the driver sees
        return f"unreadable ({error.strerror or error})"
    return None


def refuse_paths_nodes_cannot_see(paths: Mapping[str, str | StoragePath | None]) -> None:
    """Raise :class:`UserInputError` naming the first ``{flag: path}`` that a node which may host
    a worker (one with CPUs or GPUs) sees differently from this driver. Call it once connected
    to the run's cluster, before anything starts there."""
    local = {
        flag: str(path.resolve())
        for flag, value in paths.items()
        if value is not None and (path := local_path(value)) is not None
    }
    if not local:
        return
    import ray

    here = ray.get_runtime_context().get_node_id()
    nodes = [
        node
        for node in ray.nodes()
        if node["Alive"]
        and node["NodeID"] != here
        and (node["Resources"].get("CPU", 0) > 0 or node["Resources"].get("GPU", 0) > 0)
    ]
    if not nodes:
        return
    expected = {flag: fingerprint(path) for flag, path in local.items()}
    question = f"whether it sees {', '.join(local.values())}"
    for address, seen in ask_each_node(
        _fingerprints, list(local.values()), nodes=nodes, question=question
    ):
        for (flag, path), there in zip(local.items(), seen, strict=True):
            if there != expected[flag]:
                what = "nothing there" if there is None else "other files there"
                raise UserInputError(
                    f"{flag} {path} is a local path that node {address} of the cluster, which "
                    f"may run this job's workers, cannot see ({what}): give a URI "
                    "(s3://bucket/...) or a folder mounted at the same path on every node"
                )


def _fingerprints(paths: list[str]) -> list[str | None]:
    """:func:`fingerprint` of each path, on the node this task runs on."""
    return [fingerprint(path) for path in paths]
