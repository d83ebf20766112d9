"""Images/s through the Ray Data pipeline vs a plain DataLoader vs what the training step eats.

    python bench/data_ingest.py                   # everything (~6 min on 2 cores)
    python bench/data_ingest.py --sizes 32 --batches 100

For 32x32x1 and 64x64x3 images (Fashion-MNIST, prepared by ``raydiff prepare``):

* Ray Data: a real ``TorchTrainer`` with 1 and 2 workers (0.5 CPU each, the rest of a 4-CPU
  local cluster left to Ray Data), per-worker batch 64, for ``--batches`` batches after
  ``--warmup``: with the decoded dataset cached in the object store (``CachedSplit.batches``:
  this rank's rows of each global batch, flip, normalise) and streamed from the shards
  (``iterate_batches``: decode, normalise, flip, shuffle buffer).
* DataLoader: ``torch.utils.data.DataLoader`` over the same PNG files written out as an image
  folder, with the same decode, normalisation and flip, ``num_workers`` = cores (and 1, as in
  improved-diffusion), ``shuffle=True``, batch 64.
* Training step: images/s of one fp32 training step of the demo model (UNet 32 ch, mult 1,2,2,
  1 res block, attention at 8x8, batch 64) on 32x32x1, timed with raydiff.core in this process.

Prints a table and writes ``bench/results/data_ingest.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZES = {32: 1, 64: 3}  # image size -> channels


def prepare(size: int, *, work: Path, limit: int | None) -> Path:
    """Fashion-MNIST at ``size`` (cached in ``work`` between runs)."""
    from raydiff.data import PrepareOptions, load_manifest, prepare_dataset

    out = work / f"fashion-mnist-{size}x{SIZES[size]}-{limit or 'all'}"
    try:
        load_manifest(str(out))
        return out
    except FileNotFoundError:
        pass
    summary = prepare_dataset(
        PrepareOptions(
            source="fashion-mnist",
            out=str(out),
            image_size=size,
            channels=SIZES[size],
            limit=limit,
            overwrite=True,
            progress=False,
        )
    )
    print(f"  prepared {summary.manifest.num_images} images at {size} in {summary.seconds:.1f} s")
    return out


def ray_ingest(
    dataset: Path, *, size: int, num_workers: int, cache: bool, args: argparse.Namespace
) -> dict[str, Any]:
    """Per-worker images/s of ``iterate_batches`` under a real TorchTrainer."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from raydiff.data import DataConfig, build_datasets

    config = DataConfig(
        data_dir=str(dataset),
        image_size=size,
        channels=SIZES[size],
        class_cond=True,
        cache_max_bytes=(8 << 30) if cache else 0,
        val_split="",
    )
    started = time.perf_counter()
    datasets = build_datasets(config)
    build_seconds = time.perf_counter() - started
    from raydiff.data.cached_split import CachedSplit
    from raydiff.orchestrate.training_job import dataset_config

    cached = datasets.pop("train") if isinstance(datasets["train"], CachedSplit) else None
    out = Path(tempfile.mkdtemp(prefix="ingest-", dir=args.work))

    def loop(loop_config: dict) -> None:
        import json
        import time
        from pathlib import Path

        import ray.train

        from raydiff.data import DataConfig, iterate_batches

        data = DataConfig(**loop_config["data"])
        context = ray.train.get_context()
        rank, world_size = context.get_world_rank(), context.get_world_size()
        cached = loop_config["cached"]
        batches = (
            cached.batches(
                global_batch=loop_config["batch_size"] * world_size,
                config=data,
                rank=rank,
                world_size=world_size,
            )
            if cached is not None
            else iterate_batches(
                ray.train.get_dataset_shard("train"),
                batch_size=loop_config["batch_size"],
                config=data,
                rank=rank,
            )
        )
        for _ in range(loop_config["warmup"]):
            next(batches)
        # Ranks of a real run step in lockstep (DDP); start the clocks together too, or a rank
        # that finishes early stops pulling and the equal split holds the other one back.
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        start = time.perf_counter()
        images = 0
        for _ in range(loop_config["batches"]):
            _, batch = next(batches)
            images += batch["x"].shape[0]
        seconds = time.perf_counter() - start
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
        batches.close()
        Path(loop_config["out"], f"rank{rank}.json").write_text(
            json.dumps({"images": images, "seconds": seconds})
        )

    trainer = TorchTrainer(
        loop,
        train_loop_config={
            "data": dataclasses.asdict(config),
            "batch_size": args.batch_size,
            "warmup": args.warmup,
            "batches": args.batches,
            "out": str(out),
            "cached": cached,
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=num_workers, resources_per_worker={"CPU": 0.5}
        ),
        run_config=ray.train.RunConfig(
            name=f"ingest-{uuid.uuid4().hex[:8]}", storage_path=str(args.work / "ray-runs")
        ),
        datasets=datasets,
        dataset_config=dataset_config(config, split_train=cached is None),
    )
    trainer.fit()
    per_rank = [json.loads((out / f"rank{r}.json").read_text()) for r in range(num_workers)]
    rates = [r["images"] / r["seconds"] for r in per_rank]
    return {
        "per_worker_images_per_s": rates,
        "min_per_worker_images_per_s": min(rates),
        "total_images_per_s": sum(rates),
        "build_seconds": build_seconds,
    }


