"""Ray Data pipeline on a real local cluster: decode, cache/stream, reshuffle, 2-worker split."""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from raydiff.data import DataConfig, build_datasets, iterate_batches, load_manifest
from raydiff.data.cached_split import CachedSplit
from raydiff.data.order import flip_mask


def _config(tiny_dataset: Any, **overrides: object) -> DataConfig:
    values: dict[str, object] = {
        "data_dir": str(tiny_dataset.path),
        "image_size": tiny_dataset.image_size,
        "channels": tiny_dataset.channels,
        # Small decode batches keep the tiny_dataset dataset in ~18 blocks, so block order is visible.
        "decode_batch_size": 16,
        "prefetch_batches": 2,
    }
    values.update(overrides)
    return DataConfig(**values)  # type: ignore[arg-type]


def train_batches(train: Any, **kwargs: Any) -> Any:
    """One worker's batches of a training split, cached (one global order) or streamed."""
    if isinstance(train, CachedSplit):
        return train.batches(global_batch=kwargs.pop("batch_size"), **kwargs)
    return iterate_batches(train, **kwargs)


def _epoch_orders(config: DataConfig, *, num_epochs: int = 3) -> list[list[int]]:
    """Row indices in the order one consumer sees them, per epoch, from a fresh dataset."""
    train = build_datasets(config)["train"]
    orders: list[list[int]] = [[] for _ in range(num_epochs)]
    for epoch, batch in train_batches(train, batch_size=16, config=config, num_epochs=num_epochs):
        orders[epoch].extend(batch["index"].tolist())
    return orders


def test_mismatched_manifest_is_refused_before_any_work(tiny_dataset: Any) -> None:
    # No ray_cluster fixture: the check must come before anything touches Ray.
    with pytest.raises(ValueError, match="image_size mismatch: the model expects 32"):
        build_datasets(_config(tiny_dataset, image_size=32))
    with pytest.raises(ValueError, match="channels mismatch"):
        build_datasets(_config(tiny_dataset, channels=3))


def test_skip_batches_continues_inside_the_first_epoch(
    ray_cluster: None, tiny_dataset: Any
) -> None:
    # What a run resumed mid-epoch sees: the same epoch from its position on, then the next ones.
    config = _config(tiny_dataset, shuffle_buffer_size=64)
    full = _epoch_orders(config, num_epochs=2)
    train = build_datasets(config)["train"]
    resumed: list[list[int]] = [[], []]
    for epoch, batch in train_batches(
        train, batch_size=16, config=config, num_epochs=2, skip_batches=5
    ):
        resumed[epoch].extend(batch["index"].tolist())
    assert resumed[0] == full[0][5 * 16 :]
    assert resumed[1] == full[1]
    with pytest.raises(ValueError, match="skip_batches=-1 is invalid"):
        next(train_batches(train, batch_size=16, config=config, skip_batches=-1))


@pytest.mark.parametrize("cache_max_bytes", [1 << 30, 0], ids=["cached", "streamed"])
def test_a_run_resumed_in_a_later_epoch_sees_that_epochs_order(
    ray_cluster: None, tiny_dataset: Any, cache_max_bytes: int
) -> None:
    # The driver of a run resumed in epoch 2 builds a new dataset with epoch_offset=2; its first
    # execution must be the uninterrupted run's epoch 2, or skip_batches drops the wrong rows.
    config = _config(tiny_dataset, cache_max_bytes=cache_max_bytes, shuffle_buffer_size=64)
    full = _epoch_orders(config, num_epochs=4)
    train = build_datasets(config, epoch_offset=2)["train"]
    resumed: list[list[int]] = [[], []]
    for epoch, batch in train_batches(
        train, batch_size=16, config=config, epoch_start=2, num_epochs=2, skip_batches=5
    ):
        resumed[epoch - 2].extend(batch["index"].tolist())
    assert resumed[0] == full[2][5 * 16 :]
    assert resumed[1] == full[3]


