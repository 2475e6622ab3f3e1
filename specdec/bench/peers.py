"""Peers measured in the same run: transformers' own generate() (plain, prompt lookup, assisted)."""

from __future__ import annotations

import time

import torch

from ..config import SamplingParams


def hf_sampling_kwargs(sampling: SamplingParams) -> dict:
    """generate() arguments for the same warping specdec applies (its defaults, e.g. top_k=50, off)."""
    if sampling.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": sampling.temperature, "top_k": sampling.top_k or None,
            "top_p": sampling.top_p}


@torch.inference_mode()
def hf_generate(model, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int,
                eos_token_ids: set[int], **extra) -> tuple[list[int], float]:
    """(new token ids, seconds) for one transformers generate() call."""
    if sampling.seed is not None:
        torch.manual_seed(sampling.seed)
    ids = torch.tensor([prompt_ids])
    start = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                         eos_token_id=sorted(eos_token_ids) or None, pad_token_id=next(iter(eos_token_ids), 0),
                         **hf_sampling_kwargs(sampling), **extra)
    seconds = time.perf_counter() - start
    return out[0, len(prompt_ids):].tolist(), seconds

