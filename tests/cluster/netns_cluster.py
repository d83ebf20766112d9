"""A Ray cluster whose nodes share no disk, and a real S3 server, on one Linux machine (root).

Namespaces (names start with this process's own prefix, so nothing else is touched):
- ``<prefix>br``: a bridge ``br0`` (10.213.0.1/24) and the S3 server (tests/s3_server.py's
  SeaweedFS, credentials enforced) listening on 10.213.0.1 only, never on the machine's own
  interfaces.
- ``<prefix>n<i>``: one per Ray node, a veth pair to the bridge (10.213.0.(10+i)), loopback up.
  The node runs in a mount namespace of its own (``unshare --mount``) with a tmpfs on its
  private folder (its HOME and Ray temp dir): what it writes there is its alone, and the same
  path on another node is an empty folder. Only the virtualenv and the checkout are shared, as
  on a cluster built from one image.

Drivers run in the head node's namespaces (``nsenter --target <head pid> --mount --net``), as a
user on the head machine. Every process here is ended by pid (``ip netns pids``), every
namespace deleted, in :meth:`NetnsCluster.close`, which a ``finally`` calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from s3_server import ACCESS_KEY, S3Server

SUBNET = "10.213.0"
BRIDGE_IP = f"{SUBNET}.1"
RAY_PORT = 6379
START_TIMEOUT_S = 120
COMMAND_TIMEOUT_S = 300
OBJECT_STORE_BYTES = 256 * 1024**2  # per node: tiny models, and a 2-core machine's memory
_CLONE_NEWNET = 0x40000000  # setns(2)'s namespace type: a network namespace


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
    num_cpus: int
    process: subprocess.Popen | None = None


@dataclass
class NetnsCluster:
    """See the module docstring: :meth:`start`, then :meth:`close` in a ``finally``."""

    root: Path  # host folder for the mount points and the S3 server's data and logs
    repo: Path
    bucket: str = "raydiff-test"
    prefix: str = field(default_factory=lambda: f"rdc{os.getpid() % 100000}")
    nodes: list[Node] = field(default_factory=list)
    server: subprocess.Popen | None = None
    endpoint: str = ""
    _next_index: int = 0

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def address(self) -> str:
        return f"{self.head.ip}:{RAY_PORT}"

    def start(self, *, cpus: Sequence[int]) -> None:
        """The bridge, the S3 server, then one node per entry of ``cpus`` (the first the head)."""
        self.start_bridge()
        self.start_s3()
        for num_cpus in cpus:
            self.add_node(num_cpus=num_cpus)
        self.wait_for_nodes(len(cpus))

    @property
    def s3_server(self) -> S3Server:
        """The S3 server (reachable on the cluster's network: :meth:`joined`)."""
        return S3Server(endpoint=self.endpoint, buckets=(self.bucket,))

    def s3_environment(self, *, access_key: str = ACCESS_KEY) -> dict[str, str]:
        """The AWS variables a user of this cluster sets (``access_key``: whose)."""
        return self.s3_server.environment(access_key=access_key)

    def node_env(self, node: Node) -> dict[str, str]:
        venv_bin = str(Path(sys.executable).parent)
        return {
            "PATH": f"{venv_bin}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(node.private),
            "PYTHONPATH": f"{self.repo}{os.pathsep}{self.repo / 'tests'}",
            "LANG": "C.UTF-8",
            "RAY_AUTH_MODE": "disabled",  # a throwaway cluster: no token (docs/operations.md)
            "RAY_USAGE_STATS_ENABLED": "0",
            # A SIGKILLed node is declared dead after 3 failed health checks 1 s apart (Ray's
            # defaults: 5 x 3 s); refused connections fail a check at once.
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_failure_threshold": "3",
            # Gloo binds the address of the machine's host name unless told an interface; here
            # (and on many real machines) that name resolves to a loopback address, which other
            # nodes cannot reach (docs/operations.md, "Storage").
            "GLOO_SOCKET_IFNAME": "eth0",
            # One thread per training worker: every node shares this machine's 2 cores.
            "OMP_NUM_THREADS": "1",
            "MLFLOW_DISABLE_TELEMETRY": "true",  # no network calls out
            **self.s3_environment(),
        }

    # --- network -----------------------------------------------------------------------------
    def start_bridge(self) -> None:
        sh("ip", "netns", "add", self.bridge)
        sh("ip", "-n", self.bridge, "link", "set", "lo", "up")
        sh("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.bridge, "addr", "add", f"{BRIDGE_IP}/24", "dev", "br0")
        sh("ip", "-n", self.bridge, "link", "set", "br0", "up")

    def add_netns(self, index: int) -> tuple[str, str]:
        name = f"{self.prefix}n{index}"
        ip = f"{SUBNET}.{10 + index}"
        sh("ip", "netns", "add", name)
        # Both ends are made inside the namespaces: no interface ever appears on the host.
        peer = f"v{index}"
        sh("ip", "-n", name, "link", "add", "eth0", "type", "veth", "peer", "name", peer)
        sh("ip", "-n", name, "link", "set", peer, "netns", self.bridge)
        sh("ip", "-n", self.bridge, "link", "set", peer, "master", "br0", "up")
        sh("ip", "-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", name, "link", "set", "eth0", "up")
        sh("ip", "-n", name, "link", "set", "lo", "up")
        return name, ip

    # --- S3 ----------------------------------------------------------------------------------
    def start_s3(self) -> None:
        """tests/s3_server.py's SeaweedFS on the bridge's address, started from inside the
        bridge's namespace (the host has no route there, by design)."""
        log = self.root / "s3-serve.log"
        self.server = subprocess.Popen(
            [
                *("ip", "netns", "exec", self.bridge, "env", "-i"),
                *(f"{k}={v}" for k, v in self.host_env().items()),
                *(sys.executable, str(self.repo / "tests" / "s3_server.py")),
                *(str(self.root / "s3"), BRIDGE_IP, self.bucket),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log.open("w"),
            text=True,
            start_new_session=True,
        )
        line = self.server.stdout.readline()  # one JSON line once it serves, or EOF
        if not line:
            self.server.wait(timeout=30)
            raise RuntimeError(f"the S3 server did not start: {log.read_text()[-3000:]}")
        self.endpoint = json.loads(line)["endpoint"]

    def host_env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(self.repo)}

    def s3(self, code: str, *, timeout: float = 60) -> str:
        """Run Python ``code`` with ``server`` (an S3Server) and ``s3`` (its boto3 client, the
        read-write key) in the bridge's namespace; its stdout. Raises with its stderr."""
        prelude = (
            f"import sys; sys.path.insert(0, {str(self.repo / 'tests')!r})\n"
            "from s3_server import S3Server\n"
            f"server = S3Server(endpoint={self.endpoint!r}, buckets=({self.bucket!r},))\n"
            "s3 = server.client()\n"
        )
        env = ["env", "-i", *(f"{k}={v}" for k, v in self.host_env().items())]
        argv = [*env, sys.executable, "-c", prelude + code]
        done = self.run_in(self.bridge, argv, timeout=timeout)
        if done.returncode:
            raise RuntimeError(f"S3 code failed ({done.returncode}): {done.stderr[-3000:]}")
        return done.stdout

    @contextlib.contextmanager
    def joined(self) -> Iterator[None]:
        """This thread on the cluster's network (the bridge's namespace) inside the block, and
        what it starts there (threads, subprocesses, servers): a user's machine beside the
        cluster, that reaches the S3 server and the nodes and that the nodes reach. Only the
        network namespace changes (setns(2), per thread); the way back is kept open."""
        libc = ctypes.CDLL(None, use_errno=True)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        bridge = os.open(f"/run/netns/{self.bridge}", os.O_RDONLY)
        try:
            if libc.setns(bridge, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {self.bridge}")
            try:
                yield
            finally:
                if libc.setns(home, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns back to the machine's network")
        finally:
            os.close(home)
            os.close(bridge)

    def put(self, node: Node, path: Path, text: str) -> None:
        """A file of ``text`` at ``path`` on ``node``'s own disk (its private folder)."""
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        done = self.run_in(node.name, ["sh", "-c", script, "put", str(path)], input=text)
        if done.returncode:
            raise RuntimeError(f"cannot write {path} on {node.name}: {done.stderr}")

    def keys(self, prefix: str) -> set[str]:
        """Every key of the bucket under ``prefix``."""
        listing = self.s3(f"print('\\n'.join(server.keys({self.bucket!r}, {prefix!r})))")
        return set(listing.split())

    def upload_folder(self, folder: Path, prefix: str) -> str:
        """Every file under ``folder`` to ``prefix`` in the bucket; its ``s3://`` URI."""
        self.s3(
            "from pathlib import Path\n"
            f"root = Path({str(folder)!r})\n"
            "for path in sorted(p for p in root.rglob('*') if p.is_file()):\n"
            f"    key = {prefix!r} + '/' + path.relative_to(root).as_posix()\n"
            f"    s3.upload_file(str(path), {self.bucket!r}, key)\n"
        )
        return f"s3://{self.bucket}/{prefix}"

    # --- Ray nodes ---------------------------------------------------------------------------
    def add_node(self, *, num_cpus: int) -> Node:
        """A new node (the first one the head): its namespaces, its tmpfs and ``ray start``."""
        index = self._next_index
        self._next_index += 1
        name, ip = self.add_netns(index)
        node = Node(name=name, ip=ip, private=self.root / name, num_cpus=num_cpus)
        node.private.mkdir(parents=True, exist_ok=True)
        if not self.nodes:
            ray = (
                f"ray start --head --port={RAY_PORT} --include-dashboard=true "
                "--dashboard-host=0.0.0.0"
            )
        else:
            ray = f"ray start --address={self.address}"
        script = (
            f"mount -t tmpfs -o size=2g tmpfs {node.private} && mkdir -p {node.private}/ray && "
            f"cd {node.private} && exec {ray} --node-ip-address={node.ip} --num-cpus={num_cpus} "
            f"--object-store-memory={OBJECT_STORE_BYTES} --temp-dir={node.private}/ray "
            "--disable-usage-stats --block"
        )
        unshare = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]
        node.process = subprocess.Popen(
            ["ip", "netns", "exec", node.name, *unshare],
            env=self.node_env(node),
            stdout=(self.root / f"{node.name}.log").open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.nodes.append(node)
        return node

    def wait_for_nodes(self, count: int) -> None:
        """Until ``count`` nodes are alive, as the head's GCS sees them."""
        code = (
            "import sys, time, ray\n"
            "deadline = time.monotonic() + float(sys.argv[2])\n"
            "while True:\n"
            "    try:\n"
            "        ray.init(logging_level='ERROR')\n"
            "        break\n"
            "    except Exception:\n"
            "        if time.monotonic() > deadline: raise\n"
            "        time.sleep(1)\n"
            "while sum(n['Alive'] for n in ray.nodes()) < int(sys.argv[1]):\n"
            "    if time.monotonic() > deadline: sys.exit('nodes: %s' % ray.nodes())\n"
            "    time.sleep(0.5)\n"
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _has_mount(self._any_pid(self.head), self.head.private):
            if time.monotonic() > deadline or self.head.process.poll() is not None:
                raise RuntimeError(f"the head did not start: {self.log(self.head)}")
            time.sleep(0.2)
        argv = ["python", "-c", code, str(count), str(START_TIMEOUT_S)]
        waiting = subprocess.Popen(
            self.driver_argv(argv), stderr=subprocess.PIPE, text=True, cwd=self.head.private.parent
        )
        while waiting.poll() is None:
            if any(node.process.poll() is not None for node in self.nodes):
                waiting.kill()
                break
            time.sleep(0.5)
        if waiting.wait() != 0:
            logs = "\n".join(self.log(node) for node in self.nodes)
            raise RuntimeError(f"{count} Ray nodes not up: {waiting.stderr.read()[-2000:]}\n{logs}")

    def log(self, node: Node) -> str:
        path = self.root / f"{node.name}.log"
        return f"--- {node.name}:\n{path.read_text()[-2000:] if path.exists() else ''}"

    def head_pid(self) -> int:
        """A process in the head's mount and network namespaces."""
        return self._any_pid(self.head)

    def _any_pid(self, node: Node) -> int:
        for pid in self.pids(node.name):
            if _has_mount(pid, node.private):
                return pid
        return -1

    def driver_argv(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> list[str]:
        """``argv`` as a driver on the head node: its namespaces, its HOME and the S3 and Ray
        variables a user there would set."""
        full = {
            **self.node_env(self.head),
            "RAY_ADDRESS": self.address,  # the temp dir is private: `auto` would find nothing
            "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",  # report() is a barrier of one poll
            "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",  # nothing preempts a test cluster
            "RAY_DEDUP_LOGS": "0",
            **(env or {}),
        }
        nsenter = ["nsenter", f"--target={self.head_pid()}", "--mount", "--net", "--"]
        return [*nsenter, "env", "-i", *(f"{k}={v}" for k, v in full.items()), *argv]

    def driver(
        self,
        argv: Sequence[str],
        *,
        timeout: float = COMMAND_TIMEOUT_S,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess:
        """``argv`` run to its end as a driver on the head node (exit 124 on ``timeout``)."""
        try:
            return subprocess.run(
                self.driver_argv(argv, env=env),
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self.head.private.parent,
            )
        except subprocess.TimeoutExpired as error:
            out, err = (_text(error.stdout), _text(error.stderr))
            return subprocess.CompletedProcess(list(argv), 124, out, err)

    def run_in(
        self, netns: str, argv: Sequence[str], *, timeout: float = 60, input: str | None = None
    ) -> subprocess.CompletedProcess:
        """``argv`` in a namespace: a node's network and mount namespaces, or the bridge's."""
        node = next((n for n in self.nodes if n.name == netns), None)
        if node is None:
            prefix = ["ip", "netns", "exec", netns]
        else:
            prefix = ["nsenter", f"--target={self._any_pid(node)}", "--mount", "--net", "--"]
        try:
            return subprocess.run(
                [*prefix, *argv], capture_output=True, text=True, timeout=timeout, input=input
            )
        except subprocess.TimeoutExpired as error:
            out, err = (_text(error.stdout), _text(error.stderr))
            return subprocess.CompletedProcess(list(argv), 124, out, err)

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

    def close(self) -> None:
        """End every process this cluster started (SIGKILL by pid, namespace by namespace: the
        data is throwaway, and Ray's and SeaweedFS's graceful stops take seconds each), delete
        its namespaces; bounded in time, safe to call twice."""
        names = [n.name for n in self.nodes] + [self.bridge]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(pids := [self.pids(n) for n in names]):
            for pid in (p for group in pids for p in group):
                _kill(pid)
            time.sleep(0.2)  # a dying raylet may still start a worker
        for process in [n.process for n in self.nodes] + [self.server]:
            if process:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
        for name in names:
            sh("ip", "netns", "del", name, check=False)
        self.nodes.clear()
        self.server = None


def _has_mount(pid: int, folder: Path) -> bool:
    try:
        return f" {folder} " in Path(f"/proc/{pid}/mounts").read_text()
    except OSError:
        return False


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def _kill(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
