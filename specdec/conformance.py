"""`specdec verify`: an exactness conformance check for a user's own target and drafter.

Three checks, each PASS or FAIL with its numbers:

1. Distribution. For each prompt, N continuations of k tokens by plain sampling and N by
   speculative sampling, independent seeds: two-sample total-variation test on the k-token law;
   and the first tokens of the speculative samples against the target's exact next-token law
   (one-sample test). Thresholds and power come from `exactness` (derived, no magic constants).
2. Greedy parity. Speculative greedy vs plain greedy, token for token. In float32 they must match.
   In reduced precision a pass over several positions rounds differently from a pass over one, so
   at a near-tie of the top two logits the argmax can flip. Each divergence is reported with the
   target's top-2 logit gap there and is explained only if the gap is within the rounding noise of
   the dtype at that logit scale: gap <= 2 · eps(dtype) · max|logit| · sqrt(layers), i.e. a few
   units in the last place of the largest logit, grown like a random walk through the layers.
3. Acceptance sanity. Given the run, position i is accepted with probability β_i = Σ min(p_i, q_i),
   so (accepted − Σβ) / sqrt(Σβ(1−β)) is approximately standard normal; |z| > 3.29 (two-sided
   p < 0.001) fails. A verifier whose q is not the distribution the draft was drawn from fails here.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import torch

from .config import SamplingParams, SpecConfig
from .exactness import one_sample_check, sample_continuations, two_sample_check
from .sampling import probs


@dataclass
class Check:
    name: str
    passed: bool
    lines: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "details": self.lines, **self.data}


@dataclass
class Report:
    target: str
    drafter: str
    dtype: str
    sampling: dict
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def to_dict(self) -> dict:
        return {"target": self.target, "drafter": self.drafter, "dtype": self.dtype, "sampling": self.sampling,
                "passed": self.passed, "checks": [c.to_dict() for c in self.checks]}

    def to_text(self) -> str:
        out = [f"specdec verify: target {self.target}, drafter {self.drafter}, dtype {self.dtype}, "
               f"sampling {self.sampling}"]
        for c in self.checks:
            out.append(f"[{'PASS' if c.passed else 'FAIL'}] {c.name}")
            out += [f"    {line}" for line in c.lines]
        out.append("ALL PASS" if self.passed else "FAILED")
        return "\n".join(out)


@torch.inference_mode()
def next_token_law(backend, prompt_ids: list[int], sampling: SamplingParams) -> dict:
    backend.prefill(torch.tensor(prompt_ids[:-1]))
    logits = backend.forward(torch.tensor(prompt_ids[-1:]))
    backend.rollback(len(prompt_ids) - 1)
    dist = probs(logits, sampling)[0].double()
    nz = dist.nonzero().flatten().tolist()
    return {(t,): float(dist[t]) for t in nz}


def distribution_check(plain, spec, backend, prompts: list[list[int]], sampling: SamplingParams, gamma, k: int,
                       samples: int, seed: int, delta: float, stats_sink: list) -> Check:
    checks, lines = [], []
    for i, ids in enumerate(prompts):
        plain_counts = sample_continuations(plain, ids, k, sampling, 0, samples, seed + 10_000_000 * i)
        spec_counts = sample_continuations(spec, ids, k, sampling, gamma, samples, seed + 10_000_000 * i + 5_000_000,
                                           stats_sink)
        two = two_sample_check(f"prompt {i}: {k}-token law, speculative vs plain", spec_counts, plain_counts, delta)
        first: Counter = Counter()
        for key, count in spec_counts.items():
            first[key[:1]] += count
        one = one_sample_check(f"prompt {i}: first token vs the target's exact law", first,
                               next_token_law(backend, ids, sampling), delta)
        for c in (two, one):
            checks.append(c)
            lines.append(f"{c.name}: TV {c.distance:.4f} vs threshold {c.threshold:.4f} "
                         f"({'ok' if c.passed else 'TOO FAR'}); N={c.samples}, {c.support} outcomes, "
                         f"detects TV >= {c.detectable_tv:.3f} with prob >= {1 - c.delta:g}")
    drafted = sum(s.drafted for s in stats_sink)
    lines.append(f"speculative samples drafted {drafted} tokens, accepted {sum(s.accepted for s in stats_sink)}")
    passed = all(c.passed for c in checks) and drafted > 0
    if drafted == 0:
        lines.append("the drafter proposed nothing on these prompts, so the verifier was never exercised")
    return Check("distribution", passed, lines, {"tests": [c.to_dict() for c in checks], "drafted": drafted})


def near_tie_tolerance(dtype: torch.dtype, logits: torch.Tensor, layers: int) -> float:
    """2 · eps(dtype) · max|logit| · sqrt(layers): the rounding noise a logit can carry."""
    return 2 * torch.finfo(dtype).eps * float(logits.abs().max()) * math.sqrt(max(layers, 1))


@torch.inference_mode()
def greedy_parity_check(plain, spec, backend, prompts: list[list[int]], max_new_tokens: int, gamma,
                        dtype: torch.dtype, layers: int) -> Check:
    lines, divergences, failed = [], [], False
    greedy = SamplingParams(temperature=0.0)
    for i, ids in enumerate(prompts):
        expected = plain.generate(ids, greedy, SpecConfig(gamma=0, max_new_tokens=max_new_tokens)).run().tokens
        got = spec.generate(ids, greedy, SpecConfig(gamma=gamma, max_new_tokens=max_new_tokens)).run().tokens
        if got == expected:
            lines.append(f"prompt {i}: identical ({len(got)} tokens)")
            continue
        j = next((t for t, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        context = ids + expected[:j]
        backend.prefill(torch.tensor(context[:-1]))
        logits = backend.forward(torch.tensor(context[-1:]))[0]
        top2 = torch.topk(logits, 2).values
        gap = float(top2[0] - top2[1])
        tol = near_tie_tolerance(dtype, logits, layers)
        explained = dtype != torch.float32 and gap <= tol
        failed |= not explained
        divergences.append({"prompt": i, "position": j, "top2_gap": gap, "tolerance": tol, "explained": explained})
        lines.append(f"prompt {i}: diverges at token {j}: top-2 logit gap {gap:.4f}, near-tie tolerance {tol:.4f} "
                     f"-> {'a near-tie in ' + str(dtype).removeprefix('torch.') if explained else 'NOT a near-tie'}")
    return Check("greedy parity", not failed, lines, {"divergences": divergences})


def acceptance_check(stats: list) -> Check:
    accepted = sum(s.accepted for s in stats)
    beta = sum(s.beta_sum for s in stats)
    variance = beta - sum(s.beta_sq_sum for s in stats)
    tested = sum(s.beta_count for s in stats)
    if tested == 0:
        return Check("acceptance", True, ["no draft position was tested: nothing to compare"], {"tested": 0})
    z = (accepted - beta) / math.sqrt(variance) if variance > 0 else (0.0 if accepted == round(beta) else math.inf)
    passed = abs(z) <= 3.29
    lines = [f"count estimate α = {accepted / tested:.4f} ({accepted}/{tested} tested positions); "
             f"mean β = Σmin(p,q)/n = {beta / tested:.4f}; z = {z:.2f} (|z| <= 3.29 passes, two-sided p < 0.001)"]
    return Check("acceptance", passed, lines, {"alpha_count": accepted / tested, "beta_mean": beta / tested, "z": z,
                                               "tested": tested})


def run_conformance(target_name: str, target_model, plain, spec, backend, prompts: list[list[int]],
                    sampling: SamplingParams, gamma, k: int = 2, samples: int = 600, seed: int = 0,
                    parity_tokens: int = 96, delta: float = 1e-3, drafter_name: str = "") -> Report:
    dtype = next(target_model.parameters()).dtype
    report = Report(target_name, drafter_name, str(dtype).removeprefix("torch."),
                    {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                     "gamma": gamma, "k": k, "samples": samples})
    stats: list = []
    if sampling.greedy:
        report.checks.append(Check("distribution", True, ["temperature 0: the law is a point mass; see greedy parity"]))
    else:
        report.checks.append(distribution_check(plain, spec, backend, prompts, sampling, gamma, k, samples, seed,
                                                delta, stats))
    layers = getattr(target_model.config.get_text_config(), "num_hidden_layers", 1)
    report.checks.append(greedy_parity_check(plain, spec, backend, prompts, parity_tokens, gamma, dtype, layers))
    report.checks.append(acceptance_check(stats))
    return report
