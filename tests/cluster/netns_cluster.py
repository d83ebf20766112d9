"""A Ray cluster whose nodes share no disk, and a real S3 server, on one Linux machine (root).

Namespaces (names start with this process's own prefix, so nothing else is touched):
- ``<prefix>br``: a bridge ``br0`` (10.213.0.1/24) and the S3 server (SeaweedFS ``weed mini``)
  listening on 10.213.0.1 only, never on the machine's own interfaces.
- ``<prefix>n<i>``: one per Ray node, a veth pair to the bridge (10.213.0.(10+i)), loopback up.
  The node runs in a mount namespace of its own (``unshare --mount``) with a tmpfs on its
  private folder: its Ray temp dir and anything it writes there are its alone. Only the
  virtualenv and the checkout are shared, as on a cluster built from one image.

Every process here is ended by pid (``ip netns pids``), every namespace deleted, in ``close()``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.213.0"
BRIDGE_IP = f"{SUBNET}.1"
RAY_PORT = 6379
S3_PORT = 8333
ACCESS_KEY = "raydiffclusterkey"
SECRET_KEY = "raydiffclustersecret"
REGION = "us-east-1"
START_TIMEOUT_S = 120
COMMAND_TIMEOUT_S = 300


def sh(*argv: str, check: bool = True, timeout: float = 30) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


@dataclass
class Node:
    name: str  # its network namespace
    ip: str
    private: Path  # its tmpfs, seen only inside its mount namespace
    process: subprocess.Popen | None = None


@dataclass
class NetnsCluster:
    """See the module docstring. ``start()`` then ``close()`` (in a ``finally``)."""

    root: Path  # host folder for the mount points and the S3 server's data and logs
    repo: Path
    bucket: str = "raydiff"
    prefix: str = field(default_factory=lambda: f"rdc{os.getpid() % 100000}")
    nodes: list[Node] = field(default_factory=list)
    server: subprocess.Popen | None = None

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def endpoint(self) -> str:
        return f"http://{BRIDGE_IP}:{S3_PORT}"

    def s3_env(self, *, secret: str = SECRET_KEY) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
        }

    def node_env(self) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        return {
            "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/srv/node",
            "PYTHONPATH": str(self.repo),
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "LANG": "C.UTF-8",
            **self.s3_env(),
        }

    # --- network -----------------------------------------------------------------------------
    def start_bridge(self) -> None:
        sh("ip", "netns", "add", self.bridge)
        sh("ip", "-n", self.bridge, "link", "set", "lo", "up")
        sh("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.bridge, "addr", "add", f"{BRIDGE_IP}/24", "dev", "br0")
        sh("ip", "-n", self.bridge, "link", "set", "br0", "up")

    def add_netns(self, index: int) -> Node:
        name = f"{self.prefix}n{index}"
        ip = f"{SUBNET}.{10 + index}"
        sh("ip", "netns", "add", name)
        # Both ends are made inside the namespaces: no interface ever appears on the host.
        sh(
            "ip",
            "-n",
            name,
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            f"v{index}",
            "netns",
            self.bridge,
        )
        sh("ip", "-n", self.bridge, "link", "set", f"v{index}", "master", "br0", "up")
        sh("ip", "-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", name, "link", "set", "eth0", "up")
        sh("ip", "-n", name, "link", "set", "lo", "up")
        private = self.root / name
        private.mkdir(parents=True, exist_ok=True)
        return Node(name=name, ip=ip, private=private)

    # --- S3 ----------------------------------------------------------------------------------
    def start_s3(self) -> None:
        data = self.root / "s3"
        data.mkdir(exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(
            json.dumps(
                {
                    "identities": [
                        {
                            "name": "raydiff",
                            "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                        }
                    ]
                }
            )
        )
        log = (self.root / "s3.log").open("w")
        weed = str(Path(sys.executable).parent / "weed")
        self.server = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                self.bridge,
                weed,
                "mini",
                f"-dir={data}",
                f"-ip={BRIDGE_IP}",
                f"-ip.bind={BRIDGE_IP}",
                "-master.telemetry=false",
                f"-s3.config={config}",
                f"-s3.port={S3_PORT}",
                "-admin.ui=false",
                "-webdav=false",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=data,
        )
        self._wait_for(self._s3_ready, "the S3 server", self.root / "s3.log")
        done = self.s3(f"s3.create_bucket(Bucket={self.bucket!r})")
        if done.returncode:
            raise RuntimeError(f"cannot create the bucket: {done.stderr[-2000:]}")

    def s3(
        self, code: str, *, secret: str = SECRET_KEY, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """Python ``code`` with a boto3 client ``s3`` of the server, run in the bridge's
        namespace: the host has no route to 10.213.0.1 (and may have a proxy), by design."""
        prelude = (
            "import boto3\nfrom botocore.config import Config\n"
            f"s3 = boto3.client('s3', endpoint_url={self.endpoint!r}, "
            f"aws_access_key_id={ACCESS_KEY!r}, aws_secret_access_key={secret!r}, "
            f"region_name={REGION!r}, config=Config(retries={{'max_attempts': 1}}))\n"
        )
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(self.repo)}
        return subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                self.bridge,
                "env",
                "-i",
                *(f"{k}={v}" for k, v in env.items()),
                sys.executable,
                "-c",
                prelude + code,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def _s3_ready(self) -> bool:
        done = self.run_in(
            self.bridge,
            ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", f"{self.endpoint}/"],
            timeout=10,
            mount=False,
        )
        return done.stdout.strip() not in ("", "000")

    # --- Ray nodes ---------------------------------------------------------------------------
    def start_node(self, index: int, *, num_cpus: int) -> Node:
        node = self.add_netns(index)
        if index == 0:
            ray = f"ray start --head --port={RAY_PORT} --include-dashboard=true --dashboard-host=0.0.0.0"
        else:
            ray = f"ray start --address={self.head.ip}:{RAY_PORT}"
        script = (
            f"mount -t tmpfs -o size=2g tmpfs {node.private} && mkdir -p {node.private}/ray && "
            f"cd {node.private} && exec {ray} --node-ip-address={node.ip} --num-cpus={num_cpus} "
            f"--temp-dir={node.private}/ray --disable-usage-stats --block"
        )
        log = (self.root / f"{node.name}.log").open("w")
        node.process = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                node.name,
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
            ],
            env={**self.node_env(), "HOME": str(node.private)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        if index == 0:
            self.nodes.insert(0, node)
        else:
            self.nodes.append(node)
        return node

    def wait_for_nodes(self, count: int) -> None:
        self._wait_for(lambda: self.alive_nodes() >= count, f"{count} Ray nodes", None)

    def alive_nodes(self) -> int:
        code = "import ray; ray.init(address='auto'); print(sum(n['Alive'] for n in ray.nodes()))"
        try:
            done = self.driver(["python", "-c", code], timeout=60)
        except RuntimeError:  # the node has not mounted its private folder yet
            return 0
        try:
            return int(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def head_pid(self) -> int:
        """A process in the head's mount and network namespaces (the raylet's parent shell is
        exec'ed into ``ray start``; any pid of the namespace with the tmpfs mounted will do)."""
        for pid in self.pids(self.head.name):
            mounts = Path(f"/proc/{pid}/mounts")
            try:
                if str(self.head.private) in mounts.read_text():
                    return pid
            except OSError:
                continue
        raise RuntimeError(f"no process of {self.head.name} has its private folder mounted")

    def driver(
        self,
        argv: list[str],
        *,
        timeout: float = COMMAND_TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """``argv`` as a driver in the head node's namespaces, with the S3 environment."""
        full = {
            **self.node_env(),
            "HOME": str(self.head.private),
            "RAY_ADDRESS": f"{self.head.ip}:{RAY_PORT}",  # the temp dir is not /tmp/ray
            **(env or {}),
        }
        nsenter = [
            "nsenter",
            f"--target={self.head_pid()}",
            "--mount",
            "--net",
            "--",
            "env",
            "-i",
            *(f"{k}={v}" for k, v in full.items()),
        ]
        try:
            return subprocess.run(
                [*nsenter, *argv], capture_output=True, text=True, timeout=timeout, cwd=self.repo
            )
        except subprocess.TimeoutExpired as error:
            return subprocess.CompletedProcess(argv, 124, error.stdout or "", error.stderr or "")

    def run_in(
        self, netns: str, argv: list[str], *, timeout: float = 60, mount: bool = True
    ) -> subprocess.CompletedProcess:
        """``argv`` in a node's namespaces (network only for the bridge: ``mount=False``)."""
        if mount and netns != self.bridge:
            node = next(n for n in self.nodes if n.name == netns)
            pid = next(p for p in self.pids(netns) if _has_mount(p, node.private))
            prefix = ["nsenter", f"--target={pid}", "--mount", "--net", "--"]
        else:
            prefix = ["ip", "netns", "exec", netns]
        try:
            return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as error:
            return subprocess.CompletedProcess(argv, 124, error.stdout or "", error.stderr or "")

    def kill_node(self, node: Node) -> None:
        """SIGKILL every process of the node's namespace (a machine lost), then forget it."""
        for pid in self.pids(node.name):
            _kill(pid)
        if node.process:
            node.process.wait(timeout=30)
        sh("ip", "netns", "del", node.name, check=False)
        self.nodes.remove(node)

    # --- plumbing ----------------------------------------------------------------------------
    def pids(self, netns: str) -> list[int]:
        out = sh("ip", "netns", "pids", netns, check=False)
        return [int(p) for p in out.split()]

    def _wait_for(self, ready, what: str, log: Path | None) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if time.monotonic() > deadline:
                tail = log.read_text()[-3000:] if log and log.exists() else ""
                raise RuntimeError(f"{what} not up after {START_TIMEOUT_S} s\n{tail}")
            time.sleep(1)

    def close(self) -> None:
        """End every process this cluster started (by pid, namespace by namespace), delete its
        namespaces; bounded in time, safe to call twice."""
        names = [n.name for n in self.nodes] + [self.bridge]
        for name in names:
            for pid in self.pids(name):
                _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(self.pids(n) for n in names):
            time.sleep(0.5)
        for name in names:
            for pid in self.pids(name):
                _kill(pid)
        for process in [n.process for n in self.nodes] + [self.server]:
            if process:
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    _kill(process.pid)
        for name in names:
            sh("ip", "netns", "del", name, check=False)
        self.nodes.clear()
        self.server = None


def _has_mount(pid: int, folder: Path) -> bool:
    try:
        return f" {folder} " in Path(f"/proc/{pid}/mounts").read_text()
    except OSError:
        return False


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
