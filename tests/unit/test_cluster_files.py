"""The cluster-launcher files agree with the rest of the repository.

What Ray itself checks (``ray up`` validates the files against its schema before it contacts any
cloud) is not repeated here; these tests guard what Ray cannot know: the files install the
versions pinned in constraints.txt and an extra pyproject.toml declares, the AWS image is the
pinned Ray, and the dashboard (which runs whatever job it is sent) is never opened to the network.
Nothing here starts Ray or needs network or credentials.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_FILES = ["cluster.yaml", "cluster.local.yaml"]


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / name).read_text())


def test_aws_docker_image_matches_the_pinned_ray() -> None:
    image = load("cluster.yaml")["docker"]["image"]
    pinned = re.search(r"^ray==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pinned, "constraints.txt pins ray"
    assert f":{pinned.group(1)}-" in image, f"{image} is not Ray {pinned.group(1)}"


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_every_node_installs_the_pinned_versions_and_a_declared_extra(name: str) -> None:
    config = load(name)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    # Ray runs setup_commands on every node, then the role's own: check what each node runs.
    for role in ("head_setup_commands", "worker_setup_commands"):
        commands = config.get("setup_commands", []) + config.get(role, [])
        installs = [c for c in commands if "pip install" in c and "-e " in c]
        assert len(installs) == 1, f"{role} installs raydiff once: {commands}"
        assert "cd ~/raydiff" in installs[0]
        assert "-c constraints.txt" in installs[0]
        extra = re.search(r"-e '\.\[(\w+)\]'", installs[0])
        assert extra and extra.group(1) in extras, f"an extra of pyproject.toml: {installs[0]}"
        assert any("-c constraints.txt torch" in c for c in commands)
        assert any("apt-get install -y dataset-fashion-mnist" in c for c in commands)


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_the_dashboard_listens_on_localhost_only(name: str) -> None:
    config = load(name)
    head_start = " ".join(config["head_start_ray_commands"])
    assert "ray start --head" in head_start
    assert re.search(r"--dashboard-host[= ]127\.0\.0\.1\b", head_start)
    assert "0.0.0.0" not in head_start


def test_the_commented_spot_worker_type_is_a_gpu_type_on_spot_once_uncommented() -> None:
    text = (ROOT / "cluster.yaml").read_text()
    lines = text.splitlines()
    start = lines.index("  # gpu_spot:")
    block = []
    for line in lines[start:]:
        if not line.startswith("  #"):
            break
        block.append("  " + line.removeprefix("  # "))
    uncommented = "\n".join([*lines[:start], *block, *lines[start + len(block) :]])
    types = yaml.safe_load(uncommented)["available_node_types"]
    spot, on_demand = types["gpu_spot"], types["gpu"]
    assert spot["node_config"]["InstanceMarketOptions"] == {"MarketType": "spot"}
    assert spot["node_config"]["InstanceType"] == on_demand["node_config"]["InstanceType"]
    assert set(spot) == set(on_demand) and spot["min_workers"] == 0
