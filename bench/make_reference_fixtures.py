"""Write golden values computed by the reference implementations, for raydiff's parity tests.

CI has no copy of openai/improved-diffusion or openai/guided-diffusion, so the numbers they
produce are frozen here into ``tests/unit/fixtures/reference_values.npz`` and
``tests/unit/test_reference_parity.py`` recomputes each one with ``raydiff.core``.

Usage (from the repository root, with the reference packages checked out under ``.reference``)::

    python bench/make_reference_fixtures.py --reference-root .reference

To refresh only some case kinds and keep every other case and array of the existing file byte for
byte, add ``--only KIND ...`` (e.g. ``--only loss_second_moment``). Prefer it over a full
regeneration on another machine: NumPy's float64 ``log`` is dispatched per CPU (AVX-512 vs AVX2)
and may differ in the last bit, which would rewrite the bit-exact schedule goldens.

The file holds float arrays plus one JSON document (key ``__meta__``) that lists every *case*:
what to compute (kind and parameters), which stored arrays are its inputs and which are the
expected outputs. The test walks that list, so adding a case here needs no change to the test
unless it introduces a new kind.

Reference quirks handled here, without touching the reference's math:
- NumPy 2 removed ``np.int``, which ``LossSecondMomentResampler.__init__`` uses; this script sets
  ``np.int = int`` before constructing it (the alias meant exactly the builtin ``int``).
- guided-diffusion's ``fp16_util`` imports its ``logger`` module at import time (only used by
  ``MixedPrecisionTrainer``); logger.py is not part of the local copy, so an empty stand-in
  module is registered under ``guided_diffusion.logger``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import inspect
import io
import json
import math
import sys
import types
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Where the reference code was read from (the search index's stored versions); recorded in the
# fixture so a change of reference is visible in review.
REFERENCE_SOURCES: dict[str, dict[str, str]] = {
    "openai/improved-diffusion": {
        "improved_diffusion/gaussian_diffusion.py": "6051920c0865d53146db7841bfba43c3e67edef6",
        "improved_diffusion/unet.py": "6051920c0865d53146db7841bfba43c3e67edef6",
        "improved_diffusion/respace.py": "6051920c0865d53146db7841bfba43c3e67edef6",
        "improved_diffusion/script_util.py": "6051920c0865d53146db7841bfba43c3e67edef6",
        "improved_diffusion/fp16_util.py": "6051920c0865d53146db7841bfba43c3e67edef6",
        "improved_diffusion/losses.py": "51fc1064dff882cce87b37fb0bcc0eddfd450f56",
        "improved_diffusion/resample.py": "51fc1064dff882cce87b37fb0bcc0eddfd450f56",
        "improved_diffusion/nn.py": "e593c92b3cd143ed8e858eb70e4a6554a8f23933",
    },
    "openai/guided-diffusion": {
        "guided_diffusion/gaussian_diffusion.py": "aca3097a89fab9c9962b22224d5f48950eb57e29",
        "guided_diffusion/losses.py": "aca3097a89fab9c9962b22224d5f48950eb57e29",
        "guided_diffusion/nn.py": "aca3097a89fab9c9962b22224d5f48950eb57e29",
        "guided_diffusion/respace.py": "aca3097a89fab9c9962b22224d5f48950eb57e29",
        "guided_diffusion/resample.py": "aca3097a89fab9c9962b22224d5f48950eb57e29",
        "guided_diffusion/unet.py": "18ff408c2d27cd385fa2735c655daa0e3c1e48ef",
        "guided_diffusion/script_util.py": "18ff408c2d27cd385fa2735c655daa0e3c1e48ef",
        "guided_diffusion/fp16_util.py": "3ca40d42e27c41bf4d8df3318dac66d755b2d17e",
    },
}

SCHEDULE_ATTRS = (
    "betas",
    "alphas_cumprod",
    "alphas_cumprod_prev",
    "alphas_cumprod_next",
    "sqrt_alphas_cumprod",
    "sqrt_one_minus_alphas_cumprod",
    "log_one_minus_alphas_cumprod",
    "sqrt_recip_alphas_cumprod",
    "sqrt_recipm1_alphas_cumprod",
    "posterior_variance",
    "posterior_log_variance_clipped",
    "posterior_mean_coef1",
    "posterior_mean_coef2",
)
# Arrays this long are stored as a SHA-256 of their float64 bytes plus a strided sample, to keep
# the fixture under 1.5 MB; equality of the hash is still a bit-exact check.
FULL_ARRAY_MAX_LEN = 1000

MEAN_TYPES = ("PREVIOUS_X", "START_X", "EPSILON")
VAR_TYPES = ("FIXED_SMALL", "FIXED_LARGE", "LEARNED", "LEARNED_RANGE")
LOSS_TYPES = ("MSE", "RESCALED_MSE", "KL", "RESCALED_KL")


# ----------------------------------------------------------------------------------------------
# Deterministic stand-ins shared with tests/unit/test_reference_parity.py. They must stay
# byte-for-byte identical there; the fixture stores their outputs on fixed inputs
# (``fingerprint/*``) and the test checks them first, so a drift fails loudly.
# ----------------------------------------------------------------------------------------------


def fake_model(learn_sigma: bool) -> Callable[..., torch.Tensor]:
    """A fixed smooth function of (x, t) standing in for a trained network.

    It uses ``t`` (so timestep mapping/rescaling matters) and returns 2C channels when the
    variance is learned; the variance half lies in (-1, 1), the LEARNED_RANGE domain.
    """

    def model(x: torch.Tensor, t: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        tt = t.float().view(-1, *([1] * (x.dim() - 1)))
        mean = torch.tanh(0.8 * x - 0.0007 * tt) + 0.1 * torch.sin(2.0 * x + 0.003 * tt)
        if not learn_sigma:
            return mean
        var = torch.tanh(0.6 * x + 0.0011 * tt - 0.2)
        return torch.cat([mean, var], dim=1)

    return model


def cond_fn(x: torch.Tensor, t: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    """A fixed stand-in for a classifier gradient grad_x log p(y | x_t)."""
    return -0.3 * x + 0.0005 * t.float().view(-1, *([1] * (x.dim() - 1)))


def deterministic_weights(shapes: Iterable[tuple[str, tuple[int, ...]]]) -> dict[str, torch.Tensor]:
    """Seeded non-zero weights for every state-dict entry (re-randomises zero-initialised layers).

    Each tensor is drawn from its own generator seeded by the CRC32 of its key, so the result
    depends only on (key, shape), not on module construction order.
    """
    out: dict[str, torch.Tensor] = {}
    for key, shape in shapes:
        gen = torch.Generator().manual_seed(zlib.crc32(key.encode()))
        w = torch.randn(tuple(shape), generator=gen, dtype=torch.float32)
        if len(shape) >= 2:
            w = w / math.sqrt(math.prod(shape[1:]))  # fan-in scaling keeps activations O(1)
        elif key.endswith("weight"):
            w = 1.0 + 0.1 * w  # normalisation scales
        else:
            w = 0.1 * w  # biases
        out[key] = w
    return out


# ----------------------------------------------------------------------------------------------


class FixtureWriter:
    """Collects arrays and case descriptions, then writes one compressed npz."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.cases: list[dict[str, Any]] = []

    def put(self, key: str, value: torch.Tensor | np.ndarray) -> str:
        """Store an array under a unique key and return the key."""
        assert key not in self.arrays, f"duplicate fixture key {key}"
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu().numpy()
        self.arrays[key] = np.asarray(value)
        return key

    def case(self, kind: str, name: str, **fields: Any) -> None:
        """Record one check: ``kind`` selects the recomputation in the test."""
        self.cases.append({"kind": kind, "name": name, **fields})

    def write(self, path: Path, meta: dict[str, Any]) -> int:
        """Write the npz (with ``__meta__`` JSON) and return its size in bytes."""
        meta = {**meta, "cases": self.cases}
        payload = dict(self.arrays)
        payload["__meta__"] = np.frombuffer(json.dumps(meta, indent=1).encode(), dtype=np.uint8)
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        np.savez_compressed(buf, **payload)
        path.write_bytes(buf.getvalue())
        return path.stat().st_size