def test_a_ray_whose_execution_counter_changed_is_refused(
    ray_cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # raydiff.data.order.start_block_order_at moves Ray Data's private per-dataset execution
    # counter for a resumed run; a Ray where it is gone or no longer counts executions must stop
    # the run, naming the version, instead of silently giving it another epoch's order.
    import types

    import ray
    from ray.data._internal.execution.callbacks import execution_idx_update_callback

    from raydiff.data.order import _check_ray_block_order, start_block_order_at

    _check_ray_block_order.__wrapped__()  # this Ray passes (uncached: the probe really runs)
    no_counter = types.SimpleNamespace(context=types.SimpleNamespace())
    with pytest.raises(RuntimeError, match=rf"Ray {ray.__version__}: .*counter is missing"):
        start_block_order_at(no_counter, epoch=1)  # type: ignore[arg-type]
    # A Ray that keeps the attribute but stops counting executions with it.
    monkeypatch.setattr(
        execution_idx_update_callback.ExecutionIdxUpdateCallback,
        "after_execution_succeeds",
        lambda self, executor: None,
    )
    with pytest.raises(
        RuntimeError, match=rf"Ray {ray.__version__}: .*same block order.*>=2\.60,<2\.61"
    ):
        _check_ray_block_order.__wrapped__()


@pytest.mark.parametrize("cache_max_bytes", [1 << 30, 0], ids=["cached", "streamed"])
def test_reshuffle_per_epoch_and_seed_reproduces(
    ray_cluster: None, tiny_dataset: Any, cache_max_bytes: int
) -> None:
    # Block/file order alone (no shuffle buffer), then with the buffer.
    for buffer in (0, 64):
        config = _config(tiny_dataset, cache_max_bytes=cache_max_bytes, shuffle_buffer_size=buffer)
        first = _epoch_orders(config)
        assert all(
            sorted(order) == list(range(tiny_dataset.num_train)) for order in first
        )  # full epochs
        assert first[0] != first[1] and first[1] != first[2], "order did not change per epoch"
        assert _epoch_orders(config) == first, "the same seed gave a different order"
        assert _epoch_orders(dataclasses.replace(config, seed=1)) != first


def test_batches_are_normalised_flipped_and_labelled(ray_cluster: None, tiny_dataset: Any) -> None:
    config = _config(tiny_dataset, class_cond=True, shuffle_buffer_size=0)
    plain = dataclasses.replace(config, random_flip=False)
    unflipped = {}
    for _, batch in train_batches(
        build_datasets(plain)["train"], batch_size=16, config=plain, num_epochs=1
    ):
        for i, x in zip(batch["index"].tolist(), batch["x"], strict=True):
            unflipped[i] = x
    assert len(unflipped) == tiny_dataset.num_train

    train = build_datasets(config)["train"]
    num_flipped = 0
    for epoch, batch in train_batches(train, batch_size=16, config=config, num_epochs=2):
        x, y, index = batch["x"], batch["y"], batch["index"]
        assert x.shape == (
            16,
            tiny_dataset.channels,
            tiny_dataset.image_size,
            tiny_dataset.image_size,
        )
        assert str(x.dtype) == "torch.float32" and str(y.dtype) == "torch.int64"
        assert float(x.min()) >= -1.0 and float(x.max()) <= 1.0
        flips = flip_mask(index.numpy(), seed=config.seed, epoch=epoch)
        for row, flip, i, label in zip(x, flips, index.tolist(), y.tolist(), strict=True):
            expected = unflipped[i].flip(-1) if flip else unflipped[i]
            assert bool((row == expected).all())
            # pixel (0, 0) of the unflipped image holds the class id (see tiny_dataset)
            assert round((float(unflipped[i][0, 0, 0]) + 1) * 127.5) == label
            num_flipped += int(flip)
    assert 0.3 < num_flipped / (2 * tiny_dataset.num_train) < 0.7


def test_validation_iterates_once_in_order_unflipped(ray_cluster: None, tiny_dataset: Any) -> None:
    config = _config(tiny_dataset)
    val = build_datasets(config)["val"]
    batches = list(iterate_batches(val, batch_size=10, config=config, train=False, with_keys=True))
    assert [len(b["x"]) for _, b in batches] == [10, 10, 10, 2]  # nothing dropped
    assert [b["index"].tolist() for _, b in batches] == [
        list(range(s, min(s + 10, tiny_dataset.num_val)))
        for s in range(0, tiny_dataset.num_val, 10)
    ]


def _run_two_workers(tiny_dataset: Any, storage: Path, out: Path) -> dict[int, dict]:
    """A real TorchTrainer with 2 workers (batches of 16 each), handed the datasets as a training
    run hands them out; each reads the training split both ways, streamed (Ray Train's shard of
    the ``train`` dataset) and cached (the ``CachedSplit`` object, which every worker gets
    whole), and writes the keys it saw per epoch to ``out``."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from raydiff.orchestrate.training_job import dataset_config

    config = _config(tiny_dataset, class_cond=True, cache_max_bytes=0)
    datasets = build_datasets(config)  # streamed: train and val are Ray Datasets
    cached = build_datasets(_config(tiny_dataset, class_cond=True))["train"]
    assert isinstance(cached, CachedSplit)

    def loop(loop_config: dict) -> None:
        import json
        from pathlib import Path

        import ray.train

        from raydiff.data import DataConfig, iterate_batches

        data = DataConfig(**loop_config["data"])
        rank = ray.train.get_context().get_world_rank()
        seen: dict[str, dict[str, list[str]] | list[str]] = {"cached": {}, "streamed": {}}
        ways = {
            "cached": loop_config["cached"].batches(
                global_batch=32, config=data, rank=rank, world_size=2, num_epochs=2, with_keys=True
            ),
            "streamed": iterate_batches(
                ray.train.get_dataset_shard("train"),
                batch_size=16,
                config=data,
                rank=rank,
                num_epochs=2,
                with_keys=True,
            ),
        }
        for way, batches in ways.items():
            for epoch, batch in batches:
                assert batch["y"].shape == (16,)
                seen[way].setdefault(str(epoch), []).extend(batch["key"])
        val_shard = ray.train.get_dataset_shard("val")
        seen["val"] = [
            key
            for _, batch in iterate_batches(
                val_shard, batch_size=16, config=data, rank=rank, train=False, with_keys=True
            )
            for key in batch["key"]
        ]
        Path(loop_config["out"], f"rank{rank}.json").write_text(json.dumps(seen))

    out.mkdir(parents=True)
    trainer = TorchTrainer(
        loop,
        train_loop_config={"data": dataclasses.asdict(config), "out": str(out), "cached": cached},
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(
            name=f"split-{uuid.uuid4().hex[:8]}", storage_path=str(storage)
        ),
        datasets=datasets,
        dataset_config=dataset_config(config, split_train=True),
    )
    trainer.fit()
    return {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)}


def test_two_workers_get_disjoint_shards_covering_each_epoch(
    ray_cluster: None, tiny_dataset: Any, tmp_path: Path
) -> None:
    manifest = load_manifest(str(tiny_dataset.path))
    assert manifest.num_classes == tiny_dataset.num_classes
    import pyarrow.parquet as pq

    all_keys = {
        split: {
            k for uri in manifest.shard_uris(split) for k in pq.read_table(uri)["key"].to_pylist()
        }
        for split in ("train", "val")
    }
    run = functools.partial(_run_two_workers, tiny_dataset)
    seen = run(tmp_path / "storage", tmp_path / "run1")
    for way in ("cached", "streamed"):
        for epoch in ("0", "1"):
            rank0, rank1 = seen[0][way][epoch], seen[1][way][epoch]
            assert len(rank0) == len(rank1) == len(all_keys["train"]) // 2, way  # equal split
            assert not set(rank0) & set(rank1), way  # disjoint
            assert set(rank0) | set(rank1) == all_keys["train"], way  # together one epoch
        for rank in (0, 1):
            assert seen[rank][way]["0"] != seen[rank][way]["1"], f"{way} rank {rank}: same order"
    # The val split is not split: every rank reads all of it, in the same order (each then
    # evaluates its own slice of those rows).
    assert seen[0]["val"] == seen[1]["val"] and set(seen[0]["val"]) == all_keys["val"]
    assert len(seen[0]["val"]) == len(all_keys["val"])

    # Cached: each global batch is rank 0's 16 rows then rank 1's, of one order per epoch;
    # one worker reading the same split with the global batch sees the same batches.
    split = build_datasets(_config(tiny_dataset, class_cond=True))["train"]
    config = _config(tiny_dataset, class_cond=True)
    for epoch, keys in _global_keys(split, config).items():
        halves = [seen[rank]["cached"][str(epoch)] for rank in (0, 1)]
        merged = [k for i in range(0, len(halves[0]), 16) for h in halves for k in h[i : i + 16]]
        assert merged == keys
    # Streamed, deterministic=True: a second run with the same seed sees exactly the same
    # stream per rank.
    assert run(tmp_path / "storage", tmp_path / "run2") == seen


def _global_keys(split: CachedSplit, config: DataConfig) -> dict[int, list[str]]:
    keys: dict[int, list[str]] = {}
    for epoch, batch in split.batches(global_batch=32, config=config, num_epochs=2, with_keys=True):
        keys.setdefault(epoch, []).extend(batch["key"])
    return keys


def test_a_streamed_split_resumed_on_another_worker_count_keeps_its_position(
    ray_cluster: None, tiny_dataset: Any
) -> None:
    # The streamed guarantee (raydiff.data.pipeline): a run of global batch 16 that trained 5
    # batches of epoch 0 on one worker continues on 2 workers with the rest of the epoch's
    # batches (13 of 18, the rows not necessarily the ones left), then full passes.
    from concurrent.futures import ThreadPoolExecutor

    config = _config(tiny_dataset, cache_max_bytes=0, shuffle_buffer_size=64)
    shards = build_datasets(config)["train"].streaming_split(2, equal=True)

    def read(rank: int) -> list[tuple[int, list[int]]]:
        return [
            (epoch, batch["index"].tolist())
            for epoch, batch in iterate_batches(
                shards[rank], batch_size=8, config=config, rank=rank, num_epochs=2, skip_batches=5
            )
        ]

    with ThreadPoolExecutor(2) as pool:  # the two shards are read at once, as two workers do
        ranks = list(pool.map(read, (0, 1)))
    for rank_batches in ranks:
        assert [epoch for epoch, _ in rank_batches] == [0] * 13 + [1] * 18
    epoch1 = [i for rank_batches in ranks for e, rows in rank_batches if e == 1 for i in rows]
    assert sorted(epoch1) == list(range(tiny_dataset.num_train))  # a full pass, each row once
    epoch0 = [i for rank_batches in ranks for e, rows in rank_batches if e == 0 for i in rows]
    assert len(epoch0) == len(set(epoch0)) == 13 * 16
