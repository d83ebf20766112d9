"""Per-worker training logic without Ray: precision, skipping, collapse, microbatches, EMA, state."""

import json
import math

import pytest
import torch

from raydiff.config import DiffusionConfig, OptimConfig, TrainConfig
from raydiff.core import LossSecondMomentResampler, UniformSampler
from raydiff.factory import create_gaussian_diffusion
from raydiff.train.checkpoint import (
    incomplete_reason,
    latest_checkpoint,
    load_checkpoint,
    read_progress,
    require_checkpoint_dir,
    resume_point,
    save_checkpoint,
)
from raydiff.train.data_position import DataPosition
from raydiff.train.rank_optimizer import RankOptimizer, TrainingCollapsedError
from raydiff.train.tasks.diffusion import DiffusionTask
from raydiff.train.validation import stratified_timesteps


class TinyEps(torch.nn.Module):
    def __init__(self, channels=1):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.inject_inf = False

    def forward(self, x, t, **kwargs):
        out = self.conv(x) + t.float().view(-1, 1, 1, 1) * 1e-4
        if self.inject_inf:
            out = out * torch.tensor(float("inf"))
        return out


def make_trainer(
    precision="fp32", microbatch=-1, batch=8, sampler="uniform", ema_rate="0.9,0.5", **train_kw
):
    # A start scale that does not overflow this tiny model's fp16 gradients on the first step.
    train_kw.setdefault("initial_loss_scale", 2.0**10)
    torch.manual_seed(0)
    diffusion = create_gaussian_diffusion(
        DiffusionConfig(diffusion_steps=50, noise_schedule="cosine")
    )
    model = TinyEps()
    s = (
        UniformSampler(diffusion, seed=0)
        if sampler == "uniform"
        else LossSecondMomentResampler(diffusion, history_per_term=2, seed=0)
    )
    task = DiffusionTask(
        model=model,
        diffusion=diffusion,
        eval_timesteps=stratified_timesteps(50, 4, seed=0),
    )
    return RankOptimizer(
        model=model,
        losses=task.losses,
        sampler=s,
        optim=OptimConfig(lr=1e-3, ema_rate=ema_rate),
        train=TrainConfig(batch_size=batch, microbatch=microbatch, precision=precision, **train_kw),
        local_batch_size=batch,
        device=torch.device("cpu"),
    )


def batch(n=8):
    g = torch.Generator().manual_seed(1)
    return {"x": torch.rand(n, 1, 8, 8, generator=g) * 2 - 1, "index": torch.arange(n)}


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_steps_train_in_every_precision(precision):
    tr = make_trainer(precision)
    before = tr.model.conv.weight.detach().clone()
    for _ in range(3):
        result = tr.optimize(batch())
    assert result.stepped and tr.step == 3 and tr.skipped_steps == 0
    assert not torch.equal(before, tr.model.conv.weight)
    assert tr.model.conv.weight.dtype == torch.float32
    assert math.isfinite(float(result.grad_norm))


def test_slow_cpu_precisions_warn(caplog, monkeypatch):
    """fp16 on a CPU, and bf16 on a CPU without native bf16 kernels, say what to use instead."""
    from raydiff.train import precision

    with caplog.at_level("WARNING", logger="raydiff.train.precision"):
        make_trainer("fp16")
    assert "use bf16 on CPU" in caplog.text
    for native, warns in ((True, False), (False, True)):
        monkeypatch.setattr(precision, "native_cpu_bf16", lambda native=native: native)
        caplog.clear()
        with caplog.at_level("WARNING", logger="raydiff.train.precision"):
            make_trainer("bf16")
        assert ("without native bf16" in caplog.text) == warns


def test_injected_inf_skips_exactly_that_step_fp16():
    tr = make_trainer("fp16")
    tr.optimize(batch())
    scale = tr.precision.loss_scale
    weights = tr.model.conv.weight.detach().clone()
    ema = [p.clone() for p in tr.ema.params[0.9]]
    tr.model.inject_inf = True
    result = tr.optimize(batch())
    assert not result.stepped and tr.skipped_steps == 1 and tr.step == 2
    assert torch.equal(weights, tr.model.conv.weight)  # no update
    assert all(torch.equal(a, b) for a, b in zip(ema, tr.ema.params[0.9], strict=True))
    assert tr.precision.loss_scale == scale / 2  # the scaler backs off
    tr.model.inject_inf = False
    assert tr.optimize(batch()).stepped and tr.skipped_steps == 1


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_non_finite_steps_are_skipped_without_a_scaler(precision):
    tr = make_trainer(precision)
    tr.model.inject_inf = True
    assert not tr.optimize(batch()).stepped
    assert tr.skipped_steps == 1


