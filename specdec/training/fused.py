"""Self-distillation in the passes the engine runs: sample the target's answers and record its
teacher signal in the same passes, on the backend specdec generates with.

The transformers sampler (`data._answers`, then `data._teacher`) runs the model twice over every
answer: once to sample it, once teacher-forced to record features and top-k. But the pass that
samples token t+1 has already computed everything the teacher records at position t — the logits
(top-k at temperature 1) and the hidden states (final-norm features, and eagle3's layer inputs) —
so here each position is scored exactly once:

- every sequence is a fork of the target backend (its own KV cache on the same weights), and one
  `forward_many` per step serves them all (continuous batching: a sequence that ends hands its
  place to the next prompt at once, prompts are fed in chunks beside the others' decoding);
- the rows of a step are the prompt chunk or the last sampled token of each sequence; the logits of
  every row give that position's top-k, the last row's the next token (argmax at T = 0, a draw at
  T > 0 from a seeded generator);
- the last answer token (EOS, or the one that reaches max_new_tokens) is fed once more to record
  its own position, as the teacher pass would; the token drawn after it is dropped.

The teacher signal is then the target's on the path it serves on (the GGUF blocks with int8
activations, kernels.cpp, ...), which is the distribution a drafter's proposals are verified
against; a teacher-forced pass over the same sequences on that backend gives the same records
(tests/test_trained.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..backends.base import Backend, Step


@dataclass
class Answered:
    """One sequence's record: the answer and, for every position of prompt + answer, the target's
    hidden states (the recorded layers, concatenated) and top-k next-token ids and probabilities."""

    answer: list[int]
    hidden: torch.Tensor  # (n, k*d) bfloat16, as the data keeps them
    topk_ids: torch.Tensor  # (n, K)
    topk_probs: torch.Tensor  # (n, K)


@dataclass(eq=False)
class _Running:
    index: int
    prompt: list[int]
    temperature: float
    answer: list[int] = field(default_factory=list)
    fed: int = 0  # positions of prompt + answer scored so far
    ended: bool = False  # no more tokens to draw; the last one still needs its own position
    ids: list[torch.Tensor] = field(default_factory=list)
    probs: list[torch.Tensor] = field(default_factory=list)

    def next_rows(self, budget: int) -> list[int]:
        if self.fed < len(self.prompt):
            return self.prompt[self.fed : self.fed + max(1, budget)]
        return [self.answer[-1]]


def sample_and_record(target: Backend, prompts: list[list[int]], temperatures: list[float], max_new_tokens: int,
                      eos: set[int], topk: int, layers: tuple[int, ...] = (), batch: int = 32, row_budget: int = 256,
                      generator: torch.Generator | None = None, progress=lambda n: None) -> list[Answered]:
    """Answer each prompt at its temperature and record every position's teacher signal.

    layers: the hidden states to record (Backend.hidden_layers: () the final-norm features; the
    index N, the number of layers, is the final-norm output among other layers' inputs).
    batch: sequences at once (1 where the target cannot fork); row_budget: the most prompt rows of
    one step, shared by the sequences still reading their prompts (decoding rows come first).
    The target's own sequence is one of them: it is left empty, recording nothing."""
    if len(prompts) != len(temperatures):
        raise ValueError(f"{len(prompts)} prompts but {len(temperatures)} temperatures")
    if any(not p for p in prompts):
        raise ValueError("every prompt needs at least one token")
    width = batch if target.can_fork else 1
    sequences = [target] + [target.fork() for _ in range(min(width, len(prompts)) - 1)]
    for sequence in sequences:
        sequence.record_features(True, layers)
        sequence.reset()
    waiting = list(range(len(prompts)))[::-1]
    running: dict[int, _Running] = {}  # by place in `sequences`
    done: dict[int, Answered] = {}

    def start(place: int) -> None:
        if waiting:
            i = waiting.pop()
            running[place] = _Running(i, list(prompts[i]), float(temperatures[i]))
            sequences[place].reset()
        else:
            running.pop(place, None)

    for place in range(len(sequences)):
        start(place)
    while running:
        places = sorted(running)
        reading = sum(1 for p in places if running[p].fed < len(running[p].prompt))
        share = max(1, (row_budget - (len(places) - reading)) // max(1, reading))
        work = [(sequences[p], Step(torch.tensor(running[p].next_rows(share)))) for p in places]
        logits = target.forward_many(work)
        every = torch.cat(logits)  # one top-k for all rows of the step
        top = every.topk(min(topk, every.shape[-1]), dim=-1)
        top_probs = (top.values - every.logsumexp(dim=-1, keepdim=True)).exp()
        draw, ends = [], []
        for place, (_, step), ids, probs in zip(places, work, top.indices.split([s.rows for _, s in work]),
                                                top_probs.split([s.rows for _, s in work])):
            run = running[place]
            run.ids.append(ids)
            run.probs.append(probs)
            run.fed += step.rows
            if run.fed < len(run.prompt) + len(run.answer):
                continue  # more of the prompt to read
            (ends if run.ended else draw).append(place)
        if draw:
            last = torch.stack([logits[places.index(p)][-1] for p in draw])
            tokens = _draw(last, torch.tensor([running[p].temperature for p in draw]), generator)
            for place, token in zip(draw, tokens.tolist()):
                run = running[place]
                run.answer.append(token)
                run.ended = token in eos or len(run.answer) >= max_new_tokens
        for place in ends:
            run, sequence = running[place], sequences[place]
            # a copy: the sequence's buffer is reused by its next prompt (a bf16 backend's .to() is the buffer)
            done[run.index] = Answered(run.answer, sequence.hidden(0, run.fed).to(torch.bfloat16, copy=True),
                                       torch.cat(run.ids), torch.cat(run.probs))
            progress(1)
            start(place)
    for sequence in sequences:
        sequence.record_features(False)
        sequence.reset()
    return [done[i] for i in range(len(prompts))]


def _draw(logits: torch.Tensor, temperatures: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row: the argmax where the temperature is 0, else a draw from softmax(logits / T)
    by inverting its cumulative distribution at one uniform number a row (in float64; for all rows at
    once, where torch.multinomial costs ~1 ms a row over a 49k vocabulary)."""
    tokens = logits.argmax(dim=-1)
    hot = (temperatures > 0).nonzero()[:, 0]
    if hot.numel():
        probs = (logits[hot].double() / temperatures[hot, None].double()).softmax(dim=-1)
        cdf = probs.cumsum(dim=-1)
        u = torch.rand(hot.numel(), 1, generator=generator, dtype=torch.float64) * cdf[:, -1:]
        tokens[hot] = torch.searchsorted(cdf, u, right=True)[:, 0].clamp(max=logits.shape[-1] - 1)
    return tokens
