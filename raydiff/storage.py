"""Run folders on a local disk or on any filesystem pyarrow reaches by URI (s3://, gs://, ...).

One type, :data:`StoragePath`, stands for both, and only this module decides which one a path
or a name is (a unit test refuses ``"://"``, ``is_remote`` and ``isinstance(..., RemotePath)``
elsewhere).
A local path stays a :class:`pathlib.Path`, so local run folders are handled exactly as they
always were. A URI becomes a :class:`RemotePath`: the few ``Path`` methods raydiff's run-folder
and checkpoint code calls (``/``, ``name``, ``parent``, ``exists``, ``is_file``, ``is_dir``,
``iterdir``, ``stat().st_size``, ``read_text``, ``write_text``, ``mkdir``, ...) on a
``pyarrow.fs`` filesystem. Code that takes either calls :func:`as_location` (or
:func:`resolve_location`) on its argument and then uses those methods; what differs between the
two is a function here (:func:`write_text_atomically`, :func:`append_line`, :func:`ray_storage`,
:func:`names_a_bucket`). What has to be read with local file APIs (``torch.load``, TensorBoard's
writer) goes through a local copy: :func:`local_copy` downloads, :class:`MirroredFolder` writes
locally and uploads. :func:`local_path` is the OS path of a local name (None for a URI), for
what only a local folder has (a lock, inductor's cache, a folder other programs open);
:func:`resolved` is a name as every process, in any folder, reads it.

S3 follows the standard AWS environment variables: ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``), ``AWS_REGION`` / ``AWS_DEFAULT_REGION`` and
``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (MinIO, moto or another S3-compatible store;
pyarrow 26 ignores the endpoint variables itself, so they are passed as ``endpoint_override``).
Keys found in the environment are given to the filesystem explicitly, and a pickled
``S3FileSystem`` keeps explicit keys: a RemotePath made by the driver works in every Ray worker
and actor, on any node, whatever their environment. Without keys in the environment every
process uses the AWS SDK's own lookup (its node's instance role, ``~/.aws``). Other schemes
(``gs://``, ``hdfs://``, ``abfs://``, ...) are ``pyarrow.fs.FileSystem.from_uri``'s, as are S3
URIs with options (``s3://bucket/run?region=...``).

No Ray here; pyarrow is imported where a URI is used.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from raydiff.errors import RunFailedError, UserInputError

logger = logging.getLogger(__name__)

# pyarrow's words for an object store's answer: "... AWS Error CODE during OP operation: text".
_AWS_ERROR = re.compile(r"AWS Error (\w+)[^:]*(?::\s*(.*))?")
# The answers the user must act on (a key, a bucket, a policy), not a failure of the store.
_REFUSALS = frozenset(
    {
        "ACCESS_DENIED",
        "INVALID_ACCESS_KEY_ID",
        "SIGNATURE_DOES_NOT_MATCH",
        "NO_SUCH_BUCKET",
        "EXPIRED_TOKEN",
        "INVALID_CLIENT_TOKEN_ID",
        "UNRECOGNIZED_CLIENT",
        "REQUEST_EXPIRED",
    }
)


class StorageRefusedError(UserInputError):
    """An object store refused a read or a write (a missing bucket, a denied access, an unknown
    key): the user's to fix, said in one line with the store's answer."""

    def __init__(self, where: str, answer: str) -> None:
        self.where, self.answer = where, answer
        super().__init__(
            f"{where}: the object store refused it ({answer}); check the bucket's name and "
            "that the AWS_* credentials may read and write there"
        )

    def __reduce__(self) -> tuple[Any, ...]:  # pickled from Ray workers with its two fields
        return type(self), (self.where, self.answer)


class StorageFailedError(RunFailedError):
    """A read or a write that an object store failed (unreachable, timed out, a server error):
    what stops a run, in one line with the store's answer, instead of a traceback."""

    def __init__(self, where: str, answer: str) -> None:
        self.where, self.answer = where, answer
        super().__init__(f"{where}: the object store failed ({answer})")

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.where, self.answer)


@contextlib.contextmanager
def _store_errors_named(uri: str) -> Iterator[None]:
    """An object store's error inside the block becomes :class:`StorageRefusedError` or
    :class:`StorageFailedError` naming ``uri`` (a bare OSError of pyarrow reaches the user as
    a traceback); other errors pass unchanged."""
    try:
        yield
    except OSError as error:
        found = _AWS_ERROR.search(str(error))
        if found is None:
            raise
        code, detail = found.group(1), (found.group(2) or "").split(" (Request ID")[0].strip()
        answer = f"{code}: {detail}" if detail else code
        kind = StorageRefusedError if code in _REFUSALS else StorageFailedError
        raise kind(uri, answer) from None


