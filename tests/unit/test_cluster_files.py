"""The cluster-launcher files pass Ray's own config validation, offline.

``ray up`` runs ``prepare_config`` (Ray's defaults for the provider, setup commands merged, node
types' worker bounds filled in) and then ``validate_config`` (the JSON schema shipped with Ray,
plus its cross-field checks) before it contacts any cloud. Both are called here on the two files,
so a key Ray does not know, or a value of the wrong type, fails this test instead of a ``ray up``.
Nothing here starts Ray or needs network or credentials.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import tomllib
import yaml

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CLUSTER_FILES = ["cluster.yaml", "cluster.local.yaml"]


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / name).read_text())


def validated(raw: dict[str, Any]) -> dict[str, Any]:
    """What `ray up` checks before it launches anything: Ray's defaults merged in, then Ray's
    schema and cross-field validation (it raises on any problem)."""
    # Imported here, not at the top, so that collecting the unit tier does not load Ray.
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(copy.deepcopy(raw))
    validate_config(config)
    return config


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_ray_validates_the_cluster_file(name: str) -> None:
    config = validated(load(name))
    assert config["cluster_name"] == "raydiff"
    assert config["head_node_type"] in config["available_node_types"]


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_ray_rejects_a_broken_copy(name: str) -> None:
    # The same file with a misspelt top-level key: the schema allows no unknown keys.
    broken = load(name) | {"dashbord_host": "127.0.0.1"}
    with pytest.raises(jsonschema.ValidationError, match="dashbord_host"):
        validated(broken)


def test_ray_rejects_a_fractional_resource_in_a_node_type() -> None:
    broken = load("cluster.yaml")
    broken["available_node_types"]["head"]["resources"] = {"CPU": 0.5}
    with pytest.raises(jsonschema.ValidationError, match="integer"):
        validated(broken)


def test_aws_node_types() -> None:
    raw = load("cluster.yaml")
    assert raw["provider"]["type"] == "aws"
    config = validated(raw)
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    # The head schedules nothing: no training worker, Ray Data task or trial lands on it.
    assert head["resources"] == {"CPU": 0}
    assert head["max_workers"] == 0
    gpu = types["gpu"]
    assert gpu["min_workers"] == 0 < gpu["max_workers"] <= config["max_workers"]
    assert re.match(r"(g|p)\d", gpu["node_config"]["InstanceType"]), "a GPU instance type"
    assert types["cpu"]["min_workers"] == 0


def test_aws_docker_image_matches_the_pinned_ray() -> None:
    image = load("cluster.yaml")["docker"]["image"]
    pinned = re.search(r"^ray==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M)
    assert pinned, "constraints.txt pins ray"
    assert f":{pinned.group(1)}-" in image, f"{image} is not Ray {pinned.group(1)}"


def test_local_provider_has_head_and_worker_addresses() -> None:
    provider = load("cluster.local.yaml")["provider"]
    assert provider["type"] == "local"
    assert isinstance(provider["head_ip"], str) and provider["head_ip"]
    assert isinstance(provider["worker_ips"], list)
    config = validated(load("cluster.local.yaml"))
    node_type = config["available_node_types"][config["head_node_type"]]
    assert node_type["max_workers"] == len(provider["worker_ips"])


@pytest.mark.parametrize("name", CLUSTER_FILES)
def test_the_repository_is_synced_and_installed_with_the_pinned_versions(name: str) -> None:
    config = validated(load(name))
    assert config["file_mounts"] == {"~/raydiff": "."}
    assert ".gitignore" in config["rsync_filter"]  # no .venv, data/ or runs/ shipped
    # prepare_config merged setup_commands into both roles: check what each node runs.
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for role in ("head_setup_commands", "worker_setup_commands"):
        commands = config[role]
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
    config = validated(load(name))
    head_start = " ".join(config["head_start_ray_commands"])
    assert "ray start --head" in head_start
    assert re.search(r"--dashboard-host[= ]127\.0\.0\.1\b", head_start)
    assert "0.0.0.0" not in head_start
    for role in ("head_start_ray_commands", "worker_start_ray_commands"):
        assert re.search(r"--metrics-export-port[= ]\d+", " ".join(config[role])), role
