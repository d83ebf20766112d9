"""One cluster of Ray nodes that share no disk, and a real S3 server, for the cluster tier
(tests/cluster/netns_cluster.py): a head with 1 CPU (the driver, Ray Train's controller, Ray
Data's tasks) and two worker nodes with 2 CPUs each, where the training workers run. The tiny
dataset is prepared on this machine and uploaded to the bucket: a node sees nothing of another's
disk, so a run's inputs and outputs live in the bucket, as on a real cluster.

It needs root (namespaces and mounts); without it the tier is skipped (under CI, an error).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from netns_cluster import NetnsCluster
from tiny_dataset import TinyDataset, make_tiny_dataset

REPO = Path(__file__).resolve().parents[2]
CLUSTER_CPUS = (1, 2, 2)


@pytest.fixture(scope="session")
def netns_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetnsCluster]:
    missing = [tool for tool in ("ip", "unshare", "nsenter") if shutil.which(tool) is None]
    if os.geteuid() != 0 or missing:
        pytest.skip(f"the cluster tier needs root and ip, unshare, nsenter (missing: {missing})")
    # A short root: a node's Ray sockets live under its private folder, and a socket's path
    # may not exceed 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="rdc-", dir="/tmp"))
    cluster = NetnsCluster(root=root, repo=REPO)
    try:
        cluster.start(cpus=CLUSTER_CPUS)
        yield cluster
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_data(
    netns_cluster: NetnsCluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[TinyDataset, str]:
    """tests/tiny_dataset.py's dataset, and its URI in the cluster's bucket."""
    tiny = make_tiny_dataset(tmp_path_factory.mktemp("tiny"))
    return tiny, netns_cluster.upload_folder(tiny.path, "data/tiny")
