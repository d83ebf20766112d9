"""bench/training_parity.py's own logic, without the reference code: loss windows, the agreement
rule (difference of the means within 2 x the larger seed-to-seed sd) and the printed table."""

from __future__ import annotations

import statistics
import sys

import pytest
from bench_script import load_bench_script


@pytest.fixture(scope="module")
def bench():
    return load_bench_script("training_parity")


def test_importing_the_script_loads_neither_torch_nor_the_reference(bench) -> None:
    # The helpers below run in CI, which has no improved-diffusion checkout.
    assert "improved_diffusion" not in sys.modules
    assert not hasattr(bench, "torch")


def test_window_means_keep_a_short_last_window(bench) -> None:
    assert bench.window_means([1, 2, 3, 4, 5], 2) == [1.5, 3.5, 5.0]
    assert bench.window_ends(5, 2) == [2, 4, 5]
    assert bench.window_means([1.0, 3.0], 100) == [2.0]
    with pytest.raises(ValueError):
        bench.window_means([1.0], 0)


def test_parse_seeds(bench) -> None:
    assert bench.parse_seeds("0,1,2") == [0, 1, 2]
    for bad in ("", "0,0", "-1", "a"):
        with pytest.raises(ValueError):
            bench.parse_seeds(bad)


def test_agreement_within_twice_the_larger_sd(bench) -> None:
    ref, ray = [1.0, 1.2, 1.4], [1.3, 1.35, 1.4]
    sd = statistics.stdev(ref)  # 0.2, the larger of the two
    out = bench.agreement(ref, ray)
    assert out["diff"] == pytest.approx(1.35 - 1.2)
    assert out["tolerance"] == pytest.approx(2 * sd)
    assert out["agree"] is True
    far = bench.agreement(ref, [x + 2 * sd + 0.01 for x in ref])
    assert far["agree"] is False
    edge = bench.agreement([0.0, 1.0], [1.0, 2.0], factor=1 / statistics.stdev([0.0, 1.0]))
    assert edge["agree"] is True  # |diff| == tolerance counts as agreeing


def test_agreement_without_a_spread_gives_no_verdict(bench) -> None:
    one_seed = bench.agreement([1.0], [1.5])
    assert one_seed["diff"] == pytest.approx(0.5)
    assert one_seed["agree"] is None and one_seed["tolerance"] is None
    assert bench.agreement([1.0, float("nan")], [1.0, 2.0])["agree"] is None
    assert bench.agreement([], [1.0, 2.0])["diff"] is None


def runs(final: dict[str, list[float]], bpd: dict[str, list[float]]) -> list[dict]:
    out = []
    for side in ("ref", "raydiff"):
        for seed, (loss, b) in enumerate(zip(final[side], bpd[side], strict=True)):
            out.append(
                {
                    "side": side,
                    "seed": seed,
                    "final_loss": loss,
                    "val_bpd": b,
                    "window_losses": [2 * loss, loss],
                }
            )
    return out


def test_summary_and_table(bench) -> None:
    records = runs(
        final={"ref": [0.050, 0.052, 0.054], "raydiff": [0.051, 0.053, 0.055]},
        bpd={"ref": [5.0, 5.1, 5.2], "raydiff": [6.0, 6.1, 6.2]},
    )
    summary = bench.summarize(records, ["final_loss", "val_bpd"])
    assert summary["final_loss"]["agree"] is True
    assert summary["val_bpd"]["agree"] is False
    assert summary["loss_windows"]["judged"] == 2 and summary["loss_windows"]["agree"] == 2
    table = bench.format_table(records, summary)
    lines = table.splitlines()
    assert lines[0].split() == ["side", "seed", "final_loss", "val_bpd"]
    assert lines[2].split() == ["ref", "0", "0.05000", "5.0000"]
    assert "ref all 0.05200 +- 0.00200 5.1000 +- 0.1000" in " ".join(table.split())
    assert "final_loss: agree" in table
    assert "val_bpd: DIFFER: |diff| 1 vs 2 x max sd 0.2" in table
    assert "2/2 windows agree" in table
    curve = bench.format_curve(summary, [100, 200])
    assert curve.splitlines()[1].split()[0] == "100"


def test_table_with_one_seed_says_there_is_no_verdict(bench) -> None:
    records = runs(final={"ref": [0.05], "raydiff": [0.06]}, bpd={"ref": [5.0], "raydiff": [5.5]})
    summary = bench.summarize(records, ["final_loss", "val_bpd"])
    table = bench.format_table(records, summary)
    assert "no verdict" in table and "windows agree" not in table
    assert "0.05000 +- -" in table


def test_merging_runs_of_other_seeds(bench) -> None:
    def result(seeds: list[int], **config: object) -> dict:
        runs = [
            {"side": side, "seed": seed, "final_loss": 0.1 + seed / 100, "val_bpd": 4.0,
             "window_losses": [0.2, 0.1]}
            for seed in seeds
            for side in ("ref", "raydiff")
        ]  # fmt: skip
        return {  # the seeds show in the arguments and in the config's train and data seeds
            "args": {"seeds": ",".join(map(str, seeds)), "seed_list": seeds, "steps": 10},
            "config": {
                "train": {"seed": seeds[0], "max_steps": 10},
                "data": {"seed": seeds[0], "image_size": 32},
                "model": dict(config),
            },
            "reference_sha256": {"a": "1"},
            "window_ends": [5, 10],
            "runs": runs,
            "summary": {},
        }

    merged = bench.merge_results([result([0, 1]), result([2])])
    assert sorted((r["side"], r["seed"]) for r in merged["runs"]) == sorted(
        (side, seed) for seed in (0, 1, 2) for side in ("ref", "raydiff")
    )
    assert merged["summary"]["final_loss"]["ref"]["n"] == 3
    with pytest.raises(ValueError, match="appear twice"):
        bench.merge_results([result([0, 1]), result([1])])
    with pytest.raises(ValueError, match=r"differ in more than their seeds \(config.model.num_ch"):
        bench.merge_results([result([0]), result([1], num_channels=64)])
