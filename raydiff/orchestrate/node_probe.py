"""Ask every node of a cluster the same question: one zero-CPU task pinned to each node.

Used by the checks that refuse a run before it starts (node_paths: what a node sees at the
driver's local paths; node_network: which address gloo binds there). A slow node is not proof
of a problem: one that does not answer in time is logged and skipped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)

#: How long the nodes may take to answer, all together (a new worker process on a busy node).
ANSWER_TIMEOUT_S = 120.0


def ask_each_node(
    function: Callable[..., Any], *args: Any, nodes: list[dict[str, Any]], question: str
) -> Iterator[tuple[str, Any]]:
    """``(address, function(*args) on that node)`` for each of ``nodes`` (``ray.nodes()``
    entries), in their order; ``question`` names what was asked in the warning for a node that
    did not answer within :data:`ANSWER_TIMEOUT_S`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0)(function)
    # A list, not a dict by address: several nodes may share one machine's address.
    answers = [
        (
            node["NodeManagerAddress"],
            probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            ).remote(*args),
        )
        for node in nodes
    ]
    deadline = time.monotonic() + ANSWER_TIMEOUT_S  # for all the nodes together
    for address, answer in answers:
        try:
            yield address, ray.get(answer, timeout=max(0.0, deadline - time.monotonic()))
        except ray.exceptions.GetTimeoutError:
            logger.warning(
                "node %s did not say within %.0f s %s; going on",
                address,
                ANSWER_TIMEOUT_S,
                question,
            )
