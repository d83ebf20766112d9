"""Bad training configs fail before Ray starts or any worker runs, naming the field."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from tiny_model import tiny_model

from raydiff.cli import main
from raydiff.config import ExperimentConfig, apply_overrides, load_config, to_dict
from raydiff.config.resolve import fit_to_data
from raydiff.data import PrepareOptions, prepare_dataset
from raydiff.data.manifest import load_manifest
from raydiff.errors import ConfigError
from raydiff.orchestrate.training_job import run_training_job
from raydiff.train import preflight


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("checks")
    images = np.random.default_rng(0).integers(0, 256, (40, 16, 16), np.uint8)
    np.savez(root / "tiny.npz", images)
    out = root / "data"
    prepare_dataset(
        PrepareOptions(
            source=str(root / "tiny.npz"),
            out=str(out),
            image_size=16,
            channels=1,
            val_count=8,
            num_workers=1,
            progress=False,
        )
    )
    return out


BASE_OVERRIDES = tiny_model(attention="8")


def config(dataset, *overrides):
    base = [*BASE_OVERRIDES, f"data.data_dir={dataset}"]
    return apply_overrides(ExperimentConfig(), [*base, *overrides])


def check_run(cfg, **kwargs):
    preflight.check_run(cfg, manifest=load_manifest(cfg.data.data_dir), **kwargs)


def finished_checkpoint(directory, *, step):
    """A checkpoint folder that is complete as far as the run checks look (progress + listing)."""
    directory.mkdir(parents=True)
    progress = json.dumps({"step": step, "epoch": 0, "epoch_samples": 8 * step})
    (directory / "progress.json").write_text(progress)
    (directory / "files.json").write_text(json.dumps({"progress.json": len(progress)}))


def test_a_good_config_passes(dataset):
    check_run(config(dataset))


def test_batch_not_divisible_by_workers_and_microbatch(dataset):
    with pytest.raises(ValueError, match=r"train.batch_size=10.*number of workers \(3\)"):
        check_run(config(dataset, "train.batch_size=10", "scaling.num_workers=3"))
    with pytest.raises(ValueError, match=r"train.batch_size=12.*microbatch=4"):
        check_run(
            config(dataset, "train.batch_size=12", "scaling.num_workers=2", "train.microbatch=4")
        )


def test_image_size_or_channels_unlike_the_shards(dataset):
    with pytest.raises(ValueError, match=r"image_size mismatch.*16x16"):
        check_run(config(dataset, "model.image_size=32", "model.attention_resolutions=16"))
    with pytest.raises(ValueError, match="channels mismatch"):
        check_run(config(dataset, "model.in_channels=3"))


def test_missing_data_path(tmp_path, dataset):
    with pytest.raises(FileNotFoundError, match=r"no manifest\.json.*raydiff prepare"):
        check_run(config(dataset, f"data.data_dir={tmp_path / 'nowhere'}"))  # the manifest


def test_missing_resume_and_init_paths(tmp_path, dataset):
    with pytest.raises(FileNotFoundError, match="--resume"):
        check_run(config(dataset), resume=tmp_path)
    with pytest.raises(FileNotFoundError, match="init_checkpoint"):
        check_run(config(dataset, f"train.init_checkpoint={tmp_path / 'x.pt'}"))


def test_single_process_splits_the_batch_over_one_worker(dataset):
    # scaling.num_workers is for Ray runs; one process trains the whole batch.
    check_run(config(dataset, "train.batch_size=10", "scaling.num_workers=3"), num_workers=1)
    with pytest.raises(ValueError, match=r"per-worker batch 10.*microbatch=4"):
        check_run(config(dataset, "train.batch_size=10", "train.microbatch=4"), num_workers=1)


def test_single_process_cli_refuses_a_bad_resume_before_loading_data(dataset, tmp_path, capsys):
    sets = [f"--set={item}" for item in BASE_OVERRIDES]
    args = ["train", "--single-process", *sets, "--data", str(dataset)]
    args += ["--output", str(tmp_path / "run")]
    assert main([*args, "--resume", str(tmp_path / "nowhere")]) == 1
    assert "--resume:" in (err := capsys.readouterr().err) and "is not a raydiff checkpoint" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine with no GPU")
def test_single_process_with_use_gpu_and_no_gpu_is_refused_in_one_line(dataset, tmp_path, capsys):
    """`--single-process` trains on the GPU with scaling.use_gpu (as a Ray run's workers do);
    without one it says so before loading anything."""
    sets = [f"--set={item}" for item in BASE_OVERRIDES]
    args = ["train", "--single-process", *sets, "--set=scaling.use_gpu=true"]
    assert main([*args, "--data", str(dataset), "--output", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert "scaling.use_gpu=true, but torch sees no CUDA GPU here" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "run").exists()


def test_unknown_schedule_from_the_command_line(capsys):
    assert main(["train", "--set", "noise_schedule=quadratic"]) == 1
    assert "diffusion.noise_schedule='quadratic'" in capsys.readouterr().err


def test_refusals_and_finished_runs_return_without_ray(dataset, tmp_path):
    """run_training_job validates first (a bad batch split: no Ray import, no cluster, no run
    folder), and re-running a run that reached train.max_steps trains and starts nothing.
    Both in one fresh interpreter (each costs a torch import)."""
    bad = to_dict(config(dataset, "train.batch_size=10", "scaling.num_workers=3"))
    finished = tmp_path / "finished"
    finished_checkpoint(finished / "checkpoint_000008", step=8)
    done = to_dict(config(dataset, "train.max_steps=8"))
    code = (
        "import sys, json; from raydiff.orchestrate.training_job import run_training_job\n"
        "from raydiff.config import ExperimentConfig, from_dict\n"
        "def no_ray():\n"
        "    return not any(m == 'ray' or m.startswith('ray.') for m in sys.modules)\n"
        f"bad = from_dict(ExperimentConfig, json.loads({json.dumps(json.dumps(bad))}))\n"
        "try:\n"
        f"    run_training_job(bad, output_dir={str(tmp_path / 'run')!r})\n"
        "except ValueError as e:\n"
        "    assert 'train.batch_size' in str(e), e\n"
        "    assert no_ray()\n"
        "    print('refused')\n"
        f"done = from_dict(ExperimentConfig, json.loads({json.dumps(json.dumps(done))}))\n"
        f"result = run_training_job(done, output_dir={str(finished)!r})\n"
        "assert no_ray()\n"
        "print(json.dumps(result))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    lines = run.stdout.strip().splitlines()
    assert "refused" in lines
    assert not (tmp_path / "run").exists()
    result = json.loads(lines[-1])
    assert result["step"] == 8
    assert result["checkpoint"] == str(finished / "checkpoint_000008")
    assert "nothing to train" in run.stderr and "--max-steps" in run.stderr


def test_single_process_on_a_finished_run_trains_nothing(dataset, tmp_path, caplog, capsys):
    """`--single-process` on a run at train.max_steps returns before loading data or a model,
    with the metrics its last checkpoint kept (a resumed sweep trial reports them to Tune)."""
    out = tmp_path / "run"
    finished_checkpoint(out / "checkpoint_000008", step=8)
    (out / "checkpoint_000008" / "metrics.json").write_text(json.dumps({"loss": 0.25}))
    overrides = [arg for o in BASE_OVERRIDES for arg in ("--set", o)]
    argv = ["train", "--single-process", *overrides, "--data", str(dataset)]
    with caplog.at_level("WARNING"):
        code = main([*argv, "--output", str(out), "--max-steps", "8"])
    assert code == 0
    assert "nothing to train" in caplog.text
    assert "final metrics: step 8  loss 0.2500" in capsys.readouterr().out
    # No validation, sample grid, TensorBoard or new checkpoint: the folder is as it was.
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint_000008"]


def test_a_config_keeps_its_data_dir_unless_data_is_given(dataset, tmp_path, capsys):
    """`--data` defaults to the config's data.data_dir (a preset's own dataset), and only the
    embedded demo path is prepared on the fly."""
    missing = tmp_path / "cifar10"
    preset = tmp_path / "preset.yaml"
    preset.write_text(f"data:\n  data_dir: {missing}\n")
    args = ["train", "--config", str(preset), "--single-process", "--output", str(tmp_path / "r")]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"no manifest.json in '{missing}'" in err and "raydiff prepare" in err
    assert not missing.exists() and not (tmp_path / "r").exists()
    # --data wins over the config's folder: the checks pass on it (the run is already finished,
    # so nothing trains).
    overrides = [arg for o in BASE_OVERRIDES for arg in ("--set", o)]
    finished_checkpoint(tmp_path / "r" / "checkpoint_000001", step=1)
    assert main([*args, *overrides, "--data", str(dataset), "--max-steps", "1"]) == 0


def test_continuing_a_run_with_other_model_or_diffusion_settings_is_refused(dataset, tmp_path):
    from raydiff.train.preflight import check_resume_compatible

    ckpt = tmp_path / "run" / "checkpoint_000004"
    finished_checkpoint(ckpt, step=4)
    trained = config(dataset, "noise_schedule=cosine", "dropout=0.1")
    (ckpt / "config.json").write_text(json.dumps(to_dict(trained)))
    check_resume_compatible(trained, ckpt)
    # Dropout and gradient checkpointing may change; the schedule and the width may not.
    check_resume_compatible(config(dataset, "noise_schedule=cosine", "use_checkpoint=True"), ckpt)
    changed = config(dataset, "noise_schedule=linear", "num_channels=64")
    with pytest.raises(ValueError, match=r"diffusion\.noise_schedule: checkpoint 'cosine'") as err:
        check_resume_compatible(changed, ckpt)
    assert "model.num_channels: checkpoint 32, now 64" in str(err.value)
    assert "train.init_checkpoint=" in str(err.value)
    # The CLI refuses before loading data or building a model (the run folder's newest
    # checkpoint is what re-running continues).
    overrides = [arg for o in [*BASE_OVERRIDES, "noise_schedule=linear"] for arg in ("--set", o)]
    argv = ["train", "--single-process", *overrides, "--data", str(dataset)]
    assert main([*argv, "--output", str(tmp_path / "run"), "--max-steps", "8"]) == 1


def test_an_output_name_ray_would_rename_is_refused(dataset, tmp_path):
    """Ray Train stores checkpoints under storage_path/name: a name it cannot use must not be
    quietly changed (checkpoints would land beside the run folder, and resume would miss them)."""
    cfg = config(dataset)
    with pytest.raises(ValueError, match=r"'lr=1e-3' becomes the Ray Train run name.*'lr-1e-3'"):
        run_training_job(cfg, output_dir=str(tmp_path / "lr=1e-3"))
    assert not (tmp_path / "lr=1e-3").exists()


def test_resume_into_a_folder_that_holds_a_run_is_refused(dataset, tmp_path):
    from raydiff.train.preflight import check_resume_target

    ckpt = tmp_path / "old" / "checkpoint_000004"
    finished_checkpoint(ckpt, step=4)
    check_resume_target(tmp_path / "new", ckpt)  # a new folder: fine
    check_resume_target(tmp_path / "old", None)  # continuing the folder's own run: fine
    with pytest.raises(ValueError, match=r"already holds a run \(checkpoint_000004\)"):
        check_resume_target(tmp_path / "old", ckpt)


def test_a_batch_the_workers_cannot_split_is_refused_before_preparing_data(
    tmp_path, monkeypatch, capsys
):
    """The demo's dataset is prepared on the fly: a config mistake must not wait for that."""
    monkeypatch.chdir(tmp_path)  # the demo's data/fashion-mnist does not exist here
    argv = ["train", "--set", "batch_size=3", "--num-workers", "2", "--output", "run"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "batch_size=3" in err and "number of workers (2)" in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "data").exists() and not (tmp_path / "run").exists()