def _store_errors_named_for_self(method: Callable[..., Any]) -> Callable[..., Any]:
    """A :class:`RemotePath` method under :func:`_store_errors_named` of its own URI."""

    @functools.wraps(method)
    def wrapper(self: RemotePath, *args: Any, **kwargs: Any) -> Any:
        with _store_errors_named(self.uri):
            return method(self, *args, **kwargs)

    return wrapper


def is_remote(uri: str) -> bool:
    """True for URIs with a scheme other than ``file://`` (s3://, gs://, hdfs://, ...)."""
    return "://" in uri and not uri.startswith("file://")


def as_location(target: str | os.PathLike[str] | RemotePath) -> StoragePath:
    """``target`` as a :class:`RemotePath` (a URI, or one already) or a ``Path`` (as given)."""
    if isinstance(target, RemotePath):
        return target
    text = os.fspath(target)
    if is_remote(text):
        return RemotePath.from_uri(text)
    return Path(text.removeprefix("file://"))


def resolve_location(target: str | os.PathLike[str] | RemotePath) -> StoragePath:
    """:func:`as_location`, a local path made absolute (Ray workers run in other folders)."""
    location = as_location(target)
    return location if isinstance(location, RemotePath) else location.expanduser().resolve()


def open_filesystem(uri: str) -> tuple[Any, str]:
    """``(pyarrow filesystem, path on it)`` for a URI; S3 configured from the environment
    (see the module docstring)."""
    import pyarrow.fs

    scheme, _, rest = uri.partition("://")
    if scheme.lower() != "s3" or "?" in rest:
        return pyarrow.fs.FileSystem.from_uri(uri)
    path = rest.strip("/")
    env = os.environ
    options: dict[str, Any] = {}
    endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        options["endpoint_override"] = endpoint  # "http://host:port" also sets the scheme
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if not region and not endpoint:
        # What from_uri does: the bucket's own region (one request), not the SDK's default.
        try:
            region = pyarrow.fs.resolve_s3_region(path.partition("/")[0])
        except OSError as error:
            raise UserInputError(
                f"{uri}: cannot look up the bucket's region ({error}); set AWS_REGION, or "
                "AWS_ENDPOINT_URL for an S3-compatible store"
            ) from None
    if region:
        options["region"] = region
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        options.update(
            access_key=env["AWS_ACCESS_KEY_ID"],
            secret_key=env["AWS_SECRET_ACCESS_KEY"],
            session_token=env.get("AWS_SESSION_TOKEN"),
        )
    return pyarrow.fs.S3FileSystem(**options), path


class FileStat(NamedTuple):
    """What :meth:`RemotePath.stat` tells (``os.stat_result``'s field of that name)."""

    st_size: int


# Object stores have no folders (a prefix exists while an object is under it): creating one
# would only write an empty marker object.
_NO_FOLDERS = frozenset({"s3", "gcs"})


