"""A Ray run whose --output is an S3 URI: a real S3 server (SeaweedFS, tests/s3_server.py, one
for the session: conftest.py's ``s3_server``) on 127.0.0.1 that refuses a wrong or read-only
key, the AWS environment a user would set (keys, region, AWS_ENDPOINT_URL), two workers on the
shared cluster.

The environment is set in this test's process only, after the shared ``ray_cluster`` fixture
started Ray: its workers never see it. That is the point: the driver builds the S3 filesystem
from its environment (raydiff.storage, keys included) and that object travels to Ray Train's
controller, the workers and the loss-history actor, so a cluster started without the variables
(a remote one, or this one) writes to the same bucket.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from s3_server import ACCESS_KEY, READ_ONLY_KEY, S3Server
from test_training import GLOBAL_BATCH, run, tiny_config

pytestmark = pytest.mark.integration


def test_a_refused_bucket_is_one_line_before_anything_starts(
    s3_server: S3Server, s3_bucket: str, tiny_dataset, capsys, monkeypatch, tmp_path
) -> None:
    """A key the store does not know, a read-only key, a bucket the key may not write: `raydiff
    train` says so in one line with the store's answer, as a user's mistake, before anything
    starts (nothing in the bucket); so does `raydiff evaluate fid` for its --out."""
    from tiny_model import tiny_model

    from raydiff.cli import main
    from raydiff.cli.exit_codes import EXIT_USER_ERROR

    argv = ["train", "--data", str(tiny_dataset.path), "--single-process", "--max-steps", "1"]
    argv += [arg for setting in tiny_model() for arg in ("--set", setting)]
    cases = {
        "INVALID_ACCESS_KEY_ID": ("unknown-key", f"s3://{s3_bucket}/refused/a"),
        "ACCESS_DENIED": (READ_ONLY_KEY, f"s3://{s3_bucket}/refused/b"),
        "ACCESS_DENIED: Access Denied": (ACCESS_KEY, "s3://another-bucket/refused/c"),
    }
    for answer, (key, uri) in cases.items():
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        assert main([*argv, "--output", uri]) == EXIT_USER_ERROR
        printed = capsys.readouterr().err.strip().splitlines()
        assert len(printed) == 1, printed
        assert printed[0].startswith(
            f"raydiff train: error: --output {uri}: the object store refused it ({answer}"
        ), printed
    # An evaluation's --out is checked before it computes anything (minutes of Inception).
    samples = tmp_path / "samples_4x16x16x1.npz"
    np.savez(samples, np.zeros((4, 16, 16, 1), np.uint8))
    uri = "s3://another-bucket/refused/fid.json"
    fid = ["evaluate", "fid", "--samples", str(samples), "--reference", str(tiny_dataset.path)]
    assert main([*fid, "--split", "val", "--out", uri]) == EXIT_USER_ERROR
    printed = capsys.readouterr().err.strip().splitlines()
    assert len(printed) == 1 and printed[0].startswith(
        "raydiff evaluate: error: --out s3://another-bucket/refused: the object store refused it "
        "(ACCESS_DENIED"
    ), printed
    assert not s3_server.keys(s3_bucket, "refused/")


def test_a_run_on_s3_keeps_everything_there_and_resumes_from_it(
    ray_cluster, tiny_dataset, s3_server, s3_bucket, tmp_path, monkeypatch
):
    """Train into the bucket, resume from it evaluating each of its checkpoints while it trains
    (the evaluation actor's test: samples, grid, the bound, metrics.jsonl and ``eval/*``
    scalars beside the trainer's), then sample and evaluate the checkpoint there."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from raydiff.storage import as_location, download
    from raydiff.train.checkpoint import load_checkpoint

    uri = f"s3://{s3_bucket}/runs/r1"
    overrides = {"train.save_interval": 2, "train.sample_interval": 2}
    first = run(tiny_config(tiny_dataset.path, **{"train.max_steps": 2, **overrides}), uri)
    assert first["step"] == 2
    assert first["checkpoint"] == f"{uri}/checkpoint_000002"
    assert first["output_dir"] == uri

    keys = s3_server.keys(s3_bucket)
    run_keys = {k.removeprefix("runs/r1/") for k in keys if k.startswith("runs/r1/")}
    assert {
        "config.json",
        "checkpoint_000002/files.json",
        "checkpoint_000002/model.pt",
        "checkpoint_000002/trainer.pt",
        "checkpoint_000002/progress.json",
        "samples/samples_000002.png",
    } <= run_keys, sorted(run_keys)
    assert any(k.startswith("tensorboard/events.out.tfevents.") for k in run_keys), run_keys
    assert not Path("s3:").exists()  # nothing went to a local folder named after the URI

    # A user's view: download the events and read them.
    events_dir = download(as_location(uri) / "tensorboard", tmp_path / "tb1")
    events = EventAccumulator(str(events_dir), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [2]

    # The same command with more steps continues from the checkpoint in the bucket.
    # The resumed run evaluates its checkpoints (4 and 6) while it trains
    # (--evaluate-checkpoints): the samples, grid, evaluation.json, metrics.jsonl and eval/*
    # scalars land in the bucket too.
    evaluation = {
        "data.val_split": "val",
        "evaluation.every_checkpoint": "true",
        "evaluation.num_samples": 4,
        "evaluation.sample_respacing": "ddim4",
        "evaluation.bpd_images": 2,
        "evaluation.cpus": 0.5,
    }
    config = tiny_config(tiny_dataset.path, **{"train.max_steps": 6, **overrides, **evaluation})
    second = run(config, uri)
    assert second["step"] == 6
    assert second["checkpoint"] == f"{uri}/checkpoint_000006"
    assert np.isfinite(second["evaluation"]["bpd_val"])
    evaluated = f"{uri}/evaluation/checkpoint_000006"
    assert second["evaluation"]["samples"] == f"{evaluated}/samples_4x16x16x1.npz"
    keys = {k.removeprefix("runs/r1/") for k in s3_server.keys(s3_bucket) if "runs/r1/" in k}
    for step in (4, 6):
        folder = f"evaluation/checkpoint_{step:06d}"
        assert {f"{folder}/evaluation.json", f"{folder}/grid.png"} <= keys, sorted(keys)
        assert f"{folder}/samples_4x16x16x1.npz" in keys
    lines = (as_location(uri) / "evaluation" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [4, 6]
    final_dir = download(as_location(second["checkpoint"]), tmp_path / "checkpoint_000006")
    final = load_checkpoint(final_dir)
    assert final["trainer"]["step"] == 6
    # Every step's losses are in the loss history: checkpoint 2's went on (the actor loaded it).
    assert int(final["trainer"]["sampler"]["loss_counts"].sum()) == 6 * GLOBAL_BATCH

    events_dir = download(as_location(uri) / "tensorboard", tmp_path / "tb2")
    events = EventAccumulator(str(events_dir), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [2, 4, 6]
    assert sorted(e.step for e in events.Scalars("train/loss_step")) == [1, 2, 3, 4, 5, 6]
    # The second run trained steps 3 to 6 only: it resumed, it did not start from step 0.
    files = sorted(
        (f for f in events_dir.glob("events.out.tfevents.*") if f.suffix != ".evaluation"),
        key=lambda f: f.name.split(".")[3],
    )
    assert len(files) == 2  # the trainer's, one per run; the evaluator writes *.evaluation
    second_events = EventAccumulator(str(files[-1]), size_guidance={"scalars": 0})
    second_events.Reload()
    assert [e.step for e in second_events.Scalars("train/loss_step")] == [3, 4, 5, 6]
    assert "runs/r1/samples/samples_000006.png" in s3_server.keys(s3_bucket)

    # Samples from the checkpoint in the bucket, into the bucket; the folder is refused once full.
    from raydiff.errors import UserInputError
    from raydiff.orchestrate.sampling import run_sampling
    from raydiff.sample.options import SampleOptions

    options = SampleOptions(
        checkpoint=second["checkpoint"],
        num_samples=3,
        out=f"s3://{s3_bucket}/samples/s1",
        timestep_respacing="ddim4",
        use_ddim=True,
        batch_size=2,
    )
    result = run_sampling(options)
    assert str(result.npz).startswith(f"s3://{s3_bucket}/samples/s1/samples_3x")
    sample_keys = {k for k in s3_server.keys(s3_bucket) if k.startswith("samples/s1/")}
    assert {
        "samples/s1/grid.png",
        "samples/s1/sampling.json",
        *(f"samples/s1/images/sample_{i:06d}.png" for i in range(3)),
    } <= sample_keys, sorted(sample_keys)
    with pytest.raises(UserInputError, match="is not empty"):
        run_sampling(options)

    # The bound of the checkpoint in the bucket: its run folder there gets the results and the
    # TensorBoard scalars, as a local run's does.
    from raydiff.evaluate.options import BpdOptions
    from raydiff.orchestrate.model_actor import run_bpd

    bpd = run_bpd(
        BpdOptions(
            checkpoint=second["checkpoint"],
            split="val",
            num_images=2,
            batch_size=2,
            timestep_respacing="10",
        )
    )
    results = f"{uri}/evaluation/checkpoint_000006/bpd_val_respaced10"
    assert (str(bpd.json_path), str(bpd.terms_path)) == (f"{results}.json", f"{results}_terms.npz")
    assert bpd.tracked == [f"tensorboard: tensorboard --logdir {uri}/tensorboard"]
    written = json.loads(as_location(f"{results}.json").read_text())
    assert written["bpd"] == bpd.summary["bpd"] and written["checkpoint"] == second["checkpoint"]
    with np.load(download(as_location(f"{results}_terms.npz"), tmp_path / "t.npz")) as terms:
        assert terms["vb"].shape == (2, 10)
    # A mistake about a checkpoint in the bucket names it there, not its temporary download.
    from raydiff.sample.load import load_sampling_model

    with pytest.raises(UserInputError) as refused:
        load_sampling_model(second["checkpoint"], model_flags="--image_size 16")
    assert second["checkpoint"] in str(refused.value) and "raydiff-download" not in str(
        refused.value
    )

    # FID of the samples in the bucket (a stand-in Inception): the reference is the run's
    # dataset, the JSON goes beside the samples there, the scalars to the run's TensorBoard.
    from tiny_model import TinyFeatures

    from raydiff.evaluate import fid
    from raydiff.evaluate.samples_fid import run_fid

    monkeypatch.setattr(fid, "load_inception", lambda path, device="cpu": TinyFeatures())
    scores = run_fid(samples=options.out, reference=None, split="val")
    assert scores.summary["reference"] == str(tiny_dataset.path)
    assert (
        scores.summary["num_samples"] == 3
        and str(scores.json_path) == f"{options.out}/fid_val.json"
    )
    assert json.loads(as_location(scores.json_path).read_text())["fid"] == scores.summary["fid"]

    events_dir = download(as_location(uri) / "tensorboard", tmp_path / "tb3")
    events = EventAccumulator(str(events_dir), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("eval/bpd_val")] == [4, 6]  # while it trained
    assert [e.step for e in events.Scalars("eval/bpd_val_respaced10")] == [6]
    assert [e.step for e in events.Scalars("eval/fid_val_ddim4")] == [6]  # DDIM, 4 steps
    assert not Path("s3:").exists()
