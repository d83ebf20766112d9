"""An upsampler's inputs are improved-diffusion's bit for bit: the same PNG images, through
raydiff's shards, decoding and scaling (both data paths' arithmetic) and ``low_res_of``, give the
large images and the low-resolution inputs that improved-diffusion's own ``load_superres_data``
(its super_res_train.py script) gave. The fixture comes from the reference code:
``python bench/make_reference_fixtures.py --super-res-inputs
tests/unit/fixtures/super_res_inputs.npz``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from raydiff.data import PrepareOptions, prepare_dataset
from raydiff.data.collate import normalise
from raydiff.data.in_memory import load_split_tensors, read_split_pixels
from raydiff.data.manifest import load_manifest
from raydiff.train.tasks.super_res import low_res_of

pytestmark = pytest.mark.unit

FIXTURE = Path(__file__).parent / "fixtures" / "super_res_inputs.npz"


def test_the_inputs_are_improved_diffusions_bit_for_bit(tmp_path):
    with np.load(FIXTURE) as fixture:
        images, large, low = fixture["images"], fixture["large"], fixture["low_res"]
    np.savez(tmp_path / "source.npz", images)
    data = tmp_path / "data"
    prepare_dataset(
        PrepareOptions(
            source=str(tmp_path / "source.npz"),
            out=str(data),
            image_size=16,
            channels=3,
            val_count=0,
            progress=False,
        )
    )
    pixels, _ = read_split_pixels(load_manifest(str(data)), "train")
    x, _, _ = load_split_tensors(str(data), "train")
    assert len(x) == len(images)
    # prepare shuffles the rows once: find each row's source image by its pixels.
    order = [next(i for i, image in enumerate(images) if np.array_equal(image, p)) for p in pixels]
    assert torch.equal(x, torch.from_numpy(large[order]))  # the in-memory path
    pipeline = torch.from_numpy(normalise(np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))))
    assert torch.equal(pipeline, x)  # the Ray Data path's arithmetic
    assert torch.equal(low_res_of(x, 4), torch.from_numpy(low[order]))