@dataclass(frozen=True)
class RemotePath:
    """A file or folder on a pyarrow filesystem; pickles with that filesystem.

    ``path``: the filesystem's path (``bucket/prefix/run`` for S3); ``uri``: the same place as a
    URI, what messages and ``str()`` show.
    """

    filesystem: Any
    path: str
    uri: str

    @classmethod
    def from_uri(cls, uri: str) -> RemotePath:
        filesystem, path = open_filesystem(uri)
        return cls(filesystem, path.rstrip("/"), uri.partition("?")[0].rstrip("/"))

    def __str__(self) -> str:
        return self.uri

    def __truediv__(self, name: str | os.PathLike[str]) -> RemotePath:
        name = os.fspath(name).strip("/")
        return RemotePath(self.filesystem, f"{self.path}/{name}", f"{self.uri}/{name}")

    @property
    def name(self) -> str:
        return self.path.rpartition("/")[2]

    @property
    def parent(self) -> RemotePath:
        return RemotePath(
            self.filesystem, self.path.rpartition("/")[0], self.uri.rpartition("/")[0]
        )

    @_store_errors_named_for_self
    def _type(self) -> str:
        """``pyarrow.fs.FileType``'s name: NotFound, File, Directory, ..."""
        return self.filesystem.get_file_info(self.path).type.name

    def exists(self) -> bool:
        return self._type() != "NotFound"

    def is_file(self) -> bool:
        return self._type() == "File"

    def is_dir(self) -> bool:
        return self._type() == "Directory"

    def iterdir(self) -> Iterator[RemotePath]:
        """The folder's entries (none when it does not exist), in no particular order."""
        import pyarrow.fs

        selector = pyarrow.fs.FileSelector(self.path, allow_not_found=True)
        # Listed inside the block: a generator's body would run after a decorator's had left.
        with _store_errors_named(self.uri):
            found = self.filesystem.get_file_info(selector)
        for info in found:
            yield self / info.base_name

    @_store_errors_named_for_self
    def stat(self) -> FileStat:
        info = self.filesystem.get_file_info(self.path)
        if info.size is None:
            raise FileNotFoundError(f"{self} is not a file")
        return FileStat(st_size=info.size)

    @_store_errors_named_for_self
    def read_bytes(self) -> bytes:
        if not self.is_file():
            raise FileNotFoundError(f"{self} does not exist")
        with self.filesystem.open_input_stream(self.path) as f:
            return f.read()

    def read_text(self, encoding: str = "utf-8") -> str:
        return self.read_bytes().decode(encoding)

    @_store_errors_named_for_self
    def write_bytes(self, data: bytes) -> None:
        """Replace the file as a whole: an object store publishes an object when its upload
        completes; on a local filesystem a temporary file is renamed into place."""
        self.parent.mkdir()
        if self.filesystem.type_name != "local":
            with self.filesystem.open_output_stream(self.path) as f:
                f.write(data)
            return
        tmp = f"{self.path}.tmp-{os.getpid()}"
        with self.filesystem.open_output_stream(tmp) as f:
            f.write(data)
        self.filesystem.move(tmp, self.path)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))

    @_store_errors_named_for_self
    def mkdir(self, parents: bool = True, exist_ok: bool = True) -> None:
        """Create the folder with its parents (nothing to do on an object store)."""
        if self.filesystem.type_name not in _NO_FOLDERS:
            self.filesystem.create_dir(self.path, recursive=True)

    @_store_errors_named_for_self
    def unlink(self, missing_ok: bool = False) -> None:
        if missing_ok and not self.exists():
            return
        self.filesystem.delete_file(self.path)


#: A file or folder raydiff reads or writes: a local ``Path``, or a URI's :class:`RemotePath`.
StoragePath = Path | RemotePath


def local_path(target: str | os.PathLike[str] | RemotePath) -> Path | None:
    """The OS path of a location on this machine's disks (``file://`` dropped, ``~`` expanded),
    which OS file APIs, locks and other programs can open; None for a URI. Made from the text
    alone: a URI's filesystem is not reached."""
    if isinstance(target, RemotePath):
        return None
    text = os.fspath(target)
    return None if is_remote(text) else Path(text.removeprefix("file://")).expanduser()


def resolved(target: str) -> str:
    """``target`` as every process names it: a local path made absolute (Ray workers and trials
    run in other folders), a URI as given (without a trailing ``/``)."""
    local = local_path(target)
    return target.rstrip("/") if local is None else str(local.resolve())


def names_a_bucket(location: StoragePath) -> bool:
    """True for a URI of a whole bucket (``s3://bucket``), with no folder in it."""
    return isinstance(location, RemotePath) and "/" not in location.path


def ray_storage(location: StoragePath) -> tuple[str, Any]:
    """``(storage_path, storage_filesystem)`` as Ray Train and Tune take them: a URI's path on
    its pyarrow filesystem (S3 configured from this process's environment, credentials included),
    or a local folder's path and None (Ray's default filesystem)."""
    if isinstance(location, RemotePath):
        return location.path, location.filesystem
    return str(location), None


def reader_paths(uris: list[str]) -> tuple[list[str], Any]:
    """Files of one dataset as pyarrow's readers (Ray Data's ``read_parquet``) take them:
    S3 ones as the AWS environment describes it (an endpoint, keys), which a reader's own
    ``from_uri`` would not see, as ``bucket/key`` paths on that filesystem; others as given,
    with None (the reader's own lookup)."""
    if not uris or not uris[0].lower().startswith("s3://"):
        return uris, None
    return [uri.partition("://")[2] for uri in uris], open_filesystem(uris[0])[0]


def append_line(path: StoragePath, line: str) -> None:
    """Append ``line`` to the file ``path``. An object store has no append: the object is
    written again whole (so there must be one writer at a time)."""
    if isinstance(path, RemotePath):
        before = path.read_text() if path.is_file() else ""
        path.write_text(before + line + "\n")
        return
    with open(path, "a") as file:
        file.write(line + "\n")


def write_text_atomically(target: StoragePath, text: str) -> None:
    """Replace the file ``target`` as a whole (:func:`write_bytes_atomically`)."""
    write_bytes_atomically(target, text.encode())


def write_bytes_atomically(target: StoragePath, data: bytes) -> None:
    """Replace the file ``target`` as a whole: a local one through a temporary file renamed into
    place, a remote one as one object (:meth:`RemotePath.write_bytes`). Readers never see half."""
    if isinstance(target, RemotePath):
        target.write_bytes(data)
        return
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    tmp.replace(target)


