"""raydiff.storage: run folders as local paths or URIs, on pyarrow's in-memory filesystem and on
the local disk through pyarrow (the same code paths an object store takes), plus the checkpoint
rules (files.json) over a URI and S3's configuration from the AWS environment."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pyarrow.fs
import pytest
import torch

from raydiff.data.manifest import MANIFEST_NAME, is_dataset
from raydiff.errors import UserInputError
from raydiff.storage import (
    MirroredFolder,
    RemotePath,
    append_line,
    as_location,
    download,
    local_copy,
    local_path,
    names_a_bucket,
    open_filesystem,
    ray_storage,
    reader_paths,
    resolve_location,
    resolved,
    upload,
    write_text_atomically,
)
from raydiff.train.checkpoint import (
    FILES_FILE,
    latest_checkpoint,
    load_checkpoint,
    read_progress,
    require_checkpoint_dir,
    save_checkpoint,
)
from raydiff.train.preflight import check_resume_target

pytestmark = pytest.mark.unit


@pytest.fixture
def memory() -> RemotePath:
    """An empty run folder on pyarrow's in-memory filesystem."""
    return RemotePath(pyarrow.fs._MockFileSystem(), "bucket/runs/r1", "mock://bucket/runs/r1")


@pytest.fixture
def on_disk(tmp_path: Path) -> RemotePath:
    """A run folder on the local disk, reached through pyarrow like a remote one."""
    root = tmp_path / "remote"
    return RemotePath(pyarrow.fs.LocalFileSystem(), str(root), f"file-like://{root}")


def checkpoint_files(step: int) -> dict:
    return {
        "model_state": {"w": torch.arange(4.0)},
        "ema_states": {0.9: {"w": torch.ones(4)}},
        "trainer_state": {"step": step, "epoch": 1, "epoch_samples": 16},
        "config": {"model": {"image_size": 8}},
    }


def test_local_paths_stay_paths_and_uris_become_remote_paths(tmp_path, monkeypatch):
    assert as_location("runs/a") == Path("runs/a")
    assert as_location(tmp_path) == tmp_path
    assert as_location(f"file://{tmp_path}") == tmp_path
    monkeypatch.chdir(tmp_path)
    assert resolve_location("runs/a") == tmp_path / "runs" / "a"
    uri = as_location("mock:///bucket/runs/r1/")
    assert isinstance(uri, RemotePath)
    assert as_location(uri) is uri and resolve_location(uri) is uri
    assert str(uri) == "mock:///bucket/runs/r1"
    assert uri.name == "r1" and str(uri.parent) == "mock:///bucket/runs"
    assert str(uri / "checkpoint_000004") == "mock:///bucket/runs/r1/checkpoint_000004"


def test_what_differs_between_a_local_path_and_a_uri(tmp_path, memory, monkeypatch):
    assert local_path(tmp_path) == tmp_path and local_path(memory) is None
    assert local_path("s3://bucket/run") is None and local_path("mock:///bucket") is None
    assert local_path(f"file://{tmp_path}") == tmp_path
    monkeypatch.setenv("HOME", str(tmp_path))
    assert local_path("~/runs") == tmp_path / "runs"
    monkeypatch.chdir(tmp_path)
    assert resolved("runs/a") == str(tmp_path.resolve() / "runs" / "a")
    assert resolved(f"file://{tmp_path}/x") == str(tmp_path.resolve() / "x")
    assert resolved("s3://bucket/data/") == "s3://bucket/data"  # no filesystem reached
    # A dataset is a local folder with a manifest, or any URI (its manifest is read when used).
    assert not is_dataset(tmp_path) and is_dataset("s3://bucket/data")
    (tmp_path / MANIFEST_NAME).write_text("{}")
    assert is_dataset(tmp_path) and is_dataset(f"file://{tmp_path}") and is_dataset(".")
    assert names_a_bucket(as_location("mock:///bucket/"))
    assert not names_a_bucket(memory) and not names_a_bucket(Path("/bucket"))
    assert ray_storage(tmp_path / "runs") == (str(tmp_path / "runs"), None)
    assert ray_storage(memory.parent) == ("bucket/runs", memory.filesystem)


