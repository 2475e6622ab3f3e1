"""The Python API: load a target and a drafter by name, generate text, stream it, compare.

>>> from specdec import SpecDec
>>> sd = SpecDec(target="smollm2-135m", drafter="prompt-lookup")          # doctest: +SKIP
>>> out = sd.generate("Repeat: the quick brown fox", max_new_tokens=32)   # doctest: +SKIP
>>> out.text, out.stats.alpha, out.stats.tau                              # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .config import SamplingParams, SpecConfig
from .decoding.engine import Generation, SpeculativeEngine
from .decoding.metrics import GenerationStats
from .plan import make_plan
from .text import TextStream


@dataclass
class Result:
    text: str
    token_ids: list[int]
    prompt_ids: list[int]
    stats: GenerationStats
    logprobs: list | None = None
    """Each token's TokenLogprob when asked for (logprobs=K)."""

    @property
    def finish_reason(self) -> str:
        return self.stats.finish_reason

    def to_dict(self) -> dict:
        return {"text": self.text, "token_ids": self.token_ids, "prompt_tokens": len(self.prompt_ids),
                "finish_reason": self.finish_reason, "stats": self.stats.to_dict()}


class SpecDec:
    """A target model with a drafter, ready to generate.

    target: a built-in name (smollm2-135m, gemma3-270m), a local directory or a hub id.
    drafter: prompt-lookup, ngram[:TABLE.npz], model:NAME_OR_DIR (a draft model with the target's
    tokenizer), trained[:DIR] (default: the one shipped for the target), none, the directory of a
    trained drafter, or auto (the default: prompt lookup for greedy generations and, where a
    trained drafter ships for the target, that drafter for sampled ones; measured faster so).
    backend: auto (the lean forward pass where the architecture is known, else transformers),
    lean or transformers.
    weights: auto, gguf, gguf-int8, float, q8_0 or q4_0 (config.WEIGHTS): whether a built-in target's linear
    layers read the GGUF file's own blocks, and with which activations (auto: int8 where the blocks run; the
    self-q4 drafter needs the target on float weights: auto then means float); q8_0 / q4_0 quantise any
    lean-backend target's float weights at load to those blocks (int8 activations).
    """

    def __init__(self, target: str = "smollm2-135m", drafter: str = "auto", dtype: str = "auto", device: str = "cpu",
                 backend: str = "auto", weights: str = "auto"):
        self.plan = make_plan(target, [drafter], dtype, weights, backend, device)
        self.target = self.plan.load()
        target_pass = self.plan.target_pass(self.target)
        self.drafter = self.plan.drafter(drafter, self.target, target_pass)
        self.engine = SpeculativeEngine(target_pass, self.drafter, self.target.eos_token_ids)

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def encode(self, prompt: str | list[dict], chat: bool | None = None) -> list[int]:
        """Text (or chat messages) -> prompt token ids (see LoadedModel.encode)."""
        return self.target.encode(prompt, chat)

    def start(self, prompt: str | list[dict] | list[int], *, max_new_tokens: int = 128, temperature: float = 0.0,
              top_k: int = 0, top_p: float = 1.0, seed: int | None = None, gamma: int | str = "auto",
              chat: bool | None = None, drafter_invariant: bool | None = None, presence_penalty: float = 0.0,
              frequency_penalty: float = 0.0, logit_bias: dict[int, float] | None = None,
              logprobs: int | None = None) -> tuple[list[int], Generation]:
        """Prompt ids and a Generation to iterate (the streaming entry point). A seeded sampled
        generation uses drafter-invariant sampling unless `drafter_invariant=False`: its output is
        then the same with any drafter and gamma, and equal to plain decoding's with that seed.
        Penalties and logit_bias (token id -> bias) are OpenAI's; logprobs=K records each token's
        log-probability and its K likeliest alternatives (Generation.logprobs)."""
        sampling = SamplingParams.for_request(temperature, top_k, top_p, seed, drafter_invariant,
                                              presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                                              logit_bias=tuple((logit_bias or {}).items()), logprobs=logprobs)
        spec = SpecConfig(gamma=gamma, max_new_tokens=max_new_tokens)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            prompt_ids = list(prompt)
        else:
            prompt_ids = self.encode(prompt, chat)
        return prompt_ids, self.engine.generate(prompt_ids, sampling, spec)

    def stream(self, prompt, **kwargs) -> Iterator[str]:
        """Yield text pieces as tokens are accepted."""
        _, run = self.start(prompt, **kwargs)
        text = TextStream(self.tokenizer)
        with torch.inference_mode():
            for chunk in run:
                piece = text.push(chunk)
                if piece:
                    yield piece

    def generate(self, prompt, **kwargs) -> Result:
        prompt_ids, run = self.start(prompt, **kwargs)
        with torch.inference_mode():
            run.run()
        return self.result(prompt_ids, run)

    def result(self, prompt_ids: list[int], run: Generation) -> Result:
        text = self.tokenizer.decode(run.tokens, skip_special_tokens=True)
        return Result(text=text, token_ids=list(run.tokens), prompt_ids=prompt_ids, stats=run.stats,
                      logprobs=run.logprobs)
