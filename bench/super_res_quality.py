"""Super-resolution at the large size, measured on this machine: Fréchet distance, precision and
recall (k = 3) in a clean raydiff classifier's features against the test split, for a cascade and
what it is compared with. The super-resolution table of docs/results.md comes from it.

Rows (``--num-samples`` images each, seed 0, every sampling run on Ray actors through
``raydiff sample``'s code, every measure through ``raydiff evaluate fid --features``'s):

* ``cascade``: the small base model's samples (``--base``) upsampled by ``--upsampler``, in one
  ``raydiff sample --checkpoint BASE --upsampler UPSAMPLER`` run;
* ``base, bicubic``: the same base samples enlarged bicubically (PIL's ``BICUBIC``, what
  ``raydiff prepare`` resizes with);
* ``val images, upsampler`` and ``val images, bicubic``: the val split's images shrunk to the
  upsampler's input size as its training shrank them (``F.interpolate(mode="area")``, then
  converted to uint8 as ``raydiff sample`` writes its images), upsampled by the upsampler (``--low-res``) or
  bicubically: what each upsampling does given real inputs, apart from the base model;
* ``direct`` (with ``--direct``): a base model trained at the large size, sampled the same way.

Every setting uses the same sampler (``--respacing``/``--use-ddim``) for every stage.

    python bench/super_res_quality.py --base runs/base_8px/checkpoint_000450 \\
        --upsampler runs/upsampler_demo/checkpoint_000450 \\
        --direct runs/demo/checkpoint_000450 --evaluator runs/evaluator_demo/checkpoint_002000

Prints one markdown table row per setting and writes them all to ``--out/results.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def sample(args: argparse.Namespace, out: Path, **options: Any) -> float:
    """One ``raydiff sample`` run into ``out``; its samples per second (of the last stage)."""
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions

    sampled = run_sampling(
        SampleOptions(
            num_samples=args.num_samples,
            out=str(out),
            timestep_respacing=args.respacing,
            use_ddim=args.use_ddim,
            batch_size=args.batch_size,
            num_workers=args.num_workers,
            seed=0,
            **options,
        )
    )
    return sampled.samples_per_s


def npz_in(folder: Path) -> Path:
    (found,) = sorted(folder.glob("samples_*.npz"))
    return found


def bicubic(source: Path, size: int, out: Path) -> Path:
    """``source``'s images (and labels) enlarged to ``size`` as ``raydiff prepare`` resizes
    (a square image grows by one PIL BICUBIC resize), as an npz."""
    from PIL import Image

    from raydiff.data.resize import resize_center_crop
    from raydiff.sample.outputs import write_npz

    with np.load(source) as data:
        images = data["arr_0"]
        labels = data["arr_1"] if "arr_1" in data.files else None
    channels = images.shape[-1]
    enlarged = np.stack(
        [
            np.asarray(
                resize_center_crop(
                    Image.fromarray(image[..., 0] if channels == 1 else image), image_size=size
                )
            ).reshape(size, size, channels)
            for image in images
        ]
    )
    return write_npz(enlarged, out, labels=labels)


def val_low_res(args: argparse.Namespace, small_size: int, out: Path) -> Path:
    """The val images shrunk as an upsampler's training shrinks them, as a samples npz (uint8
    as raydiff sample writes its images)."""
    from raydiff.data.in_memory import load_split_tensors
    from raydiff.sample.generate import to_uint8
    from raydiff.sample.outputs import write_npz
    from raydiff.train.tasks.super_res import low_res_of

    images, labels, _ = load_split_tensors(args.reference, "val", limit=args.num_samples)
    small = to_uint8(low_res_of(images, small_size))
    return write_npz(small, out, labels=None if labels is None else labels.numpy())


def measure(args: argparse.Namespace, samples: Path) -> dict[str, float]:
    from raydiff.evaluate.samples_fid import run_fid

    summary = run_fid(
        samples=str(samples), reference=args.reference, split=args.split, features=args.evaluator
    ).summary
    return {k: summary[k] for k in ("fd_classifier", "precision_classifier", "recall_classifier")}


def settings(args: argparse.Namespace, small_size: int) -> dict[str, Callable[[], tuple]]:
    """Each row's name and how its images are made: ``() -> (samples, samples_per_s)``."""
    out: Path = args.out
    large = args.large_size

    def cascade() -> tuple[Path, float | None]:
        rate = sample(
            args,
            out / "cascade",
            checkpoint=args.base,
            upsampler=args.upsampler,
            upsampler_respacing=args.respacing,
            upsampler_use_ddim=args.use_ddim,
        )
        return out / "cascade" / "upsampled", rate

    def base_bicubic() -> tuple[Path, float | None]:
        return bicubic(npz_in(out / "cascade" / "base"), large, out / "base_bicubic"), None

    def val_upsampler() -> tuple[Path, float | None]:
        low_res = val_low_res(args, small_size, out / "val_low_res")
        rate = sample(args, out / "val_upsampled", checkpoint=args.upsampler, low_res=str(low_res))
        return out / "val_upsampled", rate

    def val_bicubic() -> tuple[Path, float | None]:
        return bicubic(npz_in(out / "val_low_res"), large, out / "val_bicubic"), None

    rows = {
        "cascade": cascade,
        "base, bicubic": base_bicubic,
        "val images, upsampler": val_upsampler,
        "val images, bicubic": val_bicubic,
    }
    if args.direct:
        rows["direct"] = lambda: (
            out / "direct",
            sample(args, out / "direct", checkpoint=args.direct),
        )
    return rows


def main() -> None:
    from raydiff.sample.load import load_sampling_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the small base model's checkpoint")
    parser.add_argument("--upsampler", required=True, help="the upsampler's checkpoint")
    parser.add_argument("--direct", default=None, help="a base model at the large size")
    parser.add_argument("--evaluator", required=True, help="a clean classifier checkpoint")
    parser.add_argument("--respacing", default="ddim25", help="every stage's respacing")
    parser.add_argument("--use-ddim", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--num-samples", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--reference", default="data/fashion-mnist", help="prepared dataset")
    parser.add_argument("--split", default="test")
    parser.add_argument("--out", type=Path, default=Path("runs/super_res_quality"))
    args = parser.parse_args()
    if args.out.exists() and any(args.out.iterdir()):
        parser.error(f"--out {args.out} is not empty")
    upsampler = load_sampling_model(args.upsampler, task="super_res").config
    args.large_size = upsampler.model.image_size
    rows = []
    print("| images | FD (classifier) | precision | recall | samples/s | seconds |", flush=True)
    for name, make in settings(args, upsampler.super_res.small_size).items():
        started = time.perf_counter()
        samples, rate = make()
        row = {"images": name, **measure(args, samples), "samples_per_s": rate}
        row["seconds"] = time.perf_counter() - started
        rows.append(row)
        print(
            f"| {name} | {row['fd_classifier']:.2f} | {row['precision_classifier']:.3f} | "
            f"{row['recall_classifier']:.3f} | {'-' if rate is None else f'{rate:.2f}'} | "
            f"{row['seconds']:.0f} |",
            flush=True,
        )
    arguments = {k: str(v) for k, v in vars(args).items()}
    (args.out / "results.json").write_text(
        json.dumps({"arguments": arguments, "rows": rows}, indent=2)
    )


if __name__ == "__main__":
    main()