def test_collapse_of_the_loss_scale_stops_with_a_clear_error():
    tr = make_trainer("fp16", initial_loss_scale=2.0**16, min_loss_scale=2.0**12)
    tr.model.inject_inf = True
    with pytest.raises(TrainingCollapsedError, match="loss scale collapsed"):
        for _ in range(10):  # 2^16 halves below 2^12 after 5 skipped steps
            tr.optimize(batch())
    assert tr.skipped_steps == 5


def test_many_skipped_steps_in_a_row_stop_the_run():
    tr = make_trainer("fp32", max_consecutive_skipped=3)
    tr.model.inject_inf = True
    with pytest.raises(TrainingCollapsedError, match="3 consecutive steps"):
        for _ in range(5):
            tr.optimize(batch())


def test_microbatching_gives_the_same_gradient():
    """Splitting the local batch into microbatches must not change the update."""
    grads = []
    for micro in (-1, 2):
        tr = make_trainer("fp32", microbatch=micro)
        # identical timesteps/noise: reseed before the step, sampler seeded identically
        torch.manual_seed(5)
        tr.optimize(batch())
        grads.append(tr.model.conv.weight.grad.clone())
    # Noise is drawn per microbatch in the same order, so the gradients agree closely.
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)


def test_ema_rates_follow_their_formula():
    tr = make_trainer()
    start = tr.model.conv.weight.detach().clone()
    tr.optimize(batch())
    new = tr.model.conv.weight.detach()
    for rate in (0.9, 0.5):
        ema_w = tr.ema.state_dict_for(rate, tr.model)["conv.weight"]
        torch.testing.assert_close(ema_w, rate * start + (1 - rate) * new)


def test_lr_warmup_and_anneal():
    tr = make_trainer()
    tr.optim_config = OptimConfig(lr=1.0, warmup_steps=4, lr_anneal_steps=10)
    assert [round(tr.lr_at(s), 3) for s in (0, 1, 3, 5, 10)] == [0.25, 0.45, 0.7, 0.5, 0.0]


def test_checkpoint_round_trip_continues_identically(tmp_path):
    a = make_trainer("fp16", sampler="loss-second-moment")
    for _ in range(4):
        a.optimize(batch())
    ckpt = save_checkpoint(
        tmp_path,
        a.step,
        model_state=a.model.state_dict(),
        ema_states={r: a.ema.state_dict_for(r, a.model) for r in a.ema.rates},
        trainer_state=a.state_dict(),
        config={"note": "test"},
    )
    assert latest_checkpoint(tmp_path) == ckpt
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left
    state = load_checkpoint(ckpt)
    b = make_trainer("fp16", sampler="loss-second-moment")
    b.model.load_state_dict(state["model"])
    for rate, s in state["ema"].items():
        b.ema.load_state_dict_for(rate, s)
    b.load_state_dict(state["trainer"])
    assert b.step == 4 and b.precision.loss_scale == a.precision.loss_scale
    assert b.precision.scaler.state_dict() == a.precision.scaler.state_dict()
    assert torch.equal(b.sampler._loss_history, a.sampler._loss_history)
    torch.manual_seed(9)
    ra = a.optimize(batch())
    torch.manual_seed(9)
    rb = b.optimize(batch())
    assert torch.equal(ra.timesteps, rb.timesteps)
    torch.testing.assert_close(a.model.conv.weight, b.model.conv.weight)