def case_array_keys(case: dict[str, Any], arrays: dict[str, np.ndarray]) -> set[str]:
    """Every stored array a case refers to (any string in its fields that names an array)."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str) and value in arrays:
            found.add(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)

    walk(case)
    return found


def merge_into_existing(
    path: Path, fresh: FixtureWriter, kinds: set[str], meta: dict[str, Any]
) -> tuple[FixtureWriter, dict[str, Any]]:
    """The fixture at ``path`` with its cases of ``kinds`` (and their arrays) taken from ``fresh``.

    Every other case, array and meta field stays as it was; the regeneration is recorded under
    ``meta["partial_regenerations"]``. An array shared with a kept case must come out identical.
    """
    fresh_kinds = {c["kind"] for c in fresh.cases}
    if unknown := kinds - fresh_kinds:
        raise SystemExit(f"unknown case kind(s) {sorted(unknown)}; known: {sorted(fresh_kinds)}")
    with np.load(path) as data:
        old_arrays = {k: data[k] for k in data.files if k != "__meta__"}
        old_meta = json.loads(bytes(data["__meta__"]).decode())
    kept = [c for c in old_meta["cases"] if c["kind"] not in kinds]
    new = [c for c in fresh.cases if c["kind"] in kinds]
    kept_keys = set().union(*(case_array_keys(c, old_arrays) for c in kept))
    dropped = set().union(
        *(case_array_keys(c, old_arrays) for c in old_meta["cases"] if c["kind"] in kinds)
    )
    out = FixtureWriter()
    out.arrays = {k: v for k, v in old_arrays.items() if k not in dropped - kept_keys}
    for key in set().union(*(case_array_keys(c, fresh.arrays) for c in new)):
        value = fresh.arrays[key]
        if key in kept_keys and out.arrays[key].tobytes() != value.tobytes():
            raise SystemExit(f"array {key} is shared with a kept case but came out different")
        out.arrays[key] = value
    # Keep the case order: the new cases of a kind take the place of the first old one.
    placed: set[str] = set()
    for c in old_meta["cases"]:
        if c["kind"] not in kinds:
            out.cases.append(c)
        elif c["kind"] not in placed:
            placed.add(c["kind"])
            out.cases.extend(n for n in new if n["kind"] == c["kind"])
    out.cases.extend(n for n in new if n["kind"] not in placed)
    merged = {k: v for k, v in old_meta.items() if k != "cases"}
    merged["partial_regenerations"] = [
        *old_meta.get("partial_regenerations", []),
        {
            "kinds": sorted(kinds),
            **{k: meta[k] for k in ("reference_file_sha256", "torch", "numpy")},
        },
    ]
    return out, merged


def import_reference(root: Path) -> tuple[types.SimpleNamespace, types.SimpleNamespace]:
    """Import improved-diffusion and guided-diffusion from ``root`` and return two namespaces."""
    for sub in ("improved-diffusion", "guided-diffusion"):
        pkg_parent = root / sub
        if not pkg_parent.is_dir():
            raise FileNotFoundError(
                f"{pkg_parent} not found: pass --reference-root pointing at .reference"
            )
        sys.path.insert(0, str(pkg_parent))
    if not hasattr(np, "int"):
        np.int = int  # type: ignore[attr-defined]  # NumPy 2 shim, see module docstring
    sys.modules.setdefault("guided_diffusion.logger", types.ModuleType("guided_diffusion.logger"))

    import guided_diffusion.gaussian_diffusion as ggd
    import guided_diffusion.respace as grs
    import guided_diffusion.unet as gunet
    import improved_diffusion.gaussian_diffusion as igd
    import improved_diffusion.losses as ilosses
    import improved_diffusion.nn as inn
    import improved_diffusion.resample as iresample
    import improved_diffusion.respace as irs
    import improved_diffusion.unet as iunet

    improved = types.SimpleNamespace(
        get_named_beta_schedule=igd.get_named_beta_schedule,
        GaussianDiffusion=igd.GaussianDiffusion,
        ModelMeanType=igd.ModelMeanType,
        ModelVarType=igd.ModelVarType,
        LossType=igd.LossType,
        space_timesteps=irs.space_timesteps,
        SpacedDiffusion=irs.SpacedDiffusion,
        normal_kl=ilosses.normal_kl,
        discretized_gaussian_log_likelihood=ilosses.discretized_gaussian_log_likelihood,
        timestep_embedding=inn.timestep_embedding,
        LossSecondMomentResampler=iresample.LossSecondMomentResampler,
        UNetModel=iunet.UNetModel,
        SuperResModel=iunet.SuperResModel,
    )
    guided = types.SimpleNamespace(
        get_named_beta_schedule=ggd.get_named_beta_schedule,
        GaussianDiffusion=ggd.GaussianDiffusion,
        ModelMeanType=ggd.ModelMeanType,
        ModelVarType=ggd.ModelVarType,
        LossType=ggd.LossType,
        space_timesteps=grs.space_timesteps,
        SpacedDiffusion=grs.SpacedDiffusion,
        UNetModel=gunet.UNetModel,
        SuperResModel=gunet.SuperResModel,
    )
    return improved, guided


def build_diffusion(lib: types.SimpleNamespace, spec: dict[str, Any]) -> Any:
    """Build a (Spaced)GaussianDiffusion from a JSON spec; the test has the same function."""
    betas = lib.get_named_beta_schedule(spec["schedule"], spec["T"])
    kwargs = dict(
        betas=betas,
        model_mean_type=lib.ModelMeanType[spec["mean"]],
        model_var_type=lib.ModelVarType[spec["var"]],
        loss_type=lib.LossType[spec["loss"]],
        rescale_timesteps=spec["rescale"],
    )
    if spec.get("respacing"):
        return lib.SpacedDiffusion(
            use_timesteps=lib.space_timesteps(spec["T"], spec["respacing"]), **kwargs
        )
    return lib.GaussianDiffusion(**kwargs)


def dspec(
    schedule: str = "cosine",
    T: int = 1000,
    mean: str = "EPSILON",
    var: str = "FIXED_LARGE",
    loss: str = "MSE",
    rescale: bool = False,
    respacing: str | None = None,
) -> dict[str, Any]:
    """A diffusion spec as stored in the fixture."""
    return dict(
        schedule=schedule, T=T, mean=mean, var=var, loss=loss, rescale=rescale, respacing=respacing
    )


def learns_sigma(spec: dict[str, Any]) -> bool:
    """True when the model must output 2C channels."""
    return spec["var"] in ("LEARNED", "LEARNED_RANGE")


def make_inputs(w: FixtureWriter) -> None:
    """Fixed float32 inputs: data on the 8-bit grid with exact +-1 and near-edge pixels."""
    gen = torch.Generator().manual_seed(1234)
    shape = (4, 3, 8, 8)
    x = torch.rand(shape, generator=gen) * 2 - 1
    x = torch.round((x + 1) * 127.5) / 127.5 - 1  # the uint8 grid the decoder NLL assumes
    # Edge pixels exercise the decoder NLL branches (x < -0.999, x > 0.999) and its threshold.
    x[0, 0, 0, :6] = torch.tensor([-1.0, 1.0, -0.9995, 0.9995, -0.999, 0.999])
    x[1, 1, 1, :4] = torch.tensor([-1.0, -1.0, 1.0, 0.998])
    x[2, :, 2, 2] = 1.0
    x[3, :, 3, 3] = -1.0
    w.put("in/x_start", x)
    w.put("in/noise", torch.randn(shape, generator=gen))
    w.put("in/x_small", torch.randn((2, 3, 8, 8), generator=gen).clamp(-1, 1))
    for T in (1000, 100, 50, 20):
        t_key_for(w, T)
    w.put("in/t_rev_1000", torch.tensor([0, 1, 500, 998], dtype=torch.int64))


def t_key_for(w: FixtureWriter, T: int) -> str:
    """Key of the standard timestep batch [0, 1, T // 2, T - 1], created on first use."""
    key = f"in/t_{T}"
    if key not in w.arrays:
        w.put(key, torch.tensor([0, 1, T // 2, T - 1], dtype=torch.int64))
    return key


def fixture_schedules(w: FixtureWriter, ref: types.SimpleNamespace) -> None:
    """Float64 schedule arrays; the test requires bit equality."""
    for schedule in ("linear", "cosine"):
        for T in (1000, 4000, 100):
            diff = build_diffusion(ref, dspec(schedule=schedule, T=T))
            outputs: dict[str, str] = {}
            hashes: dict[str, str] = {}
            for attr in SCHEDULE_ATTRS:
                arr = np.asarray(getattr(diff, attr), dtype=np.float64)
                hashes[attr] = hashlib.sha256(arr.tobytes()).hexdigest()
                if len(arr) <= FULL_ARRAY_MAX_LEN:
                    outputs[attr] = w.put(f"sched/{schedule}/{T}/{attr}", arr)
                else:
                    outputs[attr] = w.put(f"sched/{schedule}/{T}/{attr}@strided", arr[::37])
            w.case(
                "schedule",
                f"{schedule}-T{T}",
                schedule=schedule,
                T=T,
                outputs=outputs,
                sha256=hashes,
            )


def fixture_q(w: FixtureWriter, ref: types.SimpleNamespace) -> None:
    """q_sample, q_mean_variance and q_posterior_mean_variance."""
    x0 = torch.from_numpy(w.arrays["in/x_start"])
    noise = torch.from_numpy(w.arrays["in/noise"])
    for schedule, T in (("cosine", 1000), ("linear", 100), ("cosine", 4000)):
        spec = dspec(schedule=schedule, T=T)
        diff = build_diffusion(ref, spec)
        t_key = t_key_for(w, T)
        t = torch.from_numpy(w.arrays[t_key])
        name = f"{schedule}-T{T}"
        x_t = diff.q_sample(x0, t, noise=noise)
        mean, var, logvar = diff.q_mean_variance(x0, t)
        pmean, pvar, plogvar = diff.q_posterior_mean_variance(x0, x_t, t)
        outs = {
            "q_sample": w.put(f"q/{name}/q_sample", x_t),
            "q_mean": w.put(f"q/{name}/q_mean", mean),
            "q_variance": w.put(f"q/{name}/q_variance", var.contiguous()),
            "q_log_variance": w.put(f"q/{name}/q_log_variance", logvar.contiguous()),
            "posterior_mean": w.put(f"q/{name}/posterior_mean", pmean),
            "posterior_variance": w.put(f"q/{name}/posterior_variance", pvar.contiguous()),
            "posterior_log_variance_clipped": w.put(
                f"q/{name}/posterior_log_variance_clipped", plogvar.contiguous()
            ),
        }
        w.case("q", name, spec=spec, t=t_key, outputs=outs)


def fixture_p_mean_variance(w: FixtureWriter, ref: types.SimpleNamespace) -> None:
    """p_mean_variance for every mean x variance type, rescaled timesteps on/off, and respaced."""
    x0 = torch.from_numpy(w.arrays["in/x_start"])
    noise = torch.from_numpy(w.arrays["in/noise"])
    specs: list[tuple[dict[str, Any], bool]] = []
    for mean in MEAN_TYPES:
        for var in VAR_TYPES:
            for rescale in (False, True):
                specs.append((dspec(mean=mean, var=var, rescale=rescale), True))
    specs.append((dspec(mean="EPSILON", var="LEARNED_RANGE"), False))  # clip_denoised=False
    specs.append((dspec(mean="START_X", var="FIXED_SMALL"), False))
    for rescale in (False, True):
        specs.append((dspec(var="LEARNED_RANGE", rescale=rescale, respacing="ddim50"), True))
        specs.append((dspec(var="FIXED_LARGE", rescale=rescale, respacing="10,15,20"), True))
    for spec, clip in specs:
        diff = build_diffusion(ref, spec)
        T_eff = diff.num_timesteps
        t_key = t_key_for(w, T_eff)
        t = torch.from_numpy(w.arrays[t_key])
        base = build_diffusion(ref, {**spec, "respacing": None})
        # x_t from the *base* process at the mapped timesteps, so that it is a plausible input.
        t_orig = (
            torch.tensor([sorted(diff.use_timesteps)[i] for i in t]) if spec["respacing"] else t
        )
        x_t = base.q_sample(x0, t_orig, noise=noise)
        name = "-".join(
            [spec["mean"], spec["var"], f"rescale{int(spec['rescale'])}", f"clip{int(clip)}"]
            + ([f"respace{spec['respacing']}"] if spec["respacing"] else [])
        )
        x_key = w.put(f"pmv/{name}/x_t", x_t)
        out = diff.p_mean_variance(fake_model(learns_sigma(spec)), x_t, t, clip_denoised=clip)
        outs = {k: w.put(f"pmv/{name}/{k}", out[k].contiguous()) for k in out}
        w.case(
            "p_mean_variance", name, spec=spec, x=x_key, t=t_key, clip_denoised=clip, outputs=outs
        )


def fixture_training_losses(w: FixtureWriter, ref: types.SimpleNamespace) -> None:
    """training_losses for every loss x mean x variance type, rescaled on/off, plus T != 1000."""
    specs: list[dict[str, Any]] = []
    for loss in LOSS_TYPES:
        for mean in MEAN_TYPES:
            for var in VAR_TYPES:
                for rescale in (False, True):
                    specs.append(dspec(mean=mean, var=var, loss=loss, rescale=rescale))
    # T/1000 (RESCALED_MSE) and T (RESCALED_KL) factors with T != 1000, and on a respaced process.
    for loss in LOSS_TYPES:
        specs.append(dspec(schedule="linear", T=100, var="LEARNED_RANGE", loss=loss, rescale=True))
        specs.append(
            dspec(T=1000, var="LEARNED_RANGE", loss=loss, rescale=True, respacing="ddim50")
        )
    x0 = torch.from_numpy(w.arrays["in/x_start"])
    noise = torch.from_numpy(w.arrays["in/noise"])
    for spec in specs:
        diff = build_diffusion(ref, spec)
        t_key = t_key_for(w, diff.num_timesteps)
        t = torch.from_numpy(w.arrays[t_key])
        name = "-".join(
            [spec["loss"], spec["mean"], spec["var"], f"rescale{int(spec['rescale'])}"]
            + ([f"{spec['schedule']}{spec['T']}"] if spec["T"] != 1000 else [])
            + ([f"respace{spec['respacing']}"] if spec["respacing"] else [])
        )
        terms = diff.training_losses(fake_model(learns_sigma(spec)), x0, t, noise=noise)
        outs = {k: w.put(f"loss/{name}/{k}", v.detach()) for k, v in terms.items()}
        w.case("training_losses", name, spec=spec, t=t_key, outputs=outs)


def fixture_losses(w: FixtureWriter, ref: types.SimpleNamespace) -> None:
    """normal_kl and the discretized Gaussian decoder log-likelihood on their own."""
    gen = torch.Generator().manual_seed(99)
    m1, lv1, m2, lv2 = (torch.randn(64, generator=gen) for _ in range(4))
    keys = [
        w.put(f"losses/normal_kl/{n}", v)
        for n, v in zip(("mean1", "logvar1", "mean2", "logvar2"), (m1, lv1, m2, lv2), strict=True)
    ]
    w.case(
        "normal_kl",
        "tensors",
        inputs=keys,
        outputs={"kl": w.put("losses/normal_kl/out", ref.normal_kl(m1, lv1, m2, lv2))},
    )
    w.case(
        "normal_kl_prior",
        "scalars-mean2=0-logvar2=0",
        inputs=keys[:2],
        outputs={"kl": w.put("losses/normal_kl_prior/out", ref.normal_kl(m1, lv1, 0.0, 0.0))},
    )
    x = torch.from_numpy(w.arrays["in/x_start"])
    means = (x + 0.05 * torch.randn(x.shape, generator=gen)).contiguous()
    log_scales = (-3.0 + 1.5 * torch.rand(x.shape, generator=gen)).contiguous()
    ll = ref.discretized_gaussian_log_likelihood(x, means=means, log_scales=log_scales)
    w.case(
        "decoder_nll",
        "discretized_gaussian_log_likelihood",
        x="in/x_start",
        means=w.put("losses/dgll/means", means),
        log_scales=w.put("losses/dgll/log_scales", log_scales),
        outputs={"log_probs": w.put("losses/dgll/out", ll)},
    )


def fixture_respacing(w: FixtureWriter, ref: types.SimpleNamespace) -> None:
    """space_timesteps outputs and SpacedDiffusion betas/timestep_map."""
    cases: list[tuple[int, str | list[int]]] = [
        (1000, "10,15,20"),
        (300, [10, 15, 20]),
        (1000, "ddim25"),
        (1000, "ddim50"),
        (4000, "ddim100"),
        (1000, "250"),
        (1000, "1000"),
        (100, "1"),
        (10, "10"),
        (1000, "1,2,3"),
        (999, "7,8"),
        (1001, "5,5,5,5"),
        (50, "ddim7"),
        (4000, "50,1,50"),
        (1000, [1000]),
    ]
    for T, counts in cases:
        steps = ref.space_timesteps(T, counts)
        assert isinstance(steps, set)
        key = w.put(f"respace/{T}/{counts}", np.array(sorted(steps), dtype=np.int64))
        w.case("space_timesteps", f"T{T}-{counts}", T=T, counts=counts, outputs={"steps": key})
    for T, counts in ((10, "11"), (10, "ddim11"), (1000, "ddim0"), (10, "6,6")):
        try:
            ref.space_timesteps(T, counts)
        except ValueError:
            w.case("space_timesteps_error", f"T{T}-{counts}", T=T, counts=counts, outputs={})
        else:
            raise AssertionError(f"reference accepted {counts} for T={T}")
    for schedule, T, counts in (
        ("cosine", 1000, "ddim50"),
        ("linear", 1000, "10,15,20"),
        ("cosine", 4000, "100"),
        ("linear", 100, "ddim10"),
    ):
        spec = dspec(schedule=schedule, T=T, respacing=counts)
        diff = build_diffusion(ref, spec)
        name = f"{schedule}-T{T}-{counts}"
        outs = {
            "betas": w.put(f"spaced/{name}/betas", np.asarray(diff.betas, dtype=np.float64)),
            "timestep_map": w.put(
                f"spaced/{name}/timestep_map", np.asarray(diff.timestep_map, dtype=np.int64)
            ),
            "alphas_cumprod": w.put(f"spaced/{name}/alphas_cumprod", diff.alphas_cumprod),
        }
        w.case("spaced_diffusion", name, spec=spec, outputs=outs)


def fixture_sampling(
    w: FixtureWriter, ref: types.SimpleNamespace, guided: types.SimpleNamespace
) -> None:
    """Single sampler steps with a fixed global seed, full tiny loops, calc_bpd_loop, guidance."""
    x0 = torch.from_numpy(w.arrays["in/x_start"])
    noise = torch.from_numpy(w.arrays["in/noise"])
    t_key = "in/t_1000"
    t = torch.from_numpy(w.arrays[t_key])
    for spec in (
        dspec(var="LEARNED_RANGE", rescale=True),
        dspec(mean="START_X", var="FIXED_SMALL"),
        dspec(mean="PREVIOUS_X", var="FIXED_LARGE"),
    ):
        diff = build_diffusion(ref, spec)
        model = fake_model(learns_sigma(spec))
        x_t = diff.q_sample(x0, t, noise=noise)
        sname = f"{spec['mean']}-{spec['var']}"
        x_key = w.put(f"sample/{sname}/x_t", x_t)
        torch.manual_seed(7)
        out = diff.p_sample(model, x_t, t)
        w.case(
            "p_sample",
            sname,
            spec=spec,
            x=x_key,
            t=t_key,
            seed=7,
            outputs={k: w.put(f"sample/{sname}/p_sample/{k}", v) for k, v in out.items()},
        )
        for eta in (0.0, 0.5):
            torch.manual_seed(8)
            out = diff.ddim_sample(model, x_t, t, eta=eta)
            w.case(
                "ddim_sample",
                f"{sname}-eta{eta}",
                spec=spec,
                x=x_key,
                t=t_key,
                seed=8,
                eta=eta,
                outputs={k: w.put(f"sample/{sname}/ddim{eta}/{k}", v) for k, v in out.items()},
            )
        t_rev = torch.from_numpy(w.arrays["in/t_rev_1000"])
        out = diff.ddim_reverse_sample(model, x_t, t_rev)
        w.case(
            "ddim_reverse_sample",
            sname,
            spec=spec,
            x=x_key,
            t="in/t_rev_1000",
            outputs={k: w.put(f"sample/{sname}/ddim_reverse/{k}", v) for k, v in out.items()},
        )

    shape = [2, 3, 8, 8]
    for spec in (
        dspec(T=20, var="LEARNED_RANGE", rescale=True),
        dspec(T=20, mean="START_X", var="FIXED_SMALL"),
        dspec(T=20, var="FIXED_LARGE", rescale=True, respacing="ddim5"),
    ):
        diff = build_diffusion(ref, spec)
        model = fake_model(learns_sigma(spec))
        sname = f"T20-{spec['mean']}-{spec['var']}" + (
            f"-{spec['respacing']}" if spec["respacing"] else ""
        )
        torch.manual_seed(11)
        out = diff.p_sample_loop(model, shape, device="cpu")
        w.case(
            "p_sample_loop",
            sname,
            spec=spec,
            shape=shape,
            seed=11,
            outputs={"sample": w.put(f"loop/{sname}/p_sample_loop", out)},
        )
        for eta in (0.0, 0.5):
            torch.manual_seed(12)
            out = diff.ddim_sample_loop(model, shape, device="cpu", eta=eta)
            w.case(
                "ddim_sample_loop",
                f"{sname}-eta{eta}",
                spec=spec,
                shape=shape,
                seed=12,
                eta=eta,
                outputs={"sample": w.put(f"loop/{sname}/ddim_sample_loop{eta}", out)},
            )
        # A given starting noise: the loop is then deterministic except the per-step draws.
        torch.manual_seed(13)
        out = diff.ddim_sample_loop(
            model, shape, noise=torch.from_numpy(w.arrays["in/x_small"]), eta=0.0, device="cpu"
        )
        w.case(
            "ddim_sample_loop_noise",
            sname,
            spec=spec,
            shape=shape,
            seed=13,
            eta=0.0,
            noise="in/x_small",
            outputs={"sample": w.put(f"loop/{sname}/ddim_sample_loop_noise", out)},
        )
        torch.manual_seed(14)
        bpd = diff.calc_bpd_loop(
            model, torch.from_numpy(w.arrays["in/x_start"][:2]), clip_denoised=True
        )
        w.case(
            "calc_bpd_loop",
            sname,
            spec=spec,
            seed=14,
            x="in/x_start",
            batch=2,
            outputs={k: w.put(f"loop/{sname}/bpd/{k}", v) for k, v in bpd.items()},
        )

    # Classifier guidance (guided-diffusion only).
    for spec in (
        dspec(var="LEARNED_RANGE"),
        dspec(var="FIXED_SMALL", rescale=True, respacing="ddim50"),
    ):
        diff = build_diffusion(guided, spec)
        model = fake_model(learns_sigma(spec))
        tt_key = t_key_for(w, diff.num_timesteps)
        tt = torch.from_numpy(w.arrays[tt_key])
        sname = f"{spec['var']}" + (f"-{spec['respacing']}" if spec["respacing"] else "")
        x_t = diff.q_sample(x0, tt, noise=noise)
        x_key = w.put(f"guide/{sname}/x_t", x_t)
        pmv = diff.p_mean_variance(model, x_t, tt)
        cm = diff.condition_mean(cond_fn, pmv, x_t, tt, model_kwargs={})
        cs = diff.condition_score(cond_fn, pmv, x_t, tt, model_kwargs={})
        w.case(
            "condition",
            sname,
            spec=spec,
            x=x_key,
            t=tt_key,
            outputs={
                "condition_mean": w.put(f"guide/{sname}/condition_mean", cm),
                "condition_score_mean": w.put(f"guide/{sname}/condition_score_mean", cs["mean"]),
                "condition_score_pred_xstart": w.put(
                    f"guide/{sname}/condition_score_pred_xstart", cs["pred_xstart"]
                ),
            },
        )
        torch.manual_seed(21)
        out = diff.p_sample(model, x_t, tt, cond_fn=cond_fn, model_kwargs={})
        w.case(
            "p_sample_cond",
            sname,
            spec=spec,
            x=x_key,
            t=tt_key,
            seed=21,
            outputs={k: w.put(f"guide/{sname}/p_sample/{k}", v) for k, v in out.items()},
        )
        torch.manual_seed(22)
        out = diff.ddim_sample(model, x_t, tt, cond_fn=cond_fn, model_kwargs={}, eta=0.5)
        w.case(
            "ddim_sample_cond",
            sname,
            spec=spec,
            x=x_key,
            t=tt_key,
            seed=22,
            eta=0.5,
            outputs={k: w.put(f"guide/{sname}/ddim/{k}", v) for k, v in out.items()},
        )


def fixture_misc(w: FixtureWriter, ref: types.SimpleNamespace) -> None:
    """timestep_embedding and the loss-second-moment sampler's weights."""
    ts_key = w.put("emb/timesteps", torch.tensor([0.0, 1.0, 2.5, 370.0, 999.0, 1000.0 * 0.37]))
    ts = torch.from_numpy(w.arrays[ts_key])
    for dim in (32, 33, 128):
        w.case(
            "timestep_embedding",
            f"dim{dim}",
            timesteps=ts_key,
            dim=dim,
            outputs={"emb": w.put(f"emb/dim{dim}", ref.timestep_embedding(ts, dim))},
        )

    T, per_t, batch = 20, 16, 8
    diffusion = build_diffusion(ref, dspec(T=T))
    rng = np.random.default_rng(5)
    # Every t appears per_t = 16 times (> history_per_term = 10) in a shuffled stream cut into
    # 40 batches of 8: the sampler warms up part-way through, then every FIFO shifts out its
    # oldest losses, and batches repeat timesteps. The losses grow with t (times noise in
    # [0.5, 1.5)), so the warm weights are far from uniform.
    ts_stream = rng.permutation(np.repeat(np.arange(T), per_t))
    loss_stream = (0.2 + 0.15 * ts_stream) * (0.5 + rng.random(ts_stream.size))
    batches = list(zip(ts_stream.reshape(-1, batch), loss_stream.reshape(-1, batch), strict=True))
    sampler = ref.LossSecondMomentResampler(diffusion)
    ts_all, losses_all, warm_flags, weights = [], [], [], []
    for ts_b, losses_b in batches:
        sampler.update_with_all_losses(ts_b.tolist(), losses_b.tolist())
        ts_all.append(ts_b)
        losses_all.append(losses_b)
        warm_flags.append(bool(sampler._warmed_up()))
        weights.append(np.asarray(sampler.weights(), dtype=np.float64))
    # The case must test the second-moment weights, not the uniform warm-up fallback.
    assert per_t > sampler.history_per_term and warm_flags[-1] and not warm_flags[0]
    assert weights[-1].max() > 3 * weights[-1].min(), "warm weights are nearly uniform"
    w.case(
        "loss_second_moment",
        f"T{T}-{len(batches)}-batches-warm",
        spec=dspec(T=T),
        ts=w.put("lsm/ts", np.stack(ts_all).astype(np.int64)),
        losses=w.put("lsm/losses", np.stack(losses_all)),
        warm=warm_flags,
        outputs={"weights": w.put("lsm/weights", np.stack(weights))},
    )


UNET_CONFIGS: dict[str, dict[str, Any]] = {
    # improved-diffusion's UNet (no image_size arg): legacy attention, scale-shift, learned sigma.
    "improved-A": dict(
        lib="improved",
        cls="UNetModel",
        image_size=16,
        kwargs=dict(
            in_channels=3,
            model_channels=32,
            out_channels=6,
            num_res_blocks=1,
            attention_resolutions=(2,),
            dropout=0.0,
            channel_mult=(1, 2),
            num_heads=2,
            use_scale_shift_norm=True,
        ),
    ),
    # guided-diffusion's extras: head channels, resblock up/down, new attention order, classes.
    "guided-B": dict(
        lib="guided",
        cls="UNetModel",
        image_size=16,
        kwargs=dict(
            in_channels=3,
            model_channels=32,
            out_channels=3,
            num_res_blocks=1,
            attention_resolutions=(2, 4),
            dropout=0.0,
            channel_mult=(1, 2, 2),
            num_classes=10,
            num_head_channels=16,
            use_scale_shift_norm=True,
            resblock_updown=True,
            use_new_attention_order=True,
        ),
    ),
    # guided, legacy order with several heads, additive timestep conditioning, 2 res blocks.
    "guided-C": dict(
        lib="guided",
        cls="UNetModel",
        image_size=16,
        kwargs=dict(
            in_channels=3,
            model_channels=32,
            out_channels=6,
            num_res_blocks=2,
            attention_resolutions=(2,),
            dropout=0.0,
            channel_mult=(1, 2),
            num_heads=4,
            use_scale_shift_norm=False,
        ),
    ),
    "guided-SR": dict(
        lib="guided",
        cls="SuperResModel",
        image_size=16,
        kwargs=dict(
            in_channels=3,
            model_channels=32,
            out_channels=3,
            num_res_blocks=1,
            attention_resolutions=(2,),
            dropout=0.0,
            channel_mult=(1, 2),
            num_heads=1,
            use_scale_shift_norm=True,
        ),
    ),
}


def fixture_unet(
    w: FixtureWriter, ref: types.SimpleNamespace, guided: types.SimpleNamespace
) -> None:
    """Small reference UNets with seeded non-zero weights: key list, input and output."""
    gen = torch.Generator().manual_seed(31)
    x = torch.randn((2, 3, 16, 16), generator=gen)
    w.put("unet/x", x)
    w.put("unet/timesteps", torch.tensor([3.0, 517.25]))
    w.put("unet/y", torch.tensor([1, 7], dtype=torch.int64))
    w.put("unet/low_res", torch.randn((2, 3, 8, 8), generator=gen))
    for name, cfg in UNET_CONFIGS.items():
        lib = ref if cfg["lib"] == "improved" else guided
        kwargs = dict(cfg["kwargs"])
        if cfg["lib"] == "guided":
            kwargs["image_size"] = cfg["image_size"]
        torch.manual_seed(0)
        model = getattr(lib, cfg["cls"])(**kwargs).eval()
        shapes = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
        weights = deterministic_weights(shapes)
        model.load_state_dict(weights, strict=True)
        call_kwargs: dict[str, Any] = {}
        if kwargs.get("num_classes"):
            call_kwargs["y"] = torch.from_numpy(w.arrays["unet/y"])
        if cfg["cls"] == "SuperResModel":
            call_kwargs["low_res"] = torch.from_numpy(w.arrays["unet/low_res"])
        with torch.no_grad():
            out = model(x, torch.from_numpy(w.arrays["unet/timesteps"]), **call_kwargs)
        raydiff_kwargs = {**cfg["kwargs"], "image_size": cfg["image_size"]}
        w.case(
            "unet",
            name,
            cls=cfg["cls"],
            kwargs=raydiff_kwargs,
            state_dict_shapes=[[k, list(s)] for k, s in shapes],
            weights_sum=float(sum(v.double().sum().item() for v in weights.values())),
            call=sorted(call_kwargs),
            outputs={"out": w.put(f"unet/{name}/out", out)},
        )


def fixture_fingerprints(w: FixtureWriter) -> None:
    """Outputs of the shared stand-ins, so the test can prove its copies are identical."""
    x = torch.from_numpy(w.arrays["in/x_start"])
    t = torch.from_numpy(w.arrays["in/t_1000"])
    w.put("fingerprint/fake_model_sigma", fake_model(True)(x, t))
    w.put("fingerprint/fake_model_plain", fake_model(False)(x, t.float() * 0.37))
    w.put("fingerprint/cond_fn", cond_fn(x, t))
    sd = deterministic_weights([("a.weight", (4, 3, 3, 3)), ("a.bias", (4,)), ("n.weight", (4,))])
    w.put("fingerprint/weights", torch.cat([v.flatten() for v in sd.values()]))


PUBLISHED_CLASSIFIERS = {"classifier_imagenet64": 64, "classifier_imagenet128": 128,
                         "classifier_imagenet256": 256}  # fmt: skip
"""raydiff's presets of guided-diffusion's published classifiers, and their image sizes."""


def write_classifier_keys(out: Path) -> None:
    """The state-dict keys and shapes of guided-diffusion's ``create_classifier`` with each
    preset's flags (built on the meta device: nothing allocated), for
    ``tests/unit/test_presets.py``: a published ``NxN_classifier.pt`` loads strictly into the
    network of raydiff's preset exactly when the two lists agree."""
    import yaml
    from guided_diffusion.script_util import classifier_defaults, create_classifier

    lines = ["# preset key shape: guided-diffusion's create_classifier with each preset's flags"]
    for preset in PUBLISHED_CLASSIFIERS:
        flags = yaml.safe_load(Path(f"configs/{preset}.yaml").read_text())["classifier"]
        args = classifier_defaults()
        args.update({k: v for k, v in flags.items() if k in args})
        args["image_size"] = PUBLISHED_CLASSIFIERS[preset]
        with torch.device("meta"):
            network = create_classifier(**args)
        for key, value in network.state_dict().items():
            lines.append(f"{preset} {key} {','.join(map(str, value.shape))}")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(lines) - 1} keys")


PUBLISHED_UPSAMPLERS = {
    "upsampler_imagenet64_256": "guided_diffusion",
    "upsampler_imagenet128_512": "guided_diffusion",
    "upsampler_iddpm_imagenet64_256": "improved_diffusion",
}
"""raydiff's presets of the published upsamplers, and the code base whose ``sr_create_model``
builds each."""


def write_upsampler_keys(out: Path) -> None:
    """The state-dict keys and shapes of ``sr_create_model`` (guided- or improved-diffusion's,
    whichever published the upsampler) with each upsampler preset's flags (on the meta device),
    for ``tests/unit/test_presets.py``: a published ``64_256_upsampler.pt`` or
    ``upsample_cond_500K.pt`` loads strictly into raydiff's network of the preset exactly when
    the two lists agree."""
    import yaml

    lines = ["# preset key shape: the original's sr_create_model with each preset's flags"]
    for preset, package in PUBLISHED_UPSAMPLERS.items():
        script_util = importlib.import_module(f"{package}.script_util")
        sr_create_model = script_util.sr_create_model
        sr_model_and_diffusion_defaults = script_util.sr_model_and_diffusion_defaults
        config = yaml.safe_load(Path(f"configs/{preset}.yaml").read_text())
        flags = {**config["model"], **config["diffusion"]}
        args = sr_model_and_diffusion_defaults()
        args.update({k: v for k, v in flags.items() if k in args})
        args["large_size"] = config["model"]["image_size"]
        args["small_size"] = config["super_res"]["small_size"]
        model_args = inspect.signature(sr_create_model).parameters
        with torch.device("meta"):
            network = sr_create_model(**{k: v for k, v in args.items() if k in model_args})
        for key, value in network.state_dict().items():
            lines.append(f"{preset} {key} {','.join(map(str, value.shape))}")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(lines) - 1} keys")


def write_super_res_inputs(out: Path, root: Path) -> None:
    """improved-diffusion's ``load_superres_data`` (its super_res_train.py script: its own
    ``load_data`` of PNG files, then ``F.interpolate(mode="area")``) on 6 seeded RGB 16x16
    images, for ``tests/unit/test_super_res_inputs.py``: ``images`` uint8 ``[N, 16, 16, 3]``
    (file ``i`` is image ``i``), and the reference's ``large`` float32 ``[N, 3, 16, 16]`` and
    ``low_res`` float32 ``[N, 3, 4, 4]`` of each, in the images' order (its loader shuffles; each
    batch row is matched to its image)."""
    import importlib.util
    import os
    import tempfile

    from PIL import Image

    sys.path.insert(0, str(root / "improved-diffusion"))
    if importlib.util.find_spec("mpi4py") is None:
        sys.path.insert(0, str(Path(__file__).parent))
        from gpu_step import _one_process_mpi

        sys.modules["mpi4py"], sys.modules["mpi4py.MPI"] = _one_process_mpi()
    if importlib.util.find_spec("blobfile") is None:  # the local-file calls load_data makes
        bf = types.ModuleType("blobfile")
        bf.listdir, bf.join, bf.isdir = os.listdir, os.path.join, os.path.isdir
        bf.basename, bf.BlobFile = os.path.basename, open
        sys.modules["blobfile"] = bf
    script = root / "improved-diffusion" / "scripts" / "super_res_train.py"
    spec = importlib.util.spec_from_file_location("super_res_train", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    images = np.random.default_rng(0).integers(0, 256, (6, 16, 16, 3), dtype=np.uint8)
    with tempfile.TemporaryDirectory() as folder:
        for i, image in enumerate(images):
            Image.fromarray(image).save(os.path.join(folder, f"image_{i:02d}.png"))
        torch.manual_seed(0)
        data = module.load_superres_data(folder, len(images), large_size=16, small_size=4)
        large, kwargs = next(data)
    expected = torch.from_numpy(images.astype(np.float32) / 127.5 - 1).permute(0, 3, 1, 2)
    order = [int((large - e).abs().flatten(1).sum(1).argmin()) for e in expected]
    assert sorted(order) == list(range(len(images))), order
    np.savez(
        out,
        images=images,
        large=large[order].numpy(),
        low_res=kwargs["low_res"][order].numpy(),
    )
    print(f"wrote {out}: {len(images)} images, 16x16 -> 4x4")


def main() -> None:
    """Parse arguments, compute every fixture with the reference and write the npz."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--reference-root",
        type=Path,
        default=Path(".reference"),
        help="folder holding improved-diffusion/improved_diffusion and guided-diffusion/guided_diffusion",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("tests/unit/fixtures/reference_values.npz"),
        help="where to write the fixture file",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        metavar="KIND",
        help="recompute only the cases of these kinds (e.g. loss_second_moment) and keep the rest "
        "of the existing --out file byte for byte",
    )
    parser.add_argument(
        "--classifier-keys",
        type=Path,
        metavar="FILE",
        help="only write the published classifiers' state-dict keys to FILE "
        "(tests/unit/fixtures/published_classifier_keys.txt)",
    )
    parser.add_argument(
        "--upsampler-keys",
        type=Path,
        metavar="FILE",
        help="only write the published upsamplers' state-dict keys to FILE "
        "(tests/unit/fixtures/published_upsampler_keys.txt)",
    )
    parser.add_argument(
        "--super-res-inputs",
        type=Path,
        metavar="FILE",
        help="only write improved-diffusion's super-resolution inputs of seeded images to FILE "
        "(tests/unit/fixtures/super_res_inputs.npz)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # single-threaded reductions: the most reproducible summation order
    ref, guided = import_reference(args.reference_root)
    if args.classifier_keys:
        write_classifier_keys(args.classifier_keys)
        return
    if args.upsampler_keys:
        write_upsampler_keys(args.upsampler_keys)
        return
    if args.super_res_inputs:
        write_super_res_inputs(args.super_res_inputs, args.reference_root)
        return

    w = FixtureWriter()
    make_inputs(w)
    fixture_fingerprints(w)
    fixture_schedules(w, ref)
    fixture_q(w, ref)
    fixture_p_mean_variance(w, ref)
    fixture_training_losses(w, ref)
    fixture_losses(w, ref)
    fixture_respacing(w, ref)
    fixture_sampling(w, ref, guided)
    fixture_misc(w, ref)
    fixture_unet(w, ref, guided)

    file_hashes = {}
    for sub, pkg in (
        ("improved-diffusion", "improved_diffusion"),
        ("guided-diffusion", "guided_diffusion"),
    ):
        for f in sorted((args.reference_root / sub / pkg).glob("*.py")):
            file_hashes[f"{pkg}/{f.name}"] = hashlib.sha256(f.read_bytes()).hexdigest()
    meta = {
        "format": 1,
        "generator": "bench/make_reference_fixtures.py",
        "reference_sources": REFERENCE_SOURCES,
        "reference_file_sha256": file_hashes,
        "torch": torch.__version__,
        "numpy": np.__version__,
        "notes": [
            "np.int = int shim applied (NumPy 2) for LossSecondMomentResampler",
            "guided_diffusion.logger stubbed (only used by MixedPrecisionTrainer)",
            f"schedule arrays longer than {FULL_ARRAY_MAX_LEN} stored as sha256 + [::37] sample",
            "UNet weights are not stored: deterministic_weights() regenerates them from (key, shape)",
        ],
    }
    if args.only:
        w, meta = merge_into_existing(args.out, w, set(args.only), meta)
    size = w.write(args.out, meta)
    print(f"wrote {args.out}: {len(w.cases)} cases, {len(w.arrays)} arrays, {size / 1024:.0f} KiB")
    if size > 1.5 * 1024 * 1024:
        raise SystemExit(f"fixture too large ({size} bytes > 1.5 MB)")


if __name__ == "__main__":
    main()
