"""Samples that depend only on (seed, index), and improved-diffusion's output conventions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_model import tiny_unet

from raydiff.config import DiffusionConfig
from raydiff.core import SuperResModel
from raydiff.factory import create_gaussian_diffusion
from raydiff.sample.generate import (
    generate,
    index_batches,
    sample_labels,
    to_uint8,
)
from raydiff.sample.outputs import npz_name, write_grid, write_npz, write_sampling_outputs
from raydiff.train.compilation import compile_static

pytestmark = pytest.mark.unit


def test_index_batches_are_fixed_whatever_the_workers():
    assert index_batches(10, 4) == [range(0, 4), range(4, 8), range(8, 10)]
    with pytest.raises(ValueError, match="num_samples=0"):
        index_batches(0, 4)


@pytest.mark.parametrize("respacing,use_ddim", [("10", False), ("ddim5", True)])
def test_a_sample_depends_on_its_seed_and_index_not_on_its_batch(respacing, use_ddim):
    model = tiny_unet()
    diffusion = create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=100, timestep_respacing=respacing)
    )

    def run(indices, seed=3):
        return generate(
            model, diffusion, indices=indices, image_shape=(1, 8, 8), seed=seed, use_ddim=use_ddim
        )

    whole = run(range(0, 4))
    assert whole.dtype == np.uint8 and whole.shape == (4, 8, 8, 1)
    # The same batch again (another worker, another time): the same bytes.
    np.testing.assert_array_equal(run(range(0, 4)), whole)
    # Other batch companions: the same sample up to float rounding of other batch shapes.
    halves = np.concatenate([run(range(0, 2)), run(range(2, 4))])
    assert np.abs(halves.astype(int) - whole.astype(int)).max() <= 1
    assert (halves == whole).mean() > 0.99
    # Another seed gives other samples.
    assert (run(range(0, 4), seed=4) != whole).mean() > 0.5


def test_labels_come_from_the_seed_or_from_the_list_in_turn():
    drawn = sample_labels(0, range(100), num_classes=10)
    np.testing.assert_array_equal(drawn, sample_labels(0, range(100), num_classes=10))
    np.testing.assert_array_equal(drawn[50:], sample_labels(0, range(50, 100), num_classes=10))
    assert set(drawn) == set(range(10))
    np.testing.assert_array_equal(
        sample_labels(0, range(3, 7), num_classes=10, class_labels=[1, 5]), [5, 1, 5, 1]
    )
    with pytest.raises(ValueError, match=r"class labels \[12\] are invalid"):
        sample_labels(0, range(4), num_classes=10, class_labels=[1, 12])


def test_class_conditional_samples_follow_their_labels():
    model = tiny_unet(num_classes=3)
    diffusion = create_gaussian_diffusion(DiffusionConfig(diffusion_steps=50))
    common = {"indices": range(2), "image_shape": (1, 8, 8), "seed": 0, "use_ddim": True}
    a = generate(model, diffusion, labels=np.array([0, 0]), **common)
    b = generate(model, diffusion, labels=np.array([0, 2]), **common)
    np.testing.assert_array_equal(a[0], b[0])
    assert (a[1] != b[1]).any()


def test_an_unconditional_upsampler_upsamples_labelled_images_without_their_labels():
    """Labels carried from a class-conditional base model's samples (arr_1) do not reach an
    unconditional upsampler; its low-resolution input does."""
    model = tiny_unet(network=SuperResModel)
    diffusion = create_gaussian_diffusion(DiffusionConfig(diffusion_steps=50))
    common = {"indices": range(2), "image_shape": (1, 8, 8), "seed": 0, "use_ddim": True}
    low_res = torch.linspace(-1, 1, 2 * 16).reshape(2, 1, 4, 4)
    labelled = generate(model, diffusion, low_res=low_res, labels=np.array([3, 5]), **common)
    np.testing.assert_array_equal(labelled, generate(model, diffusion, low_res=low_res, **common))
    assert (labelled != generate(model, diffusion, low_res=-low_res, **common)).any()


def test_uint8_conversion_truncates_like_improved_diffusion():
    x = torch.tensor([-1.0, -0.999, 0.0, 0.999, 1.0, 2.0]).view(1, 1, 1, 6)
    assert to_uint8(x).ravel().tolist() == [0, 0, 127, 254, 255, 255]


def test_npz_pngs_and_grid_follow_improved_diffusions_layout(tmp_path):
    rng = np.random.default_rng(0)
    samples = rng.integers(0, 256, (5, 8, 8, 3), dtype=np.uint8)
    labels = np.array([0, 1, 2, 3, 4])
    path = write_npz(samples, tmp_path, labels=labels)
    assert path.name == npz_name(samples) == "samples_5x8x8x3.npz"
    with np.load(path) as data:
        assert sorted(data.files) == ["arr_0", "arr_1"]
        np.testing.assert_array_equal(data["arr_0"], samples)
        np.testing.assert_array_equal(data["arr_1"], labels)
    assert not list(tmp_path.glob("*.tmp*"))
    write_sampling_outputs(samples, tmp_path / "out", labels=None, record={})
    pngs = sorted((tmp_path / "out" / "images").iterdir())
    assert [p.name for p in pngs][:2] == ["sample_000000.png", "sample_000001.png"]
    np.testing.assert_array_equal(np.asarray(Image.open(pngs[1])), samples[1])
    grid = np.asarray(Image.open(write_grid(samples, tmp_path / "grid.png")))
    assert grid.shape == (2 + 2 * 10, 2 + 3 * 10, 3)  # 3 columns, 2 rows, 2 px padding
    with pytest.raises(ValueError, match="uint8"):
        write_npz(samples.astype(np.float32), tmp_path)


def test_a_compiled_model_draws_the_eager_samples_and_compiles_once_per_batch_size():
    """``--compile`` keeps sample i a function of (seed, i). The graphs are counted by a
    ``torch.compile`` backend that runs them as traced (inductor's numerics on the CPU are
    tests/e2e/test_compile.py's): batches of one size reuse one compile."""
    graphs = []

    def counting(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    model = tiny_unet()
    diffusion = create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=100, timestep_respacing="5")
    )
    compiled = compile_static(model)

    def run(net, indices):
        return generate(net, diffusion, indices=indices, image_shape=(1, 8, 8), seed=3)

    try:
        with torch.compiler.set_stance("default", force_backend=counting):
            first = run(compiled, range(0, 4))
            after_first = len(graphs)
            second = run(compiled, range(4, 8))
            assert after_first > 0 and len(graphs) == after_first
            np.testing.assert_array_equal(first, run(model, range(0, 4)))
            np.testing.assert_array_equal(second, run(model, range(4, 8)))
    finally:
        torch.compiler.reset()