def test_progress_file_gives_the_data_position_without_torch(tmp_path):
    ckpt = save_checkpoint(
        tmp_path,
        12,
        model_state={},
        ema_states={},
        trainer_state={"step": 12, "epoch": 3, "epoch_samples": 96, "optimizer": {}},
        config={},
    )
    assert json.loads((ckpt / "progress.json").read_text()) == {
        "step": 12,
        "epoch": 3,
        "epoch_samples": 96,
    }
    assert read_progress(ckpt) == {"step": 12, "epoch": 3, "epoch_samples": 96}
    (ckpt / "progress.json").unlink()  # a checkpoint from before progress.json existed
    assert read_progress(ckpt) == {}


def test_a_failed_checkpoint_write_leaves_nothing(tmp_path, monkeypatch):
    import raydiff.train.checkpoint as ck

    def broken(directory, **kw):
        (directory / "model.pt").write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(ck, "write_checkpoint_files", broken)
    with pytest.raises(OSError, match="disk full"):
        ck.save_checkpoint(tmp_path, 10, model_state={}, ema_states={}, trainer_state={}, config={})
    assert list(tmp_path.iterdir()) == []
    assert ck.latest_checkpoint(tmp_path) is None


def _save(root, step):
    state = {"step": step, "epoch": 0, "epoch_samples": 8 * step}
    return save_checkpoint(
        root, step, model_state={"w": torch.ones(3)}, ema_states={}, trainer_state=state, config={}
    )


def test_a_partial_copy_is_skipped_for_the_newest_complete_checkpoint(tmp_path, caplog):
    """Ray copies a reported checkpoint file by file into its final folder: a crash mid-copy
    leaves a partial folder, which resume must not pick up (nor take its progress for the run's).
    """
    import shutil

    good = _save(tmp_path, 4)
    assert incomplete_reason(good) is None
    cut_short = tmp_path / "checkpoint_000009"  # the copy never reached files.json
    shutil.copytree(good, cut_short)
    (cut_short / "files.json").unlink()
    truncated = tmp_path / "checkpoint_000012"  # files.json arrived, model.pt only in part
    shutil.copytree(good, truncated)
    (truncated / "model.pt").write_bytes((truncated / "model.pt").read_bytes()[:10])
    with caplog.at_level("WARNING"):
        assert latest_checkpoint(tmp_path) == good
    assert "checkpoint_000012" in caplog.text and "model.pt has 10 bytes" in caplog.text
    assert "checkpoint_000009" in caplog.text and "no files.json" in caplog.text
    assert resume_point(tmp_path, None) == good
    with pytest.raises(FileNotFoundError, match=r"incomplete checkpoint: model\.pt has 10 bytes"):
        require_checkpoint_dir(truncated)
    # A checkpoint written before files.json existed still loads when named explicitly.
    assert require_checkpoint_dir(cut_short) == cut_short


def test_saving_the_same_step_again_replaces_it_and_clears_stale_temporaries(tmp_path):
    first = _save(tmp_path, 5)
    stale = tmp_path / ".checkpoint_000007.tmp-abc"  # a save killed mid-write
    stale.mkdir()
    (stale / "model.pt").write_bytes(b"partial")
    again = _save(tmp_path, 5)
    assert again == first and latest_checkpoint(tmp_path) == again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_000005"]


def test_restore_continues_every_ema_and_starts_a_new_rate_from_the_restored_weights(tmp_path):
    before = make_trainer(ema_rate="0.9")
    for _ in range(3):
        before.optimize(batch())
    ckpt = save_checkpoint(
        tmp_path,
        3,
        model_state=before.raw_model.state_dict(),
        ema_states={0.9: before.ema.state_dict_for(0.9, before.raw_model)},
        trainer_state=before.state_dict(),
        config={},
    )
    after = make_trainer(ema_rate="0.9,0.5")  # a rate added since the checkpoint
    after.restore(load_checkpoint(ckpt))
    assert after.step == 3
    torch.testing.assert_close(after.ema.params[0.9], before.ema.params[0.9], rtol=0, atol=0)
    restored = [p.detach() for p in after.raw_model.parameters()]
    torch.testing.assert_close(after.ema.params[0.5], restored, rtol=0, atol=0)


def test_wrong_batch_size_is_reported():
    with pytest.raises(ValueError, match="local batch of 8"):
        make_trainer().optimize(batch(4))
    with pytest.raises(ValueError, match="divisible by the number of workers"):
        TrainConfig(batch_size=10).per_worker_batch(3)
    with pytest.raises(ValueError, match="microbatch=4"):
        TrainConfig(batch_size=12, microbatch=4).per_worker_batch(2)


