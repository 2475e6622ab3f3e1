"""The compute path, planned once: from the user's target, drafters and flags (--dtype, --weights,
--backend, --device) to the dtype the target loads in, the weights its layers read and the backend
that runs it, and the drafters built for it. The API, the bench, the server (through the API) and
train-drafter all go through here, so a flag means the same thing in each.

>>> plan = make_plan("smollm2-135m", drafters=["prompt-lookup"])   # doctest: +SKIP
>>> target = plan.load(); target_pass = plan.target_pass(target)  # doctest: +SKIP
>>> drafter = plan.drafter("prompt-lookup", target, target_pass)  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import models
from .backends import Backend, target_backend
from .backends.gguf import load_dtype
from .config import WEIGHTS
from .drafters import Drafter, build_drafter, drafts_on_blocks, target_weights
from .errors import SpecdecError
from .models import LoadedModel


@dataclass(frozen=True)
class Plan:
    target: str
    """The target's built-in name, directory, hub id or .gguf file."""
    drafters: tuple[str, ...]
    """The drafters that will draft for it (DRAFTER_SYNTAX), which the plan's choices account for."""
    load_dtype: str
    """The dtype the target loads in (float32 where its GGUF blocks run: backends.gguf.load_dtype)."""
    weights: str
    """What its linear layers read (config.WEIGHTS), `auto` made definite where a drafter decides it."""
    backend: str
    """The backend asked for (config.BACKENDS)."""
    device: str
    dtype_choice: str
    """--dtype as given: `auto` lets the weights' choice pick float32 (backends.gguf.choose_weights)."""

    def load(self) -> LoadedModel:
        return models.load_model(self.target, self.load_dtype, self.device)  # looked up here: tests replace it

    def target_pass(self, loaded: LoadedModel) -> Backend:
        """The backend the target's passes run on."""
        return target_backend(loaded, self.backend, self.weights, self.dtype_choice)

    def drafter(self, spec: str, loaded: LoadedModel, target_pass: Backend) -> Drafter | None:
        """The drafter `spec` (one of the plan's) for the loaded target that runs on `target_pass`."""
        return build_drafter(spec, loaded, self.dtype_choice, self.device, self.backend,
                             target_on_blocks=target_pass.gguf is not None)


def make_plan(target: str, drafters: Sequence[str] = (), dtype: str = "auto", weights: str = "auto",
              backend: str = "auto", device: str = "cpu") -> Plan:
    """The plan for `target` drafted for by `drafters`, or a SpecdecError that says which flags
    cannot go together."""
    if weights not in WEIGHTS:
        raise SpecdecError(f"unknown weights {weights!r}: use {', '.join(WEIGHTS)}")
    drafters = tuple(drafters)
    weights = target_weights(weights, list(drafters), target)
    loads_in = load_dtype(dtype, weights, target, backend, device, blocks_drafter=drafts_on_blocks(list(drafters)))
    return Plan(target=target, drafters=drafters, load_dtype=loads_in, weights=weights, backend=backend,
                device=device, dtype_choice=dtype)
