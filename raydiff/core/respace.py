"""Timestep respacing: run a model trained with T steps on a subset of them (IDDPM section 4).

``space_timesteps`` chooses the subset; ``SpacedDiffusion`` rebuilds the betas so that the kept
steps form a valid diffusion of their own and maps its step indices back to the original ones
before calling the model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from raydiff.core.gaussian_diffusion import CondFn, GaussianDiffusion, Model


def space_timesteps(num_timesteps: int, section_counts: str | Sequence[int]) -> set[int]:
    """Choose which of ``num_timesteps`` original steps to keep.

    ``section_counts`` is either
    - ``"ddimN"``: the smallest integer stride that yields exactly N steps (DDIM's fixed stride);
    - a comma-separated string or a list of counts, e.g. ``"10,15,20"``: T is split into equal
      sections (the first ``T % len(counts)`` sections one step longer) and each section is
      strided evenly, rounding an accumulated float index with Python's ``round()``.
    A single count like ``"250"`` is one section. Returns the set of kept step indices.
    """
    if isinstance(section_counts, str):
        if section_counts.startswith("ddim"):
            try:
                desired_count = int(section_counts[len("ddim") :])
            except ValueError:
                raise ValueError(
                    f"timestep_respacing {section_counts!r} must look like 'ddim50'"
                ) from None
            for stride in range(1, num_timesteps):
                if len(range(0, num_timesteps, stride)) == desired_count:
                    return set(range(0, num_timesteps, stride))
            raise ValueError(
                f"cannot create exactly {desired_count} steps from {num_timesteps} with an "
                "integer stride; pick another ddimN or a plain count"
            )
        try:
            section_counts = [int(x) for x in section_counts.split(",")]
        except ValueError:
            raise ValueError(
                f"timestep_respacing {section_counts!r} must be '', 'ddimN', a count like '250' "
                "or comma-separated counts like '10,15,20'"
            ) from None
    section_counts = list(section_counts)
    if not section_counts or any(c < 1 for c in section_counts):
        raise ValueError(f"section counts must be positive integers, got {section_counts}")
    size_per = num_timesteps // len(section_counts)
    extra = num_timesteps % len(section_counts)
    start_idx = 0
    all_steps: list[int] = []
    for i, section_count in enumerate(section_counts):
        size = size_per + (1 if i < extra else 0)
        if size < section_count:
            raise ValueError(
                f"cannot take {section_count} steps from a section of {size} steps "
                f"(T={num_timesteps} split into {len(section_counts)} sections)"
            )
        frac_stride = 1 if section_count <= 1 else (size - 1) / (section_count - 1)
        cur_idx = 0.0
        for _ in range(section_count):
            all_steps.append(start_idx + round(cur_idx))
            cur_idx += frac_stride
        start_idx += size
    return set(all_steps)


class SpacedDiffusion(GaussianDiffusion):
    """A diffusion over a subset of a base diffusion's steps.

    :param use_timesteps: the original step indices to keep.
    :param kwargs: the base ``GaussianDiffusion`` arguments (``betas`` of the full schedule, ...).

    Betas are recomputed as ``1 - abar[i] / abar[previous kept]`` so the kept steps have the same
    marginals q(x_t | x_0) as in the base process.
    """

    def __init__(self, use_timesteps: Iterable[int], **kwargs: Any) -> None:
        self.use_timesteps = set(use_timesteps)
        self.original_betas = np.array(kwargs["betas"], dtype=np.float64)
        self.original_num_steps = len(self.original_betas)
        bad = [t for t in self.use_timesteps if not 0 <= t < self.original_num_steps]
        if bad or not self.use_timesteps:
            raise ValueError(
                f"use_timesteps must be a non-empty subset of 0..{self.original_num_steps - 1}, "
                f"got out-of-range values {sorted(bad)[:5]}"
            )
        base_diffusion = GaussianDiffusion(**kwargs)
        self.timestep_map: list[int] = []
        last_alpha_cumprod = 1.0
        new_betas = []
        for i, alpha_cumprod in enumerate(base_diffusion.alphas_cumprod):
            if i in self.use_timesteps:
                new_betas.append(1 - alpha_cumprod / last_alpha_cumprod)
                last_alpha_cumprod = alpha_cumprod
                self.timestep_map.append(i)
        kwargs["betas"] = np.array(new_betas)
        super().__init__(**kwargs)
        self._map_tensors: dict[torch.device, torch.Tensor] = {}

    def p_mean_variance(self, model: Model, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        return super().p_mean_variance(self._wrap_model(model), *args, **kwargs)

    def training_losses(self, model: Model, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        return super().training_losses(self._wrap_model(model), *args, **kwargs)

    def condition_mean(self, cond_fn: CondFn, *args: Any, **kwargs: Any) -> torch.Tensor:
        return super().condition_mean(self._wrap_model(cond_fn), *args, **kwargs)

    def condition_score(
        self, cond_fn: CondFn, *args: Any, **kwargs: Any
    ) -> dict[str, torch.Tensor]:
        return super().condition_score(self._wrap_model(cond_fn), *args, **kwargs)

    def _wrap_model(self, model: Model) -> Model:
        if isinstance(model, _TimestepMappedModel):
            return model
        return _TimestepMappedModel(model, diffusion=self)

    def _scale_timesteps(self, t: torch.Tensor) -> torch.Tensor:
        # The wrapped model maps and scales; scaling here too would apply it twice.
        return t

    def _original_timesteps(self, ts: torch.Tensor) -> torch.Tensor:
        """Map spaced step indices to the base diffusion's indices (and rescale if asked)."""
        table = self._map_tensors.get(ts.device)
        if table is None:
            table = torch.tensor(self.timestep_map, device=ts.device)
            self._map_tensors[ts.device] = table
        new_ts = table[ts.long()].to(ts.dtype)
        if self.rescale_timesteps:
            new_ts = new_ts.float() * (1000.0 / self.original_num_steps)
        return new_ts


class _TimestepMappedModel:
    """Calls the model with original-process timesteps instead of spaced indices."""

    def __init__(self, model: Model, *, diffusion: SpacedDiffusion) -> None:
        self.model = model
        self.diffusion = diffusion

    def __call__(self, x: torch.Tensor, ts: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.model(x, self.diffusion._original_timesteps(ts), **kwargs)