def test_init_from_published_style_weights(tmp_path):
    from raydiff.config import ModelConfig
    from raydiff.factory import create_model
    from raydiff.train.checkpoint import load_model_weights

    config = ModelConfig(
        image_size=16,
        in_channels=1,
        num_channels=32,
        channel_mult="1,2",
        num_res_blocks=1,
        attention_resolutions="8",
    )
    source = create_model(config, learn_sigma=True)
    torch.save(
        source.state_dict(), tmp_path / "ema_0.9999_250000.pt"
    )  # improved-diffusion's format
    target = create_model(config, learn_sigma=True)
    load_model_weights(target, tmp_path / "ema_0.9999_250000.pt")
    for (k, a), b in zip(source.state_dict().items(), target.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    wrong = create_model(config, learn_sigma=False)  # flags differ from the weights'
    with pytest.raises(ValueError, match=r"learn_sigma.*out\.2\.weight: file \(2, 32, 3, 3\)"):
        load_model_weights(wrong, tmp_path / "ema_0.9999_250000.pt")
    with pytest.raises(FileNotFoundError, match="init_checkpoint"):
        load_model_weights(wrong, tmp_path / "missing.pt")


def test_metric_means_per_quartile_and_reduction():
    from raydiff.train.rank_optimizer import StepResult
    from raydiff.train.reporting import MetricAccumulator

    acc = MetricAccumulator(num_timesteps=100)
    losses = torch.tensor([1.0, 2.0, 3.0, 5.0])
    result = StepResult(
        stepped=True,
        losses={"loss": losses},
        timesteps=torch.tensor([0, 10, 60, 99]),
        weights=torch.ones(4),
        grad_norm=torch.tensor(2.0),
        lr=1e-3,
        loss_scale=1.0,
    )
    acc.add_step(result)
    acc.add_step(result)
    out = acc.flush()
    assert out["loss"] == pytest.approx(2.75)
    assert out["loss_q0"] == pytest.approx(1.5) and out["loss_q2"] == pytest.approx(3.0)
    assert out["loss_q3"] == pytest.approx(5.0) and "loss_q1" not in out  # no sample in q1
    assert out["grad_norm"] == pytest.approx(2.0)
    acc.add_step(result)
    doubled = acc.flush(reduce=lambda packed: {k: v * 2 for k, v in packed.items()})
    assert doubled["loss"] == pytest.approx(2.75)  # sums and counts both reduced
    assert acc.flush() == {}


def test_logged_terms_are_importance_weighted_as_in_improved_diffusion():
    """log_loss_dict gets ``{k: v * weights}``: the means estimate the objective the step
    optimises, not the raw terms at the timesteps a loss-aware sampler favours."""
    from raydiff.train.rank_optimizer import StepResult
    from raydiff.train.reporting import MetricAccumulator

    acc = MetricAccumulator(num_timesteps=100)
    acc.add_step(
        StepResult(
            stepped=True,
            losses={"loss": torch.tensor([1.0, 2.0, 3.0, 5.0]), "mse": torch.ones(4)},
            timesteps=torch.tensor([0, 10, 60, 99]),
            weights=torch.tensor([0.5, 2.0, 1.0, 0.1]),
            grad_norm=torch.tensor(1.0),
            lr=1e-3,
            loss_scale=1.0,
        )
    )
    out = acc.flush()
    assert out["loss"] == pytest.approx((0.5 + 4.0 + 3.0 + 0.5) / 4)
    assert out["loss_q0"] == pytest.approx((0.5 + 4.0) / 2)
    assert out["mse"] == pytest.approx(3.6 / 4)


def test_train_step_weights_each_sample_by_its_importance():
    """With a warm loss-aware sampler, each sample's weight is 1 / (T p_t) of its own t."""
    trainer = make_trainer(sampler="loss-second-moment")
    sampler = trainer.sampler
    t = torch.arange(sampler.num_timesteps).repeat(2)
    sampler.update_with_all_losses(t, 0.1 + t.double())  # loss grows with t: p_t too
    p = torch.from_numpy(sampler.weights())
    p = p / p.sum()
    assert p.max() > 10 * p.min()
    result = trainer.optimize(batch())
    expected = 1.0 / (sampler.num_timesteps * p[result.timesteps])
    torch.testing.assert_close(result.weights, expected.float())


def test_a_step_draws_from_streams_keyed_by_seed_and_step():
    """The same step draws the same timesteps and noise, whatever ran before (that is what makes
    a resumed run continue exactly); another step draws others."""
    first = make_trainer(batch=16)
    other = make_trainer(batch=16)
    other.optimize(batch(16))  # one step ahead, then back to step 0's weights and counter
    other.raw_model.load_state_dict(first.raw_model.state_dict())
    other.step = 0
    a, b = first.optimize(batch(16)), other.optimize(batch(16))
    assert torch.equal(a.timesteps, b.timesteps) and torch.equal(a.losses["loss"], b.losses["loss"])
    c = first.optimize(batch(16))  # step 1
    assert not torch.equal(a.timesteps, c.timesteps)


def recording_augment_seeds(trainer: RankOptimizer) -> list[torch.Tensor]:
    """The ``augment_seed`` of each microbatch the trainer's task is given, in order."""
    seen: list[torch.Tensor] = []
    losses = trainer.losses

    def record(model, micro, t):
        seen.append(micro["augment_seed"])
        return losses(model, micro, t)

    trainer.losses = record
    return seen


def test_each_rank_takes_its_rows_of_the_global_batch_draws():
    """Two ranks of 8 draw, between them, the timesteps, noise and augmentation seeds one
    worker draws for the global batch of 16: the step's losses do not depend on the number of
    workers (nor of microbatches)."""
    whole = make_trainer(batch=16)
    whole_seeds = recording_augment_seeds(whole)
    data = batch(16)
    expected = whole.optimize(data)
    halves, half_seeds = [], []
    for rank in (0, 1):
        trainer = make_trainer(batch=16)
        trainer.local_batch_size, trainer.microbatch = 8, 4  # microbatches slice the rank's rows
        trainer.rank, trainer.world_size = rank, 2
        half_seeds.append(recording_augment_seeds(trainer))
        halves.append(trainer.optimize({k: v[rank * 8 : (rank + 1) * 8] for k, v in data.items()}))
    assert torch.equal(torch.cat([h.timesteps for h in halves]), expected.timesteps)
    torch.testing.assert_close(
        torch.cat([h.losses["loss"] for h in halves]), expected.losses["loss"]
    )
    seeds = torch.cat(whole_seeds)
    assert torch.equal(torch.cat([s for rank in half_seeds for s in rank]), seeds)
    assert len(set(seeds.tolist())) == 16
    assert seeds.dtype == torch.int64 and seeds.device.type == "cpu"


def test_data_position_counts_batches_per_epoch_and_round_trips():
    position = DataPosition()
    for epoch in (0, 0, 0, 1, 1):
        position.advance(epoch)
    assert (position.epoch, position.batches) == (1, 2)
    state = position.state(global_batch=8)
    assert state == {"epoch": 1, "epoch_samples": 16}
    # A resume with a different per-worker split still skips the same number of global samples.
    assert DataPosition.from_state(state, global_batch=8) == position
    assert DataPosition.from_state({}, global_batch=8) == DataPosition()


def test_auto_precision_takes_bf16_only_where_the_cpu_has_it(monkeypatch):
    from raydiff.config import ExperimentConfig, apply_overrides
    from raydiff.train import precision

    cpu = torch.device("cpu")
    assert precision.resolve_precision("fp16", cpu) == "fp16"  # an explicit mode stays
    monkeypatch.setattr(precision, "native_cpu_bf16", lambda: False)
    assert precision.resolve_precision("auto", cpu) == "fp32"
    assert make_trainer(precision="auto").precision.precision == "fp32"
    monkeypatch.setattr(precision, "native_cpu_bf16", lambda: True)
    assert precision.resolve_precision("auto", cpu) == "bf16"
    # improved-diffusion's --use_fp16 wins over auto (it names a mode, auto does not).
    config = apply_overrides(ExperimentConfig(), ["precision=auto", "use_fp16=True"])
    assert config.train.precision == "fp16"