@pytest.mark.parametrize("where", ["local", "memory", "on_disk"])
def test_append_line_adds_a_line_locally_and_under_a_uri(where, tmp_path, request):
    folder = tmp_path / "run" if where == "local" else request.getfixturevalue(where)
    folder.mkdir(parents=True, exist_ok=True)
    append_line(folder / "metrics.jsonl", '{"step": 1}')
    append_line(folder / "metrics.jsonl", '{"step": 2}')
    assert (folder / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'


def test_remote_path_reads_writes_and_lists(memory):
    assert not memory.exists() and not memory.is_dir() and list(memory.iterdir()) == []
    (memory / "config.json").write_text('{"a": 1}')
    (memory / "samples" / "s.png").write_bytes(b"png")
    assert memory.is_dir() and (memory / "config.json").is_file()
    assert json.loads((memory / "config.json").read_text()) == {"a": 1}
    assert (memory / "samples" / "s.png").stat().st_size == 3
    assert sorted(p.name for p in memory.iterdir()) == ["config.json", "samples"]
    with pytest.raises(FileNotFoundError, match=r"missing\.json"):
        (memory / "missing.json").read_text()
    (memory / "config.json").unlink()
    (memory / "config.json").unlink(missing_ok=True)
    assert not (memory / "config.json").exists()


def test_writes_on_a_local_filesystem_replace_the_file_whole(on_disk):
    (on_disk / "a" / "b.txt").write_text("one")
    (on_disk / "a" / "b.txt").write_text("two")
    assert Path(on_disk.path, "a", "b.txt").read_text() == "two"
    assert [p.name for p in Path(on_disk.path, "a").iterdir()] == ["b.txt"]  # no temporaries


def test_upload_and_download_folders(tmp_path, memory, monkeypatch):
    source = tmp_path / "checkpoint"
    (source / "sub").mkdir(parents=True)
    for name in ("files.json", "model.pt", "trainer.pt", "sub/x.bin"):
        (source / name).write_bytes(name.encode())
    copied: list[str] = []
    copy_files = pyarrow.fs.copy_files
    monkeypatch.setattr(
        pyarrow.fs,
        "copy_files",
        lambda src, dst, **kw: copied.append(Path(src).name) or copy_files(src, dst, **kw),
    )
    upload(source, memory / "checkpoint_000004", last="files.json")
    assert copied[-1] == "files.json" and sorted(copied) == sorted(
        ["files.json", "model.pt", "trainer.pt", "x.bin"]
    )
    back = download(memory / "checkpoint_000004", tmp_path / "back")
    assert sorted(str(p.relative_to(back)) for p in back.rglob("*") if p.is_file()) == [
        "files.json",
        "model.pt",
        "sub/x.bin",
        "trainer.pt",
    ]
    assert (back / "sub" / "x.bin").read_bytes() == b"sub/x.bin"
    with pytest.raises(FileNotFoundError, match="checkpoint_000008"):
        download(memory / "checkpoint_000008", tmp_path / "none")


def test_local_copy_downloads_only_remote_locations(tmp_path, memory):
    with local_copy(None) as nothing:
        assert nothing is None
    with local_copy(tmp_path) as same:
        assert same == tmp_path
    (memory / "checkpoint_000004" / "model.pt").write_bytes(b"weights")
    with local_copy(memory / "checkpoint_000004") as folder:
        assert folder.name == "checkpoint_000004"
        assert (folder / "model.pt").read_bytes() == b"weights"
    assert not folder.exists()
    with local_copy(memory / "checkpoint_000004" / "model.pt") as file:
        assert file.read_bytes() == b"weights"


def test_mirrored_folder_writes_local_run_folders_in_place(tmp_path):
    files = MirroredFolder(tmp_path)
    assert files.local == tmp_path and not files.is_remote
    (tmp_path / "config.json").write_text("{}")
    assert files.publish("config.json") == tmp_path / "config.json"
    files.close()
    assert (tmp_path / "config.json").is_file()


def test_mirrored_folder_uploads_what_is_published(memory):
    files = MirroredFolder(memory)
    staging = files.local
    (staging / "tensorboard").mkdir()
    events = staging / "tensorboard" / "events.out.tfevents.1"
    events.write_bytes(b"1")
    assert str(files.publish("tensorboard", min_interval_s=60)) == f"{memory}/tensorboard"
    events.write_bytes(b"12")
    files.publish("tensorboard", min_interval_s=60)  # too soon: skipped
    assert (memory / "tensorboard" / events.name).read_bytes() == b"1"
    files.publish("tensorboard")
    assert (memory / "tensorboard" / events.name).read_bytes() == b"12"
    (staging / "samples").mkdir()
    (staging / "samples" / "samples_000002.png").write_bytes(b"png")
    published = files.publish(staging / "samples" / "samples_000002.png")
    assert published.read_bytes() == b"png"
    files.close()
    assert not staging.exists()


def test_checkpoint_rules_hold_under_a_uri(memory, tmp_path):
    assert latest_checkpoint(memory) is None
    first = save_checkpoint(memory, 4, **checkpoint_files(4))
    second = save_checkpoint(memory, 8, **checkpoint_files(8))
    assert local_path(second) is None and str(second) == f"{memory}/checkpoint_000008"
    assert latest_checkpoint(memory) == second
    assert read_progress(second) == {"step": 8, "epoch": 1, "epoch_samples": 16}
    assert require_checkpoint_dir(first) == first
    # A partial upload (files.json goes last) is skipped; a size mismatch too.
    (second / FILES_FILE).unlink()
    assert latest_checkpoint(memory) == first
    (first / "model.pt").write_bytes(b"truncated")
    assert latest_checkpoint(memory) is None
    # The same step again replaces the checkpoint.
    again = save_checkpoint(memory, 8, **checkpoint_files(8))
    assert latest_checkpoint(memory) == again
    with local_copy(require_checkpoint_dir(again)) as local:
        state = load_checkpoint(local)
    assert state["trainer"]["step"] == 8 and torch.equal(state["model"]["w"], torch.arange(4.0))
    with pytest.raises(UserInputError, match="already holds a run"):
        check_resume_target(memory, resume=tmp_path / "elsewhere")


def test_s3_takes_the_standard_aws_environment(monkeypatch):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    filesystem, path = open_filesystem("s3://bucket/runs/r1/")
    assert path == "bucket/runs/r1"
    # What a pickled copy (a Ray worker's, an actor's) is rebuilt from: keys included.
    options = pickle.loads(pickle.dumps(filesystem)).__reduce__()[1][0]
    assert options["endpoint_override"] == "http://127.0.0.1:9"
    assert options["region"] == "eu-west-3"
    assert (options["access_key"], options["secret_key"]) == ("key", "secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:10")  # the S3-specific one wins
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")  # no keys: each process's own lookup, none baked in
    options = open_filesystem("s3://bucket/r")[0].__reduce__()[1][0]
    assert options["endpoint_override"] == "http://127.0.0.1:10"
    assert options["access_key"] is None
    # A dataset's shards as Ray Data reads them: on that filesystem, as bucket/key paths.
    paths, filesystem = reader_paths(["s3://bucket/d/a.parquet", "s3://bucket/d/b.parquet"])
    assert paths == ["bucket/d/a.parquet", "bucket/d/b.parquet"]
    assert filesystem.__reduce__()[1][0]["endpoint_override"] == "http://127.0.0.1:10"
    assert reader_paths(["/data/a.parquet"]) == (["/data/a.parquet"], None)
    assert reader_paths(["gs://b/a.parquet"]) == (["gs://b/a.parquet"], None)


def test_a_single_process_run_writes_to_and_resumes_from_a_uri(memory, tmp_path):
    """The loop's own files (staged, uploaded), checkpoints (files.json last) and resume (the
    newest complete checkpoint, downloaded) on a filesystem that is not the local disk."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from test_single_process_loop import run  # tests/unit is on sys.path (pytest prepend mode)

    assert run(4, memory)["step"] == 4
    assert sorted(p.name for p in memory.iterdir()) == [
        "checkpoint_000003",
        "checkpoint_000004",
        "config.json",
        "samples",
        "tensorboard",
    ]
    assert (memory / "samples" / "samples_000004.png").is_file()
    assert run(6, memory)["step"] == 6
    assert read_progress(latest_checkpoint(memory))["step"] == 6
    events_dir = download(memory / "tensorboard", tmp_path / "tensorboard")
    writers = []
    for file in events_dir.iterdir():
        events = EventAccumulator(str(file), size_guidance={"scalars": 0})
        events.Reload()
        # In the order the writers started (file names carry whole seconds only: both runs
        # can start within one).
        writers.append((events.FirstEventTimestamp(), events.Scalars("train/loss_step")))
    steps = [[e.step for e in scalars] for _, scalars in sorted(writers, key=lambda w: w[0])]
    assert steps == [[1, 2, 3, 4], [5, 6]]  # the second run continued at step 5


def test_write_text_atomically_replaces_whole_files_and_leaves_no_temporaries(tmp_path, memory):
    for folder in (tmp_path, memory):
        target = folder / "results.csv"
        write_text_atomically(target, "a\n")
        write_text_atomically(target, "b\n")
        assert target.read_text() == "b\n"
        assert [p.name for p in folder.iterdir()] == ["results.csv"]


class _Store:
    """A pyarrow-like S3 filesystem whose every call raises ``OSError(message)``."""

    type_name = "s3"

    def __init__(self, message: str) -> None:
        self.message = message

    def get_file_info(self, *args: object) -> None:
        raise OSError(self.message)

    def open_output_stream(self, *args: object) -> None:
        raise OSError(self.message)


DENIED = (
    "When initiating multiple part upload for key 'run/probe' in bucket 'b': AWS Error "
    "ACCESS_DENIED during CreateMultipartUpload operation: Access Denied. (Request ID: 18EC4)"
)
UNREACHABLE = (
    "When getting information for key 'run' in bucket 'b': AWS Error NETWORK_CONNECTION during "
    "HeadObject operation: curlCode: 7, Could not connect to server"
)


def test_a_store_refusal_is_one_line_naming_the_path_and_the_answer() -> None:
    from raydiff.errors import RunFailedError
    from raydiff.storage import StorageFailedError, StorageRefusedError

    refused = RemotePath(_Store(DENIED), "b/run", "s3://b/run")
    with pytest.raises(StorageRefusedError):
        list(refused.iterdir())
    with pytest.raises(StorageRefusedError) as caught:
        refused.exists()
    message = str(caught.value)
    assert isinstance(caught.value, UserInputError) and "\n" not in message
    assert message.startswith("s3://b/run: the object store refused it (ACCESS_DENIED: Access")
    assert "Request ID" not in message and "AWS_*" in message
    failed = RemotePath(_Store(UNREACHABLE), "b/run", "s3://b/run")
    with pytest.raises(StorageFailedError) as caught:
        failed.write_text("x")
    assert isinstance(caught.value, RunFailedError)
    assert str(caught.value) == (
        "s3://b/run: the object store failed (NETWORK_CONNECTION: curlCode: 7, Could not "
        "connect to server)"
    )
    # Both travel from a Ray worker to the driver (pickled) whole.
    for error in (StorageRefusedError("s3://b/x", "A"), StorageFailedError("s3://b/x", "B")):
        again = pickle.loads(pickle.dumps(error))
        assert type(again) is type(error) and str(again) == str(error)
    other = RemotePath(_Store("a local disk error"), "b/run", "s3://b/run")
    with pytest.raises(OSError, match="a local disk error"):  # not an answer of a store
        other.exists()


def test_check_writable_names_the_flag_and_leaves_nothing(memory, tmp_path) -> None:
    from raydiff.storage import StorageRefusedError, check_writable

    check_writable(memory, flag="--output")
    assert list(memory.iterdir()) == []  # the probe was removed
    check_writable(tmp_path / "local", flag="--output")  # local folders are not probed
    assert not (tmp_path / "local").exists()
    with pytest.raises(StorageRefusedError, match=r"^--output s3://b/run: the object store "):
        check_writable(RemotePath(_Store(DENIED), "b/run", "s3://b/run"), flag="--output")


def test_a_mirrored_folder_fetches_a_file_to_continue(tmp_path: Path) -> None:
    """``fetch``: a remote folder's file comes into the staging folder (none: nothing there);
    a local folder's file is already where it is."""
    remote = MirroredFolder(as_location("mock:///bucket/run/logs"))
    try:
        assert not remote.fetch("a.log").exists()
        (remote.target / "a.log").write_text("before\n")
        assert remote.fetch("a.log").read_text() == "before\n"
        assert remote.fetch("a.log").parent == remote.local
    finally:
        remote.close()
    local = MirroredFolder(tmp_path)
    (tmp_path / "a.log").write_text("here\n")
    assert local.fetch("a.log") == tmp_path / "a.log"
    assert (tmp_path / "a.log").read_text() == "here\n"