def test_a_preset_takes_the_datas_channels(dataset):
    """The data here is greyscale: a model configured for RGB trains on it with 1 channel,
    unless the user set in_channels themselves."""
    rgb = config(dataset, "model.in_channels=3")
    manifest = load_manifest(str(dataset))
    fitted = fit_to_data(rgb, manifest)
    assert fitted.model.in_channels == 1 and fitted.data.channels == 1
    check_run(fitted)
    with pytest.raises(ConfigError, match=r"model\.in_channels=3 is invalid.*1-channel") as err:
        fit_to_data(rgb, manifest, keep_channels=True)
    assert err.value.field == "in_channels"


def test_an_image_size_unlike_the_datas_names_both_ways_out(dataset):
    big = config(dataset, "model.image_size=32", "model.attention_resolutions=16")
    with pytest.raises(ConfigError, match=r"--set image_size=16.*--image-size 32") as err:
        fit_to_data(big, load_manifest(str(dataset)))
    assert (err.value.section, err.value.field) == ("model", "image_size")


def test_the_cli_trains_a_preset_on_data_with_other_channels(dataset, tmp_path, caplog):
    """`raydiff train` with an RGB-configured model on grey data: no 'prepare again'."""
    finished_checkpoint(tmp_path / "r" / "checkpoint_000001", step=1)
    preset = tmp_path / "rgb.yaml"  # as a preset for RGB data says it
    preset.write_text("model:\n  in_channels: 3\n")
    sets = [arg for o in BASE_OVERRIDES if "in_channels" not in o for arg in ("--set", o)]
    argv = ["train", "--config", str(preset), "--single-process", "--data", str(dataset)]
    argv += ["--max-steps", "1", *sets, "--output", str(tmp_path / "r")]
    with caplog.at_level("INFO"):
        assert main(argv) == 0
    assert "1-channel images: model.in_channels=1 (the config had 3)" in caplog.text
    assert main([*argv, "--set", "in_channels=3"]) == 1


