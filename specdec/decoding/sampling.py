"""Logits -> the distribution tokens are drawn from (temperature, top-k, top-p).

The same function warps the target's logits into p and the drafter's into q: speculative decoding
is exact for whatever distribution the target's warped logits define, as long as q is the very
distribution the draft token was drawn from.

>>> import torch
>>> probs(torch.tensor([[2.0, 1.0, 0.0]]), SamplingParams(temperature=1.0, top_k=2)).round(decimals=3)
tensor([[0.7310, 0.2690, 0.0000]])
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from ..config import SamplingParams


def probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """(n, V) logits -> (n, V) float32 probabilities under temperature, top-k and top-p.

    Not for temperature 0: greedy decoding compares argmaxes and never builds a distribution."""
    assert params.temperature > 0, "greedy decoding has no distribution; use argmax"
    scores = logits.float() / params.temperature  # (n, V)
    if params.top_k and params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # (n, 1)
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        scores = scores.masked_fill(_beyond_top_p(scores, params.top_p), float("-inf"))
    return scores.softmax(dim=-1)


def argmax_rows(logits: torch.Tensor) -> torch.Tensor:
    """(n, V) -> (n,) each row's first index of its largest value, as logits.argmax(dim=-1) (a NaN
    counts as the largest, there as here), through NumPy for float rows on the CPU: ~5 us a 49k row
    against ~65 for torch's reduction here (~130 for 4 rows on two threads), once a round or token."""
    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.float64):
        return logits.argmax(dim=-1)
    return torch.from_numpy(logits.detach().numpy().argmax(axis=-1))


TOP_P_CANDIDATES = (64, 512, 4096)
"""top-p looks at this many likeliest tokens of a row first, then at that many, ..., then at all while they
hold less than top_p (a language model's top-p set is mostly a few dozen tokens, a few thousand where it is
unsure)."""


def _beyond_top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """(n, V) True where top-p drops a token: where the mass of the tokens before it, likeliest
    first, already reaches top_p (the top token always stays). Sorting a whole 49k vocabulary cost
    ~5 ms a row on the CPU, more than a decoding step; the tokens past the likeliest few whose mass
    reaches top_p are all dropped (the mass before them only grows), so only those few are sorted,
    row by row (a row's set never depends on the rows beside it)."""
    p = scores.softmax(dim=-1)
    vocab = p.shape[-1]
    drop = torch.ones_like(p, dtype=torch.bool)
    pending = torch.arange(p.shape[0])
    for k in [k for k in TOP_P_CANDIDATES if k < vocab] + [vocab]:
        top = p[pending].topk(k, dim=-1)  # (rows, k), likeliest first
        mass = top.values.cumsum(dim=-1)
        done = mass[:, -1] >= top_p if k < vocab else torch.ones(pending.numel(), dtype=torch.bool)
        kept = (mass[done] - top.values[done]) < top_p
        drop[pending[done]] = drop[pending[done]].scatter(-1, top.indices[done], ~kept)
        pending = pending[~done]
        if not pending.numel():  # at the latest after the whole sort
            break
    return drop


def adjust(logits: torch.Tensor, params: SamplingParams, counts: torch.Tensor | None = None) -> torch.Tensor:
    """(n, V) logits with the request's logit bias and penalties: counts (n, V) holds, for each
    row, how often each token occurs in the output before that row's next token (None: no penalty).

    >>> adjust(torch.zeros(1, 3), SamplingParams(logit_bias=((2, -100.0),), frequency_penalty=0.5),
    ...        torch.tensor([[2.0, 0.0, 0.0]]))
    tensor([[  -1.,    0., -100.]])
    """
    if not params.logit_bias and counts is None:
        return logits
    logits = logits.float().clone()
    if params.logit_bias:
        tokens = torch.tensor([t for t, _ in params.logit_bias])
        logits[:, tokens] += torch.tensor([b for _, b in params.logit_bias], dtype=logits.dtype)
    if counts is not None:  # only the tokens that occurred: the same numbers, without five (n, V) temporaries
        seen = (counts.amax(dim=0) > 0).nonzero().flatten()  # counts are >= 0; amax is the fast reduction
        part = counts[:, seen]
        logits[:, seen] -= part * params.frequency_penalty + (part > 0).to(logits.dtype) * params.presence_penalty
    return logits


