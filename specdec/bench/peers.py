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


def llama_cpp_available() -> bool:
    """Whether llama-cpp-python is installed (the optional extra `llama-cpp`; ~8 minutes to build)."""
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


class LlamaCpp:
    """llama.cpp through llama-cpp-python on the target's own GGUF file: plain decoding, or its prompt
    lookup drafting (LlamaPromptLookupDecoding, 10 tokens a draft, its default). Same prompt ids, same
    threads; each call starts from an empty cache, so the time includes the prompt's prefill."""

    def __init__(self, gguf_path, threads: int, prompt_lookup: bool = False, n_ctx: int = 8192):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        # logits_all with a draft model: llama-cpp-python 0.3.16 sizes its score buffer by the argument
        # (n_batch rows without it) and overflows past 512 positions when it drafts
        self.llm = Llama(model_path=str(gguf_path), n_threads=threads, n_threads_batch=threads, n_ctx=n_ctx,
                         verbose=False, logits_all=prompt_lookup,
                         draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10) if prompt_lookup else None)

    def generate(self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int,
                 eos_token_ids: set[int]) -> tuple[list[int], float]:
        """(new token ids, seconds end to end: prefill and decoding)."""
        if sampling.seed is not None:
            self.llm.set_seed(sampling.seed)
        warp = ({"temp": 0.0} if sampling.greedy else
                {"temp": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p})
        self.llm.reset()  # no prefix reuse from the previous call
        out: list[int] = []
        start = time.perf_counter()
        for token in self.llm.generate(prompt_ids, **{"top_k": 0, "top_p": 1.0, "min_p": 0.0, **warp}):
            if token in eos_token_ids:
                break
            out.append(int(token))
            if len(out) >= max_new_tokens:
                break
        return out, time.perf_counter() - start
