"""Frozen settings for one generation: how to sample, and how to speculate.

Both are validated when built, so a bad value fails before any model work starts:

>>> SamplingParams(temperature=0.7, top_p=0.9).greedy
False
>>> SpecConfig(gamma="auto").gamma
'auto'
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import SpecdecError

SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1
"""The seeds torch.Generator.manual_seed takes."""

BUILTIN_TARGETS = ("smollm2-135m", "gemma3-270m")
"""The models that install from PyPI with specdec (specdec.models says where from)."""
BACKENDS = ("auto", "lean", "transformers")
"""The forward passes a target can run on (specdec.backends.make_backend)."""
DRAFTER_KINDS = ("auto", "prompt-lookup", "prompt-lookup-tree", "suffix", "ngram", "ngram-tree", "model", "model-tli",
                 "model-slem", "self-q4", "trained", "trained-tree", "lookup-else-trained", "none")
DRAFTER_SYNTAX = ("auto, prompt-lookup, prompt-lookup-tree, suffix, ngram[:TABLE.npz], ngram-tree[:TABLE.npz], "
                  "model:NAME_OR_DIR, model-tli:NAME_OR_DIR, model-slem:NAME_OR_DIR, self-q4, trained[:DIR], "
                  "trained-tree[:DIR], lookup-else-trained[:DIR], none, or a trained drafter's directory")
"""How a drafter is named everywhere (CLI, API, server, bench): KIND or KIND:ARGUMENT."""

WEIGHTS = ("auto", "gguf", "gguf-int8", "float", "q8_0", "q4_0")
"""--weights: where a target's linear layers read their weights. gguf: a built-in (GGUF) target's own
4/8-bit blocks (backends/gguf.py) times float32 activations, the float model's exact weights; gguf-int8:
the blocks times activations quantised to int8 per 32 (llama.cpp's arithmetic: faster at every row count,
and a slightly different model: perplexity +0-0.5 %); float: the (dequantised) weights in --dtype; auto:
gguf-int8 where it was measured faster (float32 activations chosen by --dtype auto, the lean backend,
quant.cpp runs), else float. q8_0, q4_0: any model the lean backend runs, its float weights quantised at
load to llama.cpp's Q8_0 or Q4_0 blocks (ggml's rounding), times int8 activations: a quantised model, as
llama.cpp would run it, read at ~1.06 or ~0.56 bytes a weight instead of 4 (speculation is exact for it)."""
QUANTISED_WEIGHTS = {"q8_0": "Q8_0", "q4_0": "Q4_0"}
"""The --weights that quantise a float model at load, and the GGUF block type each makes."""


def parse_drafter(spec: str) -> tuple[str, str | None]:
    """'model:NAME' -> ('model', 'NAME'); 'prompt-lookup' -> ('prompt-lookup', None); a path that
    exists (a trained drafter's directory, which may hold a colon) is kept whole.

    >>> parse_drafter("model:HuggingFaceTB/SmolLM2-135M-Instruct")
    ('model', 'HuggingFaceTB/SmolLM2-135M-Instruct')
    """
    from pathlib import Path

    if not isinstance(spec, str) or not spec.strip():
        raise SpecdecError(f"a drafter is named {DRAFTER_SYNTAX}; got {spec!r}")
    kind, sep, argument = spec.partition(":")
    if not sep or kind not in DRAFTER_KINDS or Path(spec).exists():
        return spec, None
    if kind in ("auto", "prompt-lookup", "prompt-lookup-tree", "suffix", "self-q4", "none"):
        raise SpecdecError(f"the {kind} drafter takes no argument, got {spec!r}")
    if not argument:
        raise SpecdecError(f"{spec!r}: give the argument after the colon, as in {kind}:PATH")
    return kind, argument


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are drawn. Applied identically to the target p and the draft q, so speculative
    output follows exactly the target's *warped* distribution."""

    temperature: float = 0.0
    """0 means greedy (argmax, its own exact path); > 0 divides the logits before the softmax."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 keeps all."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p; in (0, 1]."""
    seed: int | None = None
    """Seed of the request's own torch.Generator; None draws a fresh one."""
    drafter_invariant: bool = False
    """Draw every token, the target's and the drafter's, as argmax p(x)/E_x with Exp(1) noise keyed
    by (seed, position) (needs a seed). Speculative output then equals plain sampling with that seed
    token for token, whatever the drafter, gamma or load (Daliri, Musco, Suresh 2024: drafter-
    invariant speculative decoding); a draft is accepted when the target's draw at its position is
    the same token, with probability at least (1 - TV) / (1 + TV). Off: rejection sampling, whose
    acceptance is the larger 1 - TV but whose output depends on the drafts."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the target's logits, as OpenAI's logit_bias (-100 bans a token)."""
    presence_penalty: float = 0.0
    """Subtracted from the logit of every token the output already holds (OpenAI's, in [-2, 2])."""
    frequency_penalty: float = 0.0
    """Times a token's count in the output so far, subtracted from its logit (OpenAI's, in [-2, 2]).
    Bias and penalties change the target's distribution p at each position, counting the drafts
    before that position as output; drafts are verified against that p with the q they were drawn
    from, so speculation stays exact (a drafter that ignores them is just accepted less)."""
    logprobs: int | None = None
    """Record the target's log-probability of each emitted token (its raw distribution, before
    temperature, top-k/p, bias and penalties, as vLLM reports) and of the `logprobs` likeliest
    alternatives; None: off."""

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise SpecdecError(f"temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}")
        if math.isinf(self.temperature):
            raise SpecdecError("temperature must be finite")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise SpecdecError(f"top-k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise SpecdecError(f"top-p must be in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not (SEED_MIN <= self.seed <= SEED_MAX):
            raise SpecdecError(f"seed must be in [-2^63, 2^64), got {self.seed}")
        if self.drafter_invariant and self.seed is None:
            raise SpecdecError("drafter-invariant sampling needs a seed: its noise is keyed by (seed, position)")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not -2.0 <= value <= 2.0:
                raise SpecdecError(f"{name} must be a number in [-2, 2], got {value!r}")
        for token, bias in self.logit_bias:
            if not isinstance(token, int) or token < 0:
                raise SpecdecError(f"logit_bias keys must be token ids >= 0, got {token!r}")
            if not isinstance(bias, (int, float)) or not -100.0 <= bias <= 100.0:
                raise SpecdecError(f"logit_bias values must be numbers in [-100, 100], got {bias!r} for token {token}")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            raise SpecdecError(f"logprobs must be an integer in [0, 20] (alternatives per token), got {self.logprobs!r}")

    @classmethod
    def for_request(cls, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                    drafter_invariant: bool | None = None, **adjustments) -> SamplingParams:
        """Settings for a user's request: a seeded sampled request is drafter-invariant unless told
        otherwise, so its output depends on the seed alone (the CLI, the API and the server).
        `adjustments`: logit_bias, presence_penalty, frequency_penalty, logprobs."""
        if drafter_invariant is None:
            drafter_invariant = seed is not None and temperature > 0
        return cls(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, drafter_invariant=drafter_invariant,
                   **adjustments)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalised(self) -> bool:
        """Whether the target's logits depend on the output so far (presence or frequency penalty)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0


@dataclass(frozen=True)
class SpecConfig:
    """How much to speculate and when to stop."""

    gamma: int | str = "auto"
    """Draft tokens per round: an integer >= 0 (0 = plain decoding) or "auto" (chosen each round
    from running estimates of alpha and c to maximise the paper's expected walltime improvement)."""
    gamma_max: int = 16
    """Upper bound for "auto" (in bf16 on this CPU scoring up to ~16 positions costs about one step)."""
    max_new_tokens: int = 128
    """Stop after this many generated tokens."""
    stop_at_eos: bool = True
    """Stop at the target's end-of-sequence token(s)."""

    def __post_init__(self) -> None:
        if isinstance(self.gamma, str):
            if self.gamma != "auto":
                raise SpecdecError(f"gamma must be an integer >= 0 or 'auto', got {self.gamma!r}")
        elif not isinstance(self.gamma, int) or isinstance(self.gamma, bool) or self.gamma < 0:
            raise SpecdecError(f"gamma must be an integer >= 0 or 'auto', got {self.gamma!r}")
        if not isinstance(self.gamma_max, int) or self.gamma_max < 1:
            raise SpecdecError(f"gamma-max must be an integer >= 1, got {self.gamma_max!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise SpecdecError(f"max-new-tokens must be an integer >= 1, got {self.max_new_tokens!r}")

    @staticmethod
    def parse_gamma(text: str) -> int | str:
        """'auto' or a non-negative integer, as typed on a command line."""
        if text == "auto":
            return "auto"
        try:
            value = int(text)
        except ValueError:
            raise SpecdecError(f"gamma must be an integer >= 0 or 'auto', got {text!r}") from None
        if value < 0:
            raise SpecdecError(f"gamma must be >= 0 (0 = plain decoding), got {value}")
        return value
