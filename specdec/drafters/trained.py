"""Drafters trained for one target (`specdec train-drafter`), loaded on the fastest path here.

A trained drafter is a directory (drafters/checkpoint) or an EAGLE-3 checkpoint in vLLM's or
SGLang's layout (drafters/eagle3_format); loading checks it against the target and returns the
drafter of its kind: draft-lm drafts like any draft model (ModelDrafter over drafters/draft_lm),
eagle and eagle3 read the target's features (drafters/eagle), medusa's heads read its last one
(drafters/medusa)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import SpecdecError
from . import eagle3_format
from .base import Drafter
from .checkpoint import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    build_net,
    check_target,
    check_vocab,
    is_trained_drafter,
    load_state,
    read_config,
)
from .draft_lm import DraftLMBackend
from .eagle import EagleDrafter, EagleTreeDrafter
from .medusa import MedusaDrafter
from .model import ModelDrafter
from .nets import DraftNet


def is_drafter_directory(path: str | Path) -> bool:
    """A drafter this project loads: its own (is_trained_drafter) or an EAGLE-3 checkpoint."""
    return is_trained_drafter(path) or eagle3_format.checkpoint_format(path) is not None


def read_net(directory: str | Path, target) -> DraftNet:
    """The drafter's network saved in `directory`, checked to be for `target` (a LoadedModel), as
    saved: plain modules on the CPU (what training continues from). An EAGLE-3 checkpoint (vLLM's
    or SGLang's layout) is imported (drafters/eagle3_format)."""
    from safetensors.torch import load_file

    from ..models import target_identity

    directory = Path(directory)
    if eagle3_format.checkpoint_format(directory) is not None:
        return eagle3_format.read(directory, target)
    if not is_trained_drafter(directory):
        raise SpecdecError(f"{directory} holds no trained drafter ({CONFIG_FILE} and {WEIGHTS_FILE}): "
                           "make one with `specdec train-drafter`")
    config = read_config(directory)
    check_target(config, target_identity(target), directory)
    state = load_file(str(directory / WEIGHTS_FILE))
    vocab = check_vocab(state.get("vocab"), target.model.get_output_embeddings().weight.shape[0],
                        directory / WEIGHTS_FILE)
    return load_state(build_net(config, vocab, target.model), state, directory / WEIGHTS_FILE)



DRAFT_BLOCKS = "Q4_0"
"""The block type an eagle/eagle3 net's matrices take for drafting on quant.cpp (SPECDEC_DRAFT_BLOCKS
names another of quant.KINDS, or 0 to keep the float paths). A draft step reads the net's weights from
memory (a target pass between two steps evicts them from every cache level): Q4_0 reads about half of
Q8_0's bytes, so a draft token costs less, and the engine measured the same acceptance with it."""


def draft_blocks() -> str | None:
    """The block type trained eagle/eagle3 nets draft with here, or None where they keep float weights
    (no quant.cpp packed int8 kernels here: they need AVX2 and F16C; or SPECDEC_DRAFT_BLOCKS=0)."""
    from ..modeling import quant

    kind = os.environ.get("SPECDEC_DRAFT_BLOCKS", DRAFT_BLOCKS)
    if kind == "0" or not quant.packed_int8():
        return None
    if kind not in quant.KINDS:
        raise SpecdecError(f"SPECDEC_DRAFT_BLOCKS={kind!r} is not a block type: use one of {', '.join(quant.KINDS)}, "
                           "or 0 for float weights")
    return kind


def load_net(directory: str | Path, target) -> DraftNet:
    """The drafter's network for `target` (a LoadedModel), on its device, drafting on the fastest
    path here:

    - eagle and eagle3 where quant.cpp's packed kernels run (AVX2): every matrix as int8 blocks (`draft_blocks`,
      DraftNet.use_blocks), float32 activations quantised to int8 as the GGUF target's are: one draft
      token reads ~1 byte a weight and a layer is one call (c, a draft token's cost over a target
      step, is about 0.09 on the blocks target, a quarter of the float net's);
    - else for a float32 GGUF target, in bfloat16 on kernels.cpp where that runs (one row is
      memory-bound, and float32 weights on oneDNN read twice the bytes);
    - else in the target's dtype, on kernels.cpp (bf16) or pre-packed for oneDNN.

    Exactness does not depend on the draft's numbers: the verifier uses the q the tokens were drawn
    from; the target's features are cast to the net's dtype where the net reads them
    (DraftNet.features_in)."""
    from ..modeling import kernels
    from ..modeling.packing import can_pack

    device = target.model.device
    dtype = target.dtype
    net = read_net(directory, target)
    if device.type == "cpu" and net.config.kind in ("eagle", "eagle3"):
        kind = draft_blocks()
        if kind is not None and net.fits_blocks(kind):
            return net.to(device=device, dtype=torch.float32).eval().use_blocks(kind)
        if dtype == torch.float32 and getattr(target, "gguf", None) is not None and kernels.load() is not None:
            dtype = torch.bfloat16
    net = net.to(device=device, dtype=dtype).eval()
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float32):
        kern = kernels.load() if dtype == torch.bfloat16 else None
        if kern is not None:
            net.use_kernels(kern)
        elif can_pack(dtype):
            net.pack()
    return net


def load_trained_drafter(directory: str | Path, target, tree: bool = False) -> Drafter:
    """The drafter saved in `directory`, checked against `target` (a LoadedModel); with `tree`, an
    EAGLE drafter that proposes token trees (EagleTreeDrafter)."""
    net = load_net(directory, target)
    label = Path(directory).name
    if tree:
        if net.config.kind not in ("eagle", "eagle3"):
            raise SpecdecError(f"tree drafting needs an eagle or eagle3 drafter; {directory} holds a {net.config.kind} "
                               "drafter (use trained:DIR for it)")
        return EagleTreeDrafter(net, label)
    width = target.model.get_output_embeddings().weight.shape[0]
    if net.config.kind == "draft-lm":
        drafter = ModelDrafter(DraftLMBackend(net, width), width, label=label)
        drafter.name = f"draft-lm:{label}"
        return drafter
    if net.config.kind in ("eagle", "eagle3"):
        return EagleDrafter(net, label)
    return MedusaDrafter(net, label)