def row_counts(output_counts: torch.Tensor, tokens: torch.Tensor, sees: torch.Tensor) -> torch.Tensor:
    """Each scored row's output token counts: the output's (V,) counts plus the drafted tokens on
    the row's own path. tokens (n,) are the drafts; sees (n + 1, n) says which drafts row r's next
    token follows (a chain's row r: drafts 0..r-1; a tree's: the node's ancestors and itself)."""
    counts = output_counts.repeat(sees.shape[0], 1)  # (n + 1, V)
    rows, drafts = sees.nonzero(as_tuple=True)  # row r sees draft j: one more of tokens[j] in row r
    counts.index_put_((rows, tokens[drafts]), torch.ones(rows.numel(), dtype=counts.dtype), accumulate=True)
    return counts


def sample(dist: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a (V,) distribution with the request's generator."""
    return samples(dist, generator, 1)[0]


def samples(dist: torch.Tensor, generator: torch.Generator, n: int) -> list[int]:
    """n independent tokens from a (V,) distribution (need not sum to 1) with the request's
    generator: its cumulative sums in float64 inverted at n uniform numbers. Exact up to float64
    rounding, and never a token of probability 0 (its interval is empty); torch.multinomial costs
    ~2 ms a draw over a 49k vocabulary on the CPU, this ~0.1 ms."""
    cdf = dist.double().cumsum(dim=-1)
    u = torch.rand(n, generator=generator, dtype=torch.float64, device=generator.device).to(cdf.device) * cdf[-1]
    return torch.searchsorted(cdf, u, right=True).clamp(max=dist.numel() - 1).tolist()


_MASK = (1 << 64) - 1


@functools.lru_cache(maxsize=16)  # 16 x 8 bytes x vocabulary: 6 MB for SmolLM2, 34 MB for Gemma-3
def _noise(seed: int, position: int, vocab: int) -> np.ndarray:
    key = (seed * 0x9E3779B97F4A7C15 + (position + 1) * 0xBF58476D1CE4E5B9) & _MASK
    key ^= key >> 31
    noise = np.random.Generator(np.random.PCG64(key)).standard_exponential(vocab)
    noise.flags.writeable = False  # shared by every draw at this position
    return noise


def position_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """(vocab,) i.i.d. Exp(1) noise keyed by (seed, position): the same for whoever draws at that
    position of that request — the target, a drafter, a plain or a speculative run. NumPy's PCG64
    and ziggurat make it in ~0.2 ms for a 49k vocabulary (torch's exponential_ took ~1.1 ms, a
    third of a plain decoding step at T > 0), and the latest positions' noise is kept: in a
    speculative round the drafter and the target draw at the same positions."""
    return torch.tensor(_noise(seed, position, vocab))


def coupled_draw(dist: torch.Tensor, seed: int, position: int) -> int:
    """argmax_x p(x) / E_x with E ~ Exp(1) keyed by (seed, position): an exact draw from `dist`
    (P(x wins) = p(x) / Σ p: the exponential race, i.e. the Gumbel-max trick), and the same token
    for any two distributions whose race the same noise decides. In float64, the first of equals."""
    noise = _noise(seed, position, dist.shape[-1])
    return int(np.argmax(dist.detach().to(device="cpu", dtype=torch.float64).numpy() / noise))  # any dtype in


def draw(dist: torch.Tensor, sampling: SamplingParams, generator: torch.Generator, position: int) -> int:
    """A drafter's or the target's draw at `position` of the sequence: from the request's generator,
    or, for drafter-invariant sampling, by the noise keyed by (seed, position)."""
    if sampling.drafter_invariant:
        return coupled_draw(dist, sampling.seed, position)
    return sample(dist, generator)


def new_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """The request's one generator; seeded once, never reseeded inside the decode loop."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