class PngFolder:
    """improved-diffusion's ImageDataset over PNG files, plus the same flip (torch Dataset)."""

    def __init__(self, files: list[str]) -> None:
        self.files = files

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        import numpy as np
        from PIL import Image

        with Image.open(self.files[i]) as image:
            array = np.asarray(image)
        if array.ndim == 2:
            array = array[:, :, None]
        x = array.transpose(2, 0, 1).astype(np.float32) / 127.5 - 1
        if np.random.random() < 0.5:
            x = np.ascontiguousarray(x[:, :, ::-1])
        label = int(os.path.basename(self.files[i]).split("_")[0])
        return x, label


def png_folder(dataset: Path) -> list[str]:
    """Write the train shards' PNGs as ``LABEL_INDEX.png`` files (once) and list them."""
    import pyarrow.parquet as pq

    from raydiff.data import load_manifest

    folder = dataset.with_name(dataset.name + "-png")
    if not folder.is_dir():
        folder.mkdir()
        for uri in load_manifest(str(dataset)).shard_uris("train"):
            table = pq.read_table(uri, columns=["label", "index", "png"])
            for label, index, png in zip(
                *(table[c].to_pylist() for c in table.column_names), strict=True
            ):
                (folder / f"{label}_{index:06d}.png").write_bytes(png)
    return sorted(str(p) for p in folder.iterdir())


def dataloader_ingest(files: list[str], *, num_workers: int, args: argparse.Namespace) -> float:
    """Images/s of a shuffled DataLoader over the PNG files, after warm-up."""
    from torch.utils.data import DataLoader

    loader = DataLoader(
        PngFolder(files),
        batch_size=args.batch_size,
        shuffle=True,
        num_workers=num_workers,
        drop_last=True,
        persistent_workers=num_workers > 0,
        prefetch_factor=4 if num_workers > 0 else None,
    )

    def forever():
        while True:
            yield from loader

    batches = forever()
    for _ in range(args.warmup):
        next(batches)
    start = time.perf_counter()
    images = sum(next(batches)[0].shape[0] for _ in range(args.batches))
    return images / (time.perf_counter() - start)


