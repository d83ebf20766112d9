"""The single-process loop (``raydiff train --single-process``): files, validation, resume."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from tiny_model import tiny_model

from raydiff.config import ExperimentConfig, apply_overrides
from raydiff.data.in_memory import infinite_batches
from raydiff.storage import RemotePath
from raydiff.train.checkpoint import latest_checkpoint, read_metrics, read_progress
from raydiff.train.local import LocalRuntime
from raydiff.train.loop import run_loop

NUM_IMAGES, BATCH = 40, 8  # 5 batches per epoch


def tiny_config(max_steps: int) -> ExperimentConfig:
    return apply_overrides(
        ExperimentConfig(),
        [
            *tiny_model(image_size=8),
            "diffusion.diffusion_steps=40",
            f"train.batch_size={BATCH}",
            f"train.max_steps={max_steps}",
            "train.log_interval=2",
            "train.save_interval=3",
            "train.sample_interval=0",
            "train.eval_interval=2",
            "train.eval_num_images=10",
            "train.eval_timesteps=4",
            "scaling.num_workers=1",
        ],
    )


def images() -> torch.Tensor:
    return torch.rand(NUM_IMAGES, 1, 8, 8, generator=torch.Generator().manual_seed(0)) * 2 - 1


def test_skip_batches_continues_the_epoch_order() -> None:
    full = infinite_batches(images(), None, batch_size=BATCH, seed=3)
    expected = [next(full) for _ in range(8)][3:]  # epoch 0 from batch 3 on, then epoch 1
    resumed = infinite_batches(images(), None, batch_size=BATCH, seed=3, skip_batches=3)
    for (epoch_a, a), (epoch_b, b) in zip(expected, resumed, strict=False):
        assert epoch_a == epoch_b
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["x"], b["x"])


def test_flips_follow_data_random_flip() -> None:
    """Each batch holds whole images of the set, flipped only with random_flip (the default)."""
    data = images()
    flipped_rows = {tuple(img.flip(-1).flatten().tolist()) for img in data}
    kept = infinite_batches(data, None, batch_size=BATCH, seed=3, random_flip=False)
    flipped = infinite_batches(data, None, batch_size=BATCH, seed=3)
    seen_flips = 0
    for _ in range(5):
        (_, batch_kept), (_, batch_flip) = next(kept), next(flipped)
        assert torch.equal(batch_kept["x"], data[batch_kept["index"]])
        x_flip = batch_flip["x"]
        seen_flips += sum(tuple(img.flatten().tolist()) in flipped_rows for img in x_flip)
    assert 0 < seen_flips < NUM_IMAGES


def run(max_steps: int, output: Path, *, log_interval: int = 2, overrides: tuple = ()) -> dict:
    """A single-process run as `raydiff train --single-process` makes it, continuing the newest
    checkpoint in ``output`` (4 sample-grid images, 4 DDIM steps to keep it quick)."""
    after_previous_events_second(output / "tensorboard")
    config = apply_overrides(
        tiny_config(max_steps),
        [
            "train.sample_count=4",
            "train.sample_steps=4",
            f"train.log_interval={log_interval}",
            *overrides,
        ],
    )
    runtime = LocalRuntime(
        config,
        output_dir=output,
        resume=latest_checkpoint(output),
        images=images(),
        labels=None,
        val=(images()[:12], None),
    )
    return run_loop(config, runtime=runtime, output_dir=output)


def after_previous_events_second(folder: Path | RemotePath) -> None:
    """Wait until the second in which the folder's newest TensorBoard events file was created
    has passed. TensorBoard reads a folder's files in name order and a name starts with that
    second; within one second and one process the order is the writers' counter's, in which
    ``.10`` sorts before ``.9``: the resumed run's events would be read first, and then purged
    as orphans by the earlier run's lower steps. Separate processes, which real resumes are,
    start seconds apart. Local folders only (a remote run's test reads its events otherwise)."""
    if not isinstance(folder, Path):
        return
    seconds = [int(f.name.split(".")[3]) for f in folder.glob("events.out.tfevents.*")]
    while seconds and time.time() < max(seconds) + 1:
        time.sleep(0.05)


def test_writes_checkpoints_samples_events_and_resumes_at_its_data_position(
    tmp_path: Path,
) -> None:
    first = run(4, tmp_path)
    assert first["step"] == 4
    # Validation on the EMA weights, as a Ray run reports it (10 of the 12 val images).
    assert 0 < first["val_bpd"] < 20 and first["val_mse"] > 0
    assert sorted(p.name for p in tmp_path.glob("checkpoint_*")) == [
        "checkpoint_000003",
        "checkpoint_000004",
    ]
    assert (tmp_path / "samples" / "samples_000004.png").is_file()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert read_progress(tmp_path / "checkpoint_000004") == {
        "step": 4,
        "epoch": 0,
        "epoch_samples": 4 * BATCH,
    }
    # Re-running on the same folder continues: step 4 -> 7 crosses into epoch 1 after 1 batch,
    # then 2 more batches of it (5 batches per epoch), rather than restarting epoch 0.
    second = run(7, tmp_path)
    assert second["step"] == 7
    assert read_progress(tmp_path / "checkpoint_000007") == {
        "step": 7,
        "epoch": 1,
        "epoch_samples": 2 * BATCH,
    }


def test_a_restarted_run_replaces_the_events_logged_after_its_start(tmp_path: Path) -> None:
    """A run that died after logging steps it never checkpointed starts again from its last
    checkpoint: its event file opens with a SessionLog START at that step + 1, which makes
    TensorBoard drop the failed attempt's later events (one curve, not two)."""
    import shutil

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    def session_starts() -> list[int]:
        newest = sorted((tmp_path / "tensorboard").glob("events.out.tfevents.*"))[-1]
        return [e.step for e in EventFileLoader(str(newest)).Load() if e.HasField("session_log")]

    run(4, tmp_path)
    shutil.rmtree(tmp_path / "checkpoint_000004")  # step 4 logged, then the crash
    run(6, tmp_path)  # resumes from checkpoint 3
    assert session_starts() == [4]
    for checkpoint in tmp_path.glob("checkpoint_*"):  # a crash before any checkpoint
        shutil.rmtree(checkpoint)
    run(4, tmp_path)
    assert session_starts() == [1]
    events = EventAccumulator(str(tmp_path / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [2, 3, 4]  # log and save steps


def test_a_resumed_run_continues_the_data_order_and_the_losses(tmp_path: Path) -> None:
    """Steps 4-7 of a run resumed from its step-3 checkpoint see the same batches and give the
    same losses as steps 4-7 of the uninterrupted run: weights, EMA, optimiser, sampler and data
    position come from the checkpoint, and each step's random streams from (seed, rank, step)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def step_losses(folder: Path) -> dict[int, float]:
        events = EventAccumulator(str(folder / "tensorboard"), size_guidance={"scalars": 0})
        events.Reload()
        return {e.step: e.value for e in events.Scalars("train/loss_step")}

    last = run(7, tmp_path / "whole", log_interval=1)
    run(3, tmp_path / "parts", log_interval=1)
    run(7, tmp_path / "parts", log_interval=1)
    whole, parts = step_losses(tmp_path / "whole"), step_losses(tmp_path / "parts")
    # The last checkpoint keeps the metrics reported with it (a rerun of the run prints them).
    kept = read_metrics(tmp_path / "whole" / "checkpoint_000007")
    assert kept["step"] == 7 and kept["loss"] == last["loss"] and "val_bpd" in kept
    assert sorted(parts) == list(range(1, 8))
    assert [parts[s] for s in range(4, 8)] == [whole[s] for s in range(4, 8)]
    for name in ("model.pt", "ema_0.9999.pt"):
        a = torch.load(tmp_path / "whole" / "checkpoint_000007" / name, weights_only=True)
        b = torch.load(tmp_path / "parts" / "checkpoint_000007" / name, weights_only=True)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_resumed_run_writes_the_post_hoc_ema_snapshots_of_an_uninterrupted_one(
    tmp_path: Path,
) -> None:
    """The power-function EMA profiles are part of the checkpoint: a run resumed at step 3
    writes the snapshots of steps 4 and 6 (and the last, 7) bit for bit as the run trained
    straight through does."""
    posthoc = ("optim.posthoc_ema_stds=0.05,0.10", "optim.posthoc_ema_interval=2")
    run(7, tmp_path / "whole", overrides=posthoc)
    run(3, tmp_path / "parts", overrides=posthoc)
    run(7, tmp_path / "parts", overrides=posthoc)
    whole = sorted(p.name for p in (tmp_path / "whole" / "posthoc_ema").iterdir())
    assert whole == [f"snapshot_{s:07d}.pt" for s in (2, 4, 6, 7)]
    for name in whole:
        a = torch.load(tmp_path / "whole" / "posthoc_ema" / name, weights_only=True)
        b = torch.load(tmp_path / "parts" / "posthoc_ema" / name, weights_only=True)
        assert a["step"] == b["step"] and set(a["profiles"]) == {"0.050", "0.100"}
        for sigma, profile in a["profiles"].items():
            assert profile.keys() == b["profiles"][sigma].keys()
            assert all(torch.equal(v, b["profiles"][sigma][k]) for k, v in profile.items())
            assert all(v.dtype == torch.float16 for v in profile.values() if v.is_floating_point())


class TwoRankRuntime(LocalRuntime):
    """Rank 0 of 2, the other rank simulated: its values in every sum equal this rank's, but its
    weight fingerprint is off by ``drift`` (0: in sync)."""

    world_size = 2

    def __init__(self, *args, drift: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.drift = drift

    def all_reduce_sum(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        summed = {k: v * 2 for k, v in values.items() if k != "weights"}
        if "weights" in values:
            table = values["weights"].clone()
            table[1] = table[0] + self.drift
            summed["weights"] = table
        return summed


def two_rank_run(tmp_path: Path, *, drift: float) -> dict:
    """3 steps, the checkpoint at step 3; no validation split, a 4-image 2-step sample grid."""
    config = apply_overrides(tiny_config(3), ["train.sample_count=4", "train.sample_steps=2"])
    runtime = TwoRankRuntime(
        config, output_dir=tmp_path, resume=None, images=images(), labels=None, drift=drift
    )
    return run_loop(config, runtime=runtime, output_dir=tmp_path)


def test_every_checkpoint_records_that_all_ranks_hold_the_same_weights(tmp_path: Path) -> None:
    from raydiff.train.checkpoint import load_checkpoint

    two_rank_run(tmp_path, drift=0.0)
    state = load_checkpoint(tmp_path / "checkpoint_000003")
    fingerprints = state["trainer"]["rank_weight_fingerprints"]
    assert len(fingerprints) == 2 and fingerprints[0] == fingerprints[1]
    params = [v.double() for v in state["model"].values()]
    assert fingerprints[0][0] == pytest.approx(float(sum(p.sum() for p in params)), rel=1e-6)


def test_ranks_with_different_weights_stop_the_run_before_it_checkpoints(tmp_path: Path) -> None:
    from raydiff.train.rank_optimizer import RanksOutOfSyncError

    with pytest.raises(RanksOutOfSyncError, match="at step 3 the data-parallel ranks hold"):
        two_rank_run(tmp_path, drift=1e-9)
    assert not list(tmp_path.glob("checkpoint_*"))


class RankOfFour(LocalRuntime):
    """Rank ``rank`` of 4 with 3 val images (fewer than ranks, fewer than eval_num_images):
    records the val rows the loop asks for and the keys it sums (the other ranks' totals are
    taken to be zero)."""

    world_size = 4

    def __init__(self, *args, rank: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.rank, self.is_main = rank, rank == 0
        self.rows: list[range] = []
        self.summed: list[list[str]] = []

    def val_batches(self, *, rows: range, batch_size: int):
        self.rows.append(rows)
        return super().val_batches(rows=rows, batch_size=batch_size)

    def all_reduce_sum(self, values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if "weights" in values:  # the checkpoint's fingerprints: every rank holds these weights
            return {"weights": values["weights"][self.rank].repeat(self.world_size, 1)}
        self.summed.append(sorted(values))
        return values


def test_every_rank_evaluates_its_share_of_a_small_val_split_and_sums_the_same_keys(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """3 val images, train.eval_num_images=10, 4 ranks: ranks 1-3 evaluate one image each,
    rank 0 none, and every rank sums the same keys; the main rank says once that validation
    uses the 3 images."""
    config = apply_overrides(tiny_config(1), ["train.eval_num_images=10"])
    runtimes = []
    for rank in range(4):
        runtime = RankOfFour(
            config,
            output_dir=tmp_path / f"rank{rank}",
            resume=None,
            images=images(),
            labels=None,
            val=(images()[:3], None),
            rank=rank,
        )
        with caplog.at_level("INFO", logger="raydiff.train.loop"):
            metrics = run_loop(config, runtime=runtime, output_dir=runtime.output_dir)
        assert ("val_bpd" in metrics) == (rank > 0), (rank, metrics)
        runtimes.append(runtime)
    assert [r.rows for r in runtimes] == [
        [range(0, 0)],
        [range(0, 1)],
        [range(1, 2)],
        [range(2, 3)],
    ]
    assert len({tuple(map(tuple, r.summed)) for r in runtimes}) == 1
    said = [m for m in caplog.messages if m.startswith("validation uses")]
    assert said == [
        "validation uses the val split's 3 images (train.eval_num_images=10 asks for more)"
    ]


class _Preempted(Exception):
    """Stands for Ray Train stopping the worker group after a preemption notice."""


class NoticeAtStep(LocalRuntime):
    """A runtime that receives a preemption notice after step ``notice_step``."""

    notice_step = 5

    def preemption_notice(self, *, step: int) -> str | None:
        self.asked = [*getattr(self, "asked", []), step]
        return "node n1 (ranks 1) will be taken away" if step == self.notice_step else None

    def await_preemption(self) -> None:
        raise _Preempted


def test_a_preemption_notice_checkpoints_at_once_then_waits(tmp_path: Path) -> None:
    # Checkpoints are due at 3 and 6: the notice after step 5 saves step 5 at once (at most one
    # step of work is lost with the preempted node), then the loop trains no further.
    config = tiny_config(9)
    runtime = NoticeAtStep(config, output_dir=tmp_path, resume=None, images=images(), labels=None)
    with pytest.raises(_Preempted):
        run_loop(config, runtime=runtime, output_dir=tmp_path)
    assert runtime.asked == [1, 2, 3, 4, 5]  # after every step, the same on every rank
    assert latest_checkpoint(tmp_path).name == "checkpoint_000005"
    assert read_progress(tmp_path / "checkpoint_000005")["epoch_samples"] == 5 * BATCH
    assert not (tmp_path / "checkpoint_000006").exists()
    # The restarted group continues from the notice's checkpoint to the end.
    assert run(9, tmp_path)["step"] == 9
