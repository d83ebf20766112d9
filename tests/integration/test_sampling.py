"""``raydiff sample`` on the shared local cluster: the same images on 1 and 2 workers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from raydiff.config import config_from_flags, to_dict
from raydiff.factory import create_model
from raydiff.sample.load import parse_model_flags
from raydiff.train.checkpoint import save_checkpoint

pytestmark = pytest.mark.integration

FLAGS = (
    "--image_size 8 --num_channels 32 --channel_mult 1,2 --num_res_blocks 1 "
    "--attention_resolutions '' --diffusion_steps 50 --class_cond True"
)


@pytest.fixture
def checkpoint(tmp_path):
    """A tiny class-conditional checkpoint whose layers are all non-zero (a fresh UNet's
    zero-initialised layers would make every sample the same function of its noise alone)."""
    config = config_from_flags(parse_model_flags(FLAGS))
    torch.manual_seed(0)
    model = create_model(config.model, learn_sigma=False)
    with torch.no_grad():
        for param in model.parameters():
            if not param.any():
                param.normal_(std=0.05)
    state = model.state_dict()
    return save_checkpoint(
        tmp_path / "run",
        10,
        model_state=state,
        ema_states={0.9999: state},
        trainer_state={"step": 10},
        config=to_dict(config),
    )


@pytest.mark.parametrize("precision,used", [("auto", "fp32"), ("bf16", "bf16")])
def test_samples_are_the_same_on_one_and_two_workers(
    ray_cluster, checkpoint, tmp_path, precision, used
):
    """In each precision (``--precision auto`` is fp32 on CPU actors), which sampling.json
    records as used."""
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions

    def run(workers: int, batch_size: int = 4):
        options = SampleOptions(
            checkpoint=str(checkpoint),
            num_samples=10,
            out=str(tmp_path / f"out{workers}_{batch_size}"),
            timestep_respacing="ddim10",
            use_ddim=True,
            batch_size=batch_size,
            num_workers=workers,
            seed=5,
            precision=precision,
        )
        result = run_sampling(options)
        with np.load(result.npz) as data:
            return result, data["arr_0"], data["arr_1"]

    one, images1, labels1 = run(1)
    two, images2, labels2 = run(2)
    assert one.npz.name == "samples_10x8x8x3.npz"
    assert images1.dtype == np.uint8 and images1.shape == (10, 8, 8, 3)
    np.testing.assert_array_equal(images1, images2)
    np.testing.assert_array_equal(labels1, labels2)
    assert labels1.dtype == np.int64 and set(labels1) <= set(range(1000))  # NUM_CLASSES
    assert len(list((tmp_path / "out2_4" / "images").glob("sample_*.png"))) == 10
    assert two.grid.is_file() and two.samples_per_s > 0
    record = json.loads((tmp_path / "out2_4" / "sampling.json").read_text())
    assert record["precision"] == used and record["batch_size"] == 4
    if precision == "auto":
        # --batch-size 0 on CPU actors: the default batch, capped by a worker's share (5 -> 8).
        run(2, batch_size=0)
        assert json.loads((tmp_path / "out2_0" / "sampling.json").read_text())["batch_size"] == 8


def test_sigterm_while_sampling_stops_it_as_ctrl_c_does(
    ray_cluster, checkpoint, tmp_path, monkeypatch
):
    """SIGTERM to the driver while its actors sample (a pod being stopped): a
    RunInterruptedError saying how far it got (``raydiff sample`` exits 143 with it), not Ray's
    C++ stack trace and an abort; nothing is written, and SIGTERM's handler is put back. The
    signal is sent by the progress bar when the first batch arrives."""
    import os
    import signal
    import time

    from raydiff.errors import RunInterruptedError
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions

    class SigtermOnFirstBatch:
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def update(self, n):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler runs at once; the sleep only bounds a miss

    monkeypatch.setattr("tqdm.auto.tqdm", SigtermOnFirstBatch)
    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "out"
    options = SampleOptions(
        checkpoint=str(checkpoint),
        num_samples=40,
        out=str(out),
        timestep_respacing="ddim10",
        use_ddim=True,
        batch_size=4,
        num_workers=1,
        seed=5,
    )
    # As in `raydiff sample`, Python's own SIGINT handler: tests of this process that call
    # TorchTrainer.fit directly leave Ray Train's installed.
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(RunInterruptedError, match="stopped by SIGTERM after 4 of 40 images"):
            run_sampling(options)
    finally:
        signal.signal(signal.SIGINT, previous_sigint)
    assert not out.exists()
    after = signal.getsignal(signal.SIGTERM)
    assert after == (before if before is not None else signal.SIG_DFL)


def test_a_trained_classifier_guides_the_same_on_one_and_two_workers(
    ray_cluster, tiny_dataset, tmp_path
):
    """``raydiff train-classifier``'s run on 2 Ray Train workers (labels through Ray Data,
    validation accuracy on the val split), then its checkpoint guides an unconditional model:
    the same images and labels on 1 and 2 sampling workers, and not those of unguided
    sampling.

    The run asks for 1000 val images, the classifier presets' figure, of a val split of 32: it
    evaluates the 32 there are, 16 on each worker (before, the 1000 were cut into 500 per rank,
    rank 1 got none and its empty totals broke the all-reduce at the first evaluation)."""
    from tiny_model import tiny_classifier

    from raydiff.config import ExperimentConfig, apply_overrides
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.orchestrate.training_job import run_training_job
    from raydiff.sample.options import SampleOptions

    def counting_val_images(config: ExperimentConfig, *, runtime: object) -> object:
        """The classifier task, reporting also how many images its metrics were computed on
        (the totals' ``count``, summed over ranks). A local function: Ray pickles it by value
        to the workers, which do not import the tests."""
        from raydiff.train.tasks import task_of_config

        task = task_of_config(config, runtime=runtime)
        metrics = task.evaluation_metrics
        task.evaluation_metrics = lambda totals: {
            **metrics(totals),
            "val_images": float(totals["count"]),
        }
        return task

    config = apply_overrides(
        ExperimentConfig(),
        [
            *tiny_classifier(image_size=16),
            "diffusion.diffusion_steps=50",
            "train.batch_size=8",
            "train.max_steps=4",
            "train.log_interval=2",
            "train.save_interval=4",
            "train.eval_num_images=1000",  # more than the 32 there are
            "scaling.num_workers=2",
            "scaling.cpus_per_worker=0.5",
            f"data.data_dir={tiny_dataset.path}",
        ],
    )
    out = tmp_path / "classifier"
    result = run_training_job(config, output_dir=out, make_task=counting_val_images)
    assert result["step"] == 4 and 0 <= result["val_acc@1"] <= result["val_acc@5"] <= 1
    assert result["val_images"] == tiny_dataset.num_val
    assert {"acc@1", "acc@1_q0", "val_acc@1_t0", "val_loss"} <= set(result)
    classifier = tmp_path / "classifier" / "checkpoint_000004"

    model = config_from_flags(
        parse_model_flags(
            "--image_size 16 --in_channels 1 --num_channels 32 --channel_mult 1,2 "
            "--num_res_blocks 1 --attention_resolutions '' --diffusion_steps 50"
        )
    )
    torch.manual_seed(0)
    net = create_model(model.model, learn_sigma=False)
    state = net.state_dict()
    unconditional = save_checkpoint(
        tmp_path / "model",
        1,
        model_state=state,
        ema_states={},
        trainer_state={"step": 1},
        config=to_dict(model),
    )

    def run(workers: int, scale: float):
        options = SampleOptions(
            checkpoint=str(unconditional),
            num_samples=6,
            out=str(tmp_path / f"out{workers}-{scale}"),
            timestep_respacing="10",
            batch_size=4,
            num_workers=workers,
            seed=3,
            classifier=str(classifier),
            classifier_scale=scale,
        )
        with np.load(run_sampling(options).npz) as data:
            return data["arr_0"], data["arr_1"]

    images1, labels1 = run(1, 20.0)
    images2, labels2 = run(2, 20.0)
    np.testing.assert_array_equal(images1, images2)
    np.testing.assert_array_equal(labels1, labels2)
    assert set(labels1) <= set(range(10))
    # The actors' samples are the library's guided ones, which unguided sampling does not give.
    from raydiff.config import DiffusionConfig
    from raydiff.factory import create_gaussian_diffusion
    from raydiff.sample.classifier import classifier_cond_fn, load_classifier
    from raydiff.sample.generate import generate

    diffusion = create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=50, noise_schedule="linear", timestep_respacing="10")
    )
    guide = load_classifier(classifier).network

    def in_process(cond_fn):
        return generate(
            net.eval(),
            diffusion,
            indices=range(6),
            image_shape=(1, 16, 16),
            seed=3,
            labels=labels1,
            cond_fn=cond_fn,
        )

    np.testing.assert_array_equal(in_process(classifier_cond_fn(guide, scale=20.0)), images1)
    assert not np.array_equal(in_process(None), images1)


def _tiny_checkpoint(folder, *overrides: str):
    """A checkpoint of the tiny UNet (an upsampler with ``train.task=super_res``) whose layers
    are all non-zero, and its config."""
    from tiny_model import tiny_model

    from raydiff.config import ExperimentConfig, apply_overrides

    config = apply_overrides(
        ExperimentConfig(), [*tiny_model(), "diffusion.diffusion_steps=50", *overrides]
    )
    torch.manual_seed(0)
    net = create_model(config.model, learn_sigma=False, super_res=config.train.task == "super_res")
    with torch.no_grad():
        for param in net.parameters():
            if not param.any():
                param.normal_(std=0.05)
    path = save_checkpoint(
        folder,
        1,
        model_state=net.state_dict(),
        ema_states={},
        trainer_state={"step": 1},
        config=to_dict(config),
    )
    return path, config


def test_a_cascade_and_low_res_upsample_the_same_on_one_and_two_workers(ray_cluster, tmp_path):
    """``--upsampler``: a class-conditional 4x4 base model, then a class-conditional 4x4 ->
    16x16 upsampler on its samples and labels, each stage with its own steps, on one worker.
    ``--low-res`` on the first stage's folder, on two workers, gives the second stage's images
    again, and so does the library's generation in one process (sample i upsamples image i % N:
    7 samples of 5 images). A base model as the upsampler is refused before anything starts."""
    from raydiff.errors import UserInputError
    from raydiff.factory import create_gaussian_diffusion
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.generate import generate
    from raydiff.sample.low_res import model_input_of
    from raydiff.sample.options import SampleOptions

    classes = ("model.class_cond=true", "model.num_classes=3")
    base, _ = _tiny_checkpoint(tmp_path / "base", "model.image_size=4", *classes)
    upsampler, config = _tiny_checkpoint(
        tmp_path / "sr", "train.task=super_res", "super_res.small_size=4", *classes
    )
    common = {"weights": "model", "batch_size": 3, "seed": 1}
    result = run_sampling(
        SampleOptions(
            checkpoint=str(base),
            num_samples=5,
            out=str(tmp_path / "cascade"),
            timestep_respacing="ddim4",
            use_ddim=True,
            upsampler=str(upsampler),
            upsampler_weights="model",
            upsampler_respacing="5",
            **common,
        )
    )
    assert result.base is not None and result.base.npz.parent == tmp_path / "cascade" / "base"
    assert result.npz == tmp_path / "cascade" / "upsampled" / "samples_5x16x16x1.npz"
    with np.load(result.base.npz) as low, np.load(result.npz) as high:
        low_images, low_labels = low["arr_0"], low["arr_1"]
        assert low_images.shape == (5, 4, 4, 1)
        np.testing.assert_array_equal(low_labels, high["arr_1"])  # the labels carried on
        upsampled = high["arr_0"]
    direct = run_sampling(
        SampleOptions(
            checkpoint=str(upsampler),
            num_samples=7,
            out=str(tmp_path / "direct"),
            timestep_respacing="5",
            num_workers=2,
            low_res=str(tmp_path / "cascade" / "base"),  # a `raydiff sample` folder
            **common,
        )
    )
    with np.load(direct.npz) as data:
        np.testing.assert_array_equal(data["arr_0"][:5], upsampled)
        np.testing.assert_array_equal(data["arr_1"], low_labels[np.arange(7) % 5])
        two_workers = data["arr_0"]
    record = json.loads((tmp_path / "direct" / "sampling.json").read_text())
    assert record["low_res"] == str(result.base.npz)
    net = create_model(config.model, learn_sigma=False, super_res=True)
    net.load_state_dict(torch.load(upsampler / "model.pt", weights_only=True))
    diffusion = create_gaussian_diffusion(
        config.diffusion.__class__(diffusion_steps=50, timestep_respacing="5")
    )
    # One thread, as each actor computes: a convolution split over other thread counts can
    # round differently, and a sample's uint8 pixel then differ by one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        in_process = [
            generate(
                net.eval(),
                diffusion,
                indices=batch,
                image_shape=(1, 16, 16),
                seed=1,
                labels=low_labels[np.arange(batch.start, batch.stop) % 5],
                low_res=model_input_of(low_images, batch),
            )
            for batch in (range(0, 3), range(3, 6), range(6, 7))  # the actors' batches
        ]
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_array_equal(np.concatenate(in_process), two_workers)

    with pytest.raises(UserInputError, match=r"train.task='diffusion'.*a diffusion model samples"):
        run_sampling(
            SampleOptions(
                checkpoint=str(base),
                num_samples=5,
                out=str(tmp_path / "no"),
                upsampler=str(base),
                **common,
            )
        )
    assert not (tmp_path / "no").exists()
