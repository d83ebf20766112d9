"""Validation on a val split smaller than ``train.eval_num_images``, on 2 Ray workers.

A user who prepares a small labelled folder (``raydiff prepare FOLDER --labels prefix
--val-count 150``) and trains the classifier preset asks for 1000 val images: the run evaluates
the 150 there are, 75 on each worker, and reports their metrics (before, the 1000 were cut into
500 per rank, rank 1 got none and its empty totals broke the all-reduce at the first
evaluation). Fashion-MNIST at 16x16, 150 val images (the tests skip without the machine's copy).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fashion_mnist_data import fashion_mnist_at
from tiny_model import tiny_classifier

from raydiff.config import ExperimentConfig, apply_overrides

pytestmark = pytest.mark.dataset  # under CI its skip is an error (tests/conftest.py)

NUM_VAL = 150


@pytest.fixture(scope="module")
def small_val_split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("small-val") / "fashion-mnist-16"
    # prepare holds out at most a tenth of the images as val: 1500 for 150.
    return fashion_mnist_at(out, image_size=16, limit=10 * NUM_VAL, val_count=NUM_VAL)


def test_a_val_split_smaller_than_eval_num_images_is_evaluated_whole(
    ray_cluster: None, small_val_split: Path, tmp_path: Path
) -> None:
    from raydiff.orchestrate.training_job import run_training_job

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
            f"data.data_dir={small_val_split}",
            "diffusion.diffusion_steps=100",
            "train.batch_size=16",
            "train.max_steps=3",
            "train.log_interval=3",
            "train.save_interval=3",
            "train.eval_interval=0",  # evaluated at the end
            "train.eval_num_images=1000",  # the classifier presets' figure: more than there are
            "scaling.num_workers=2",
            "scaling.cpus_per_worker=0.5",
        ],
    )
    result = run_training_job(config, output_dir=tmp_path / "run", make_task=counting_val_images)
    assert result["step"] == 3
    assert result["val_images"] == NUM_VAL
    assert 0 <= result["val_acc@1"] <= result["val_acc@5"] <= 1
    assert result["val_loss"] > 0