def check_writable(location: StoragePath, *, flag: str) -> None:
    """Write and delete a probe object in the remote folder ``location`` (a local folder is
    created where it is written), so that a store that refuses it is named, in one line with
    its answer and ``flag``, before anything starts rather than at the first checkpoint."""
    if not isinstance(location, RemotePath):
        return
    probe = location / f".raydiff-write-check-{uuid.uuid4().hex[:12]}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except StorageRefusedError as error:
        raise StorageRefusedError(f"{flag} {location}", error.answer) from None


def upload(source: Path, target: RemotePath, *, last: str | None = None) -> None:
    """Copy the local file or folder ``source`` to ``target`` (a folder's files one by one;
    those named ``last`` after all the others)."""
    import pyarrow.fs

    local = pyarrow.fs.LocalFileSystem()
    if source.is_file():
        target.parent.mkdir()
        with _store_errors_named(target.uri):
            pyarrow.fs.copy_files(
                str(source),
                target.path,
                source_filesystem=local,
                destination_filesystem=target.filesystem,
            )
        return
    files = sorted(p for p in source.rglob("*") if p.is_file())
    for file in sorted(files, key=lambda p: p.name == last):
        upload(file, target / file.relative_to(source).as_posix())


def download(source: RemotePath, target: Path) -> Path:
    """Copy the file or folder ``source`` to the local path ``target``; returns ``target``."""
    import pyarrow.fs

    if not source.exists():
        raise FileNotFoundError(f"{source} does not exist")
    if source.is_dir():
        target.mkdir(parents=True, exist_ok=True)  # copy_files makes the folders below it
    with _store_errors_named(source.uri):
        pyarrow.fs.copy_files(
            source.path,
            str(target),
            source_filesystem=source.filesystem,
            destination_filesystem=pyarrow.fs.LocalFileSystem(),
        )
    return target


@contextlib.contextmanager
def local_copy(location: StoragePath | None) -> Iterator[Path | None]:
    """A local path to read ``location`` from inside the block: a local one (or None) as it is,
    a remote file or folder downloaded into a temporary folder (under its own name) that is
    removed after the block."""
    if not isinstance(location, RemotePath):
        yield location
        return
    with tempfile.TemporaryDirectory(prefix="raydiff-download-") as tmp:
        local = download(location, Path(tmp) / location.name)
        logger.info("downloaded %s to %s", location, local)
        yield local


class MirroredFolder:
    """Files one process writes into a run folder with local file APIs (the config, sample
    grids, TensorBoard's event files).

    A local run folder is written in place (``local`` is the folder itself and :meth:`publish`
    does nothing). For a remote one, ``local`` is a temporary staging folder and :meth:`publish`
    copies a file or folder from it to the same place under the run folder: objects are
    replaced whole, so a reader never sees half a file; :meth:`fetch` brings a file the run
    folder already has into it, to be continued.
    """

    def __init__(self, target: StoragePath) -> None:
        self.target = target
        self.is_remote = isinstance(target, RemotePath)
        self._staging = (
            tempfile.TemporaryDirectory(prefix="raydiff-run-files-") if self.is_remote else None
        )
        self.local = Path(self._staging.name) if self._staging else Path(target)
        self._published: dict[str, float] = {}

    def publish(
        self, relative: str | os.PathLike[str], *, min_interval_s: float = 0.0
    ) -> StoragePath:
        """Copy ``local/relative`` (or an absolute path under ``local``) to the run folder;
        returns where it is there. ``min_interval_s``: skip the copy when this path was
        published less than that long ago."""
        relative = Path(relative)
        if relative.is_absolute():
            relative = relative.relative_to(self.local)
        if not isinstance(self.target, RemotePath):
            return self.target / relative
        destination = self.target / relative.as_posix()
        key, now = relative.as_posix(), time.monotonic()
        if key in self._published and now - self._published[key] < min_interval_s:
            return destination
        upload(self.local / relative, destination)
        self._published[key] = now
        return destination

    def fetch(self, relative: str | os.PathLike[str]) -> Path:
        """``local/relative``, holding what the run folder has under that name: for a remote
        one, its file (if any) is downloaded into the staging folder, so that a file this
        process continues (a log it appends to) keeps what an earlier process published."""
        local = self.local / relative
        if isinstance(self.target, RemotePath):
            remote = self.target / Path(relative).as_posix()
            if remote.is_file():
                local.parent.mkdir(parents=True, exist_ok=True)
                download(remote, local)
        return local

    def close(self) -> None:
        """Remove the staging folder (publish what is needed first)."""
        if self._staging is not None:
            self._staging.cleanup()
