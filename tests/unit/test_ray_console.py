"""What a quiet run leaves off the console (raydiff.orchestrate.ray_session) and what it keeps.

The lines are the ones Ray 2.60 printed on `make demo` and on a classifier sweep; the whole
console of a real run is checked in tests/e2e/test_cli.py.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from types import SimpleNamespace

import pytest

from raydiff.orchestrate import ray_session

PROGRESS_NOTICE = (
    "Progress bars disabled. To enable, set "
    "`ray.data.DataContext.get_current().enable_progress_bars = True`."
)
WATCHER_ERROR = (
    "[2026-11-27 20:41:19,135 E 5444 5509] core_worker.cc:2465: Actor with class name: "
    "'PreemptionWatcher' and ID: 'accbe9f34879c5b463f7248301000000' has constructor arguments in "
    "the object store and max_restarts > 0. If the arguments in the object store go out of scope "
    "or are lost, the actor restart will fail. See https://github.com/ray-project/ray/issues/53727"
    " for more details."
)
# Ray's real errors stay: the same notice for an actor of the user's, and any other ERROR line.
KEPT = [
    WATCHER_ERROR.replace("'PreemptionWatcher'", "'LossHistory'"),
    "[2026-11-27 20:41:19,135 E 5444 5509] core_worker.cc:1000: Failed to connect to the GCS",
    "Warning: The Ray cluster currently does not have any available CPUs.",
]


def record(message: str) -> logging.LogRecord:
    return logging.LogRecord("ray.data.x", logging.WARNING, __file__, 1, message, None, None)


def test_the_noise_filter_drops_rays_noise_and_keeps_its_errors() -> None:
    noise = ray_session.RayNoiseFilter()
    assert not noise.filter(record(PROGRESS_NOTICE))
    assert not noise.filter(record(WATCHER_ERROR))
    assert all(noise.filter(record(line)) for line in KEPT)


def test_rays_skip_regex_is_set_before_ray_is_imported_keeping_the_users(monkeypatch) -> None:
    monkeypatch.setattr(ray_session, "verbose", lambda: False)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.setenv(ray_session.SKIP_REGEX_VARIABLE, "my noise")
    ray_session.skip_ray_noise()
    # As Ray's log deduplicator applies it to each line its workers print (re.search).
    skip = re.compile(os.environ[ray_session.SKIP_REGEX_VARIABLE])
    assert skip.search("my noise here") and skip.search(PROGRESS_NOTICE)
    assert skip.search(WATCHER_ERROR)
    assert not any(skip.search(line) for line in KEPT)


def test_the_skip_regex_is_left_alone_when_verbose_or_too_late(monkeypatch) -> None:
    monkeypatch.delenv(ray_session.SKIP_REGEX_VARIABLE, raising=False)
    monkeypatch.setattr(ray_session, "verbose", lambda: True)  # raydiff -v
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    ray_session.skip_ray_noise()
    assert ray_session.SKIP_REGEX_VARIABLE not in os.environ
    monkeypatch.setattr(ray_session, "verbose", lambda: False)
    monkeypatch.setitem(sys.modules, "ray", SimpleNamespace())  # Ray has read its variables
    ray_session.skip_ray_noise()
    assert ray_session.SKIP_REGEX_VARIABLE not in os.environ


@pytest.fixture
def logger_state():
    """The levels and console filters quiet_ray_console changes, put back afterwards."""
    import ray.data  # noqa: F401  (its import sets up the ray.data logger's handlers)

    names = ["ray", "ray.tune", "ray.data", "tensorboardX"]
    levels = {name: logging.getLogger(name).level for name in names}
    handlers = list(logging.getLogger("ray.data").handlers)
    filters = {id(h): list(h.filters) for h in handlers}
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    for handler in handlers:
        handler.filters[:] = filters[id(handler)]


def test_a_quiet_console_hides_tensorboardx_renaming_tunes_metrics(
    logger_state, monkeypatch, caplog
) -> None:
    """A sweep over a classifier: Tune's TensorBoard callback writes val_acc@1, and tensorboardX
    says at INFO, for every metric at every report, that it renamed it."""
    from tensorboardX.summary import scalar

    caplog.set_level(logging.INFO)
    logging.getLogger("tensorboardX").setLevel(logging.NOTSET)
    scalar("ray/tune/val_acc@1", 0.5)
    assert "is illegal" in caplog.text  # what the user saw
    caplog.clear()
    monkeypatch.setattr(ray_session, "verbose", lambda: False)
    ray_session.quiet_ray_console()
    scalar("ray/tune/val_acc@1", 0.5)
    assert "is illegal" not in caplog.text


def test_a_quiet_console_filters_ray_datas_console_handler_once(logger_state, monkeypatch):
    monkeypatch.setattr(ray_session, "verbose", lambda: False)
    ray_session.quiet_ray_console()
    ray_session.quiet_ray_console()
    handlers = {type(h).__name__: h for h in logging.getLogger("ray.data").handlers}
    # Ray Data's console handler, and its log file's (ray-data.log keeps every line).
    for name, ours in (("PlainRayHandler", 1), ("SessionFileHandler", 0)):
        noise = [f for f in handlers[name].filters if isinstance(f, ray_session.RayNoiseFilter)]
        assert len(noise) == ours, name


def test_the_driver_decodes_validation_before_the_training_split(tiny_prepared, monkeypatch):
    """Ray Data's "does not have any available CPUs" alarm: the training split's cache ends in
    conversion tasks still running when it returns; no dataset may execute right after it."""
    from raydiff.data import pipeline
    from raydiff.data.cached_split import CachedSplit
    from raydiff.data.config import DataConfig

    decoded: list[str] = []

    def decode(manifest, *, split, config, file_shuffle):
        decoded.append(split)
        options = SimpleNamespace(preserve_order=False)
        return SimpleNamespace(
            materialize=lambda: dataset, context=SimpleNamespace(execution_options=options)
        )

    dataset = decode(None, split="", config=None, file_shuffle=None)
    decoded.clear()
    monkeypatch.setattr(pipeline, "_decode", decode)
    monkeypatch.setattr(CachedSplit, "from_dataset", lambda d: CachedSplit(blocks=[], num_rows=0))
    config = DataConfig(data_dir=str(tiny_prepared), image_size=8, channels=1)
    pipeline.build_datasets(config)
    pipeline.cache_splits(config, manifest=pipeline.load_manifest(config.data_dir))
    assert decoded == ["val", "train", "val", "train"]