def test_the_cli_refuses_an_image_size_unlike_the_datas_naming_the_size_that_fits(tmp_path, capsys):
    """`--set model.image_size=64` on 32-pixel data: the demo's model at 64 pixels has no 8x8
    level for its attention, but the mistake is the size, so the error names image_size and
    the size that fits the data, before the model's own checks speak."""
    images = np.random.default_rng(1).integers(0, 256, (12, 32, 32), np.uint8)
    np.savez(tmp_path / "small.npz", images)
    data = tmp_path / "data32"
    prepare_dataset(
        PrepareOptions(
            source=str(tmp_path / "small.npz"),
            out=str(data),
            image_size=32,
            val_count=2,
            num_workers=1,
            progress=False,
        )
    )
    with pytest.raises(ConfigError, match=r"model\.attention_resolutions='8'"):
        load_config("demo", ["model.image_size=64"])  # without the data: the consequence
    argv = ["train", "--set", "model.image_size=64", "--data", str(data)]
    assert main([*argv, "--output", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("raydiff train: error: model.image_size=64 is invalid: the dataset")
    assert "32x32 images: train at their size with --set image_size=32" in err
    assert "attention_resolutions" not in err and not (tmp_path / "run").exists()
    # The same size given bare reaches the same check.
    assert main(["train", "--set", "image_size=64", "--data", str(data), "--output", "r"]) == 1
    assert "--set image_size=32" in capsys.readouterr().err
    # A sweep whose base config has that size is refused the same way, before any trial.
    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(
        f"base: demo\nset: {{data_dir: {data}, image_size: 64}}\n"
        "search_space: {lr: {grid: [1.0e-4, 2.0e-4]}}\n"
    )
    assert main(["sweep", "--config", str(sweep_file), "--output", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert "model.image_size=64 is invalid" in err and "--set image_size=32" in err, err
    assert "attention_resolutions" not in err and not (tmp_path / "s").exists()


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """16x16 grey images with 4 classes."""
    root = tmp_path_factory.mktemp("labelled")
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (24, 16, 16), np.uint8)
    np.savez(root / "tiny.npz", images, np.arange(24) % 4)
    out = root / "data"
    source = str(root / "tiny.npz")
    prepare_dataset(
        PrepareOptions(
            source=source, out=str(out), image_size=16, channels=1, val_count=8, progress=False
        )
    )
    return out


def test_a_class_conditional_model_takes_the_datas_class_count(labelled, caplog):
    """improved-diffusion's constant 1000 classes on a 4-class dataset would leave 996 unused
    embeddings, and a classifier of the same data could not guide the model."""
    manifest = load_manifest(str(labelled))
    cond = config(labelled, "model.class_cond=true")
    assert cond.model.num_classes == 1000
    with caplog.at_level("INFO", logger="raydiff.config.resolve"):
        fitted = fit_to_data(cond, manifest)
    assert fitted.model.num_classes == 4 and "the dataset has 4 classes" in caplog.text
    check_run(fitted)
    # Set by the config (a preset, a file or --set): a count unlike the data's names both.
    for count in (5, 3):
        with pytest.raises(ConfigError, match=rf"num_classes={count} is invalid.*has 4 classes"):
            fit_to_data(
                config(labelled, "model.class_cond=true", f"model.num_classes={count}"),
                manifest,
                keep_classes=True,
            )
    same = config(labelled, "model.class_cond=true", "model.num_classes=4")
    assert fit_to_data(same, manifest, keep_classes=True) == same
    # An unconditional model keeps its (unused) count.
    assert fit_to_data(config(labelled), manifest).model.num_classes == 1000


def test_the_cli_fits_the_class_count_unless_the_config_sets_it(labelled, tmp_path, capsys):
    sets = [arg for o in BASE_OVERRIDES for arg in ("--set", o)]
    argv = ["train", "--single-process", "--data", str(labelled), "--max-steps", "1", *sets]
    argv += ["--set", "class_cond=true", "--set", "num_classes=7"]
    assert main([*argv, "--output", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert "num_classes=7" in err and "has 4 classes" in err
    assert not (tmp_path / "r").exists()