def training_step_rate(args: argparse.Namespace) -> tuple[float, str]:
    """Images/s of one fp32 training step of the demo model at batch 64 (32x32x1)."""
    import torch

    from raydiff.core import (
        GaussianDiffusion,
        LossType,
        ModelMeanType,
        ModelVarType,
        UNetModel,
        get_named_beta_schedule,
    )

    torch.manual_seed(0)
    model = UNetModel(
        image_size=32,
        in_channels=1,
        model_channels=32,
        out_channels=1,
        num_res_blocks=1,
        attention_resolutions=(4,),  # downsample rate 4 at 32 px: attention at 8x8
        dropout=0.0,
        channel_mult=(1, 2, 2),
        use_scale_shift_norm=True,
    )
    diffusion = GaussianDiffusion(
        betas=get_named_beta_schedule("cosine", 1000),
        model_mean_type=ModelMeanType.EPSILON,
        model_var_type=ModelVarType.FIXED_LARGE,
        loss_type=LossType.MSE,
        rescale_timesteps=True,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(64, 1, 32, 32)

    def step() -> None:
        t = torch.randint(0, 1000, (64,))
        loss = diffusion.training_losses(model, x, t)["loss"].mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(3):
        step()
    start = time.perf_counter()
    num_steps = args.train_steps
    for _ in range(num_steps):
        step()
    rate = num_steps * 64 / (time.perf_counter() - start)
    return (
        rate,
        f"measured: raydiff.core UNet fp32, {num_steps} steps, {torch.get_num_threads()} threads",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64], choices=sorted(SIZES))
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batch-size", type=int, default=64, help="per worker")
    parser.add_argument("--batches", type=int, default=300, help="timed batches per consumer")
    parser.add_argument("--warmup", type=int, default=20, help="untimed batches first")
    parser.add_argument("--limit-64", type=int, default=20000, help="images of the 64 px set")
    parser.add_argument("--train-steps", type=int, default=10)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "raydiff-bench")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "data_ingest.json")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1

    results: dict[str, Any] = {
        "machine": {"cores": cores, "platform": platform.platform()},
        "batch_size_per_worker": args.batch_size,
        "timed_batches": args.batches,
        "rows": [],
    }
    print("training step (demo config) ...", flush=True)
    step_rate, step_source = training_step_rate(args)
    results["training_step_images_per_s"] = step_rate
    results["training_step_source"] = step_source
    print(f"  {step_rate:.0f} images/s ({step_source})")

    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    import ray
    import ray.data

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    try:
        for size in args.sizes:
            dataset = prepare(size, work=args.work, limit=args.limit_64 if size == 64 else None)
            label = f"{size}x{size}x{SIZES[size]}"
            for cache in (True, False):
                for num_workers in args.workers:
                    print(
                        f"ray data {label} {'cached' if cache else 'streamed'} x{num_workers} ...",
                        flush=True,
                    )
                    row = ray_ingest(
                        dataset, size=size, num_workers=num_workers, cache=cache, args=args
                    )
                    row.update(
                        pipeline="ray-data",
                        image=label,
                        mode="cached" if cache else "streamed",
                        workers=num_workers,
                    )
                    results["rows"].append(row)
                    print(
                        f"  per worker {[round(r) for r in row['per_worker_images_per_s']]} img/s"
                    )
            files = png_folder(dataset)
            for num_workers in sorted({cores, 1}):
                print(f"dataloader {label} num_workers={num_workers} ...", flush=True)
                rate = dataloader_ingest(files, num_workers=num_workers, args=args)
                results["rows"].append(
                    {
                        "pipeline": "dataloader",
                        "image": label,
                        "mode": f"num_workers={num_workers}",
                        "workers": 1,
                        "per_worker_images_per_s": [rate],
                        "min_per_worker_images_per_s": rate,
                        "total_images_per_s": rate,
                    }
                )
                print(f"  {rate:.0f} img/s")
    finally:
        ray.shutdown()

    print()
    print(
        f"{'pipeline':<11} {'image':<9} {'mode':<14} {'workers':>7} {'min/worker':>11} {'total':>8} {'x step':>7}"
    )
    for row in results["rows"]:
        ratio = row["min_per_worker_images_per_s"] / step_rate
        print(
            f"{row['pipeline']:<11} {row['image']:<9} {row['mode']:<14} {row['workers']:>7} "
            f"{row['min_per_worker_images_per_s']:>11.0f} {row['total_images_per_s']:>8.0f} {ratio:>6.1f}x"
        )
    print(f"training step (32x32x1 demo, batch 64): {step_rate:.0f} images/s ({step_source})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
