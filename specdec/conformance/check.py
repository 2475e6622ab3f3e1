"""`specdec verify`: an exactness conformance check for a user's own target and drafter.

Three checks, each PASS or FAIL with its numbers. Their statistical tests form one family whose
chance of any false alarm is at most α (10⁻³) by Holm's correction (`exactness`):

1. Distribution, per prompt: N speculative continuations of k tokens. Their first tokens against
   the target's exact next-token law (χ² goodness of fit); their k-token law against N' plain
   continuations (χ² homogeneity). Then long speculative continuations, every token of which is
   turned into a randomised PIT value against the target's law given its prefix (scored afresh,
   with the target's own one-position numerics): uniform if and only if every round, every bonus
   token, every rollback and every catch-up of the drafter left the law alone. The bonus tokens
   alone (the target's token after an all-accepted round, drawn from p_{k+1}; for a token tree,
   after a path accepted down to a leaf) get the same test.
   Each test reports the smallest TV it catches with 90 % power, simulated from the measured law.
2. Greedy parity (and, for drafter-invariant sampling, seeded parity: the same with each of a few
   seeds, where the output must not depend on the drafter either). Speculative vs plain, token
   for token, over long continuations.
   A divergence is explained only when both passes ran the same numeric path and the target's
   top-2 gap there is within twice the rounding difference measured between that pass's row count
   and a one-position pass at that very position; otherwise it FAILs, naming both passes. (On a
   row-invariant path the measured difference is 0, so every divergence fails.)
3. Acceptance. At each draft position i, the verifier accepts with probability β_i = Σ min(p, q)
   given the past, so accepted − Σβ is a martingale: a z-test per position and one overall. A q
   that is not the distribution the draft was drawn from, an acceptance rule off by a bonus or a
   position, fails here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from ..config import SamplingParams, SpecConfig
from ..decoding.sampling import position_noise, probs
from .exactness import (
    StatTest,
    acceptance_z,
    detectable_tv,
    goodness_of_fit,
    holm,
    homogeneity,
    randomized_pit,
    sample_continuations,
    uniformity,
)


@dataclass(frozen=True)
class Settings:
    """How hard `specdec verify` looks. The defaults catch a TV of 0.05 on the first token with 90 %
    power on the built-in model (README: "Exactness"); `quick()` is for CI."""

    samples: int = 4500
    """Speculative continuations per prompt (first-token and k-token tests): one round each."""
    plain_samples: int = 0
    """Plain continuations per prompt, the reference of the k-token test (0: no such test; the PIT
    of long runs tests every later token against the target's exact law instead)."""
    k: int = 1
    long_runs: int = 10
    """Long speculative continuations per prompt for the PIT tests."""
    long_tokens: int = 64
    bonus_rescores: int = 400
    """Short runs whose bonus token is also tested, at most (each costs a pass of the target)."""
    parity_tokens: int = 96
    parity_seeds: int = 8
    """Seeds of the seeded parity check (drafter-invariant sampling only)."""
    alpha: float = 1e-3
    """The family-wise false-alarm rate."""

    @staticmethod
    def quick() -> Settings:
        return Settings(samples=1600, long_runs=8, long_tokens=48, bonus_rescores=100, parity_tokens=48, parity_seeds=3)


@dataclass
class Check:
    name: str
    passed: bool
    lines: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    tests: list[StatTest] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"name": self.name, "passed": self.passed, "details": self.lines,
                "tests": [t.to_dict() for t in self.tests], **self.data}


@dataclass
class Report:
    target: str
    drafter: str
    dtype: str
    sampling: dict
    path: str = ""
    """The numeric path the target ran (e.g. lean+gguf-int8): exactness is relative to it."""
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    @property
    def detectable_tv(self) -> float | None:
        """The largest of the first-token tests' detectable TVs: what this run could surely see."""
        values = [t.detectable_tv for c in self.checks for t in c.tests
                  if t.detectable_tv is not None and "first token" in t.name]
        return max(values) if values else None

    def to_dict(self) -> dict:
        return {"target": self.target, "path": self.path, "drafter": self.drafter, "dtype": self.dtype,
                "sampling": self.sampling,
                "passed": self.passed, "detectable_tv": self.detectable_tv,
                "checks": [c.to_dict() for c in self.checks]}

    def to_text(self) -> str:
        on = f" on {self.path}" if self.path else ""
        out = [f"specdec verify: target {self.target}{on}, drafter {self.drafter}, dtype {self.dtype}, "
               f"sampling {self.sampling}"]
        for c in self.checks:
            out.append(f"[{'PASS' if c.passed else 'FAIL'}] {c.name}")
            out += [f"    {line}" for line in c.lines]
            out += [f"    {t.describe()}" for t in c.tests]
        if self.detectable_tv is not None:
            out.append(f"power: this run catches a first-token TV of {self.detectable_tv:.3f} with 90% probability")
        out.append("ALL PASS" if self.passed else "FAILED")
        return "\n".join(out)


@torch.inference_mode()
def target_probs(backend, prompt_ids: list[int], tokens: list[int], sampling: SamplingParams) -> torch.Tensor:
    """(len(tokens), V) the target's warped law of each token given its prefix, computed as plain
    decoding computes it: in passes of at most `fast_rows` positions (one where there is no
    row-invariant path), so a check at thousands of tokens does not see the rounding of long passes."""
    sequence = list(prompt_ids) + list(tokens)
    chunk = backend.fast_rows or 1
    backend.prefill(torch.tensor(sequence[: len(prompt_ids) - 1]))
    rows = []
    for start in range(len(prompt_ids) - 1, len(sequence) - 1, chunk):
        rows.append(backend.forward(torch.tensor(sequence[start : min(start + chunk, len(sequence) - 1)])))
    backend.rollback(len(prompt_ids) - 1)
    return probs(torch.cat(rows), sampling)


def next_token_law(backend, prompt_ids: list[int], sampling: SamplingParams) -> dict:
    dist = target_probs(backend, prompt_ids, prompt_ids[-1:], sampling)[0].double()
    return {(t,): float(dist[t]) for t in dist.nonzero().flatten().tolist()}


def ran_past_eos(tokens: list[int], eos_token_ids) -> bool:
    """Whether a token follows an end-of-sequence token (a run must stop at one, drafted or not)."""
    return any(t in eos_token_ids for t in tokens[:-1])


def pit_values(backend, ids: list[int], tokens: list[int], indices: list[int], sampling: SamplingParams,
               noise: torch.Generator) -> list[float]:
    """Randomised PIT values of tokens[j] for j in `indices` against the target's law given their
    prefix (rescored as plain decoding scores), with uniforms from `noise`."""
    law = target_probs(backend, ids, tokens[: max(indices) + 1], sampling)
    u = torch.rand(len(indices), generator=noise).tolist()
    return [randomized_pit(law[j], tokens[j], u[n]) for n, j in enumerate(indices)]


def long_runs(spec, backend, ids: list[int], sampling: SamplingParams, gamma, settings: Settings, seed: int,
              stats_sink: list) -> tuple[list[float], list[float], int]:
    """PIT values of every token, and of the bonus tokens alone, of `long_runs` speculative runs,
    and how many of them went on past an end-of-sequence token."""
    pit_all, pit_bonus, past_eos = [], [], 0
    noise = torch.Generator().manual_seed(seed ^ 0x5EED)  # the PIT's own uniforms, apart from the engine's
    for r in range(settings.long_runs):
        run = spec.generate(ids, replace(sampling, seed=seed + r),
                            SpecConfig(gamma=gamma, max_new_tokens=settings.long_tokens)).run()
        stats_sink.append(run.stats)
        past_eos += ran_past_eos(run.tokens, spec.eos_token_ids)
        if not run.tokens:
            continue
        values = pit_values(backend, ids, run.tokens, list(range(len(run.tokens))), sampling, noise)
        pit_all += values
        pit_bonus += [values[i] for i in run.stats.bonus_indices()]
    return pit_all, pit_bonus, past_eos


def short_run_bonuses(backend, ids: list[int], runs: list, sampling: SamplingParams, limit: int,
                      seed: int) -> list[float]:
    """PIT values of the bonus tokens of the short distribution runs (the first `limit` that have
    one): all-accepted rounds are rare in long runs when acceptance is low."""
    noise = torch.Generator().manual_seed(seed ^ 0xB0B)
    values = []
    for tokens, stats in runs:
        bonuses = [j for j in stats.bonus_indices() if j < len(tokens)]
        if not bonuses:
            continue
        values += pit_values(backend, ids, tokens, bonuses, sampling, noise)
        limit -= 1
        if limit == 0:
            break
    return values


def distribution_check(plain, spec, backend, prompts: list[list[int]], sampling: SamplingParams, gamma,
                       settings: Settings, seed: int, stats_sink: list) -> Check:
    tests, pit_all, pit_bonus, past_eos = [], [], [], 0
    for i, ids in enumerate(prompts):
        base = seed + 10_000_000 * i
        runs: list = []
        spec_counts = sample_continuations(spec, ids, settings.k, sampling, gamma, settings.samples, base, stats_sink,
                                           runs)
        first: Counter = Counter()
        for key, count in spec_counts.items():
            first[key[:1]] += count
        tests.append(goodness_of_fit(f"prompt {i}: first token vs the target's exact law", first,
                                     next_token_law(backend, ids, sampling)))
        if settings.plain_samples:
            plain_counts = sample_continuations(plain, ids, settings.k, sampling, 0, settings.plain_samples,
                                                base + 5_000_000)
            tests.append(homogeneity(f"prompt {i}: {settings.k}-token law, speculative vs plain", spec_counts,
                                     plain_counts))
        past_eos += sum(ran_past_eos(tokens, spec.eos_token_ids) for tokens, _ in runs)
        values, bonus, past = long_runs(spec, backend, ids, sampling, gamma, settings, base + 7_000_000, stats_sink)
        past_eos += past
        pit_all += values
        pit_bonus += bonus + short_run_bonuses(backend, ids, runs, sampling, settings.bonus_rescores, base + 9_000_000)
    tests.append(uniformity("every token of long runs given its prefix (PIT)", pit_all))
    tests.append(uniformity("bonus tokens after all-accepted rounds given their prefix (PIT)", pit_bonus))
    drafted = sum(s.drafted for s in stats_sink)
    lines = [f"speculative runs drafted {drafted} tokens, accepted {sum(s.accepted for s in stats_sink)}; "
             f"{len(pit_all)} tokens of long runs, {len(pit_bonus)} of them bonus tokens"]
    if drafted == 0:
        lines.append("the drafter proposed nothing on these prompts, so the verifier was never exercised")
    if past_eos:
        lines.append(f"{past_eos} runs went on past an end-of-sequence token (plain decoding stops there)")
    return Check("distribution", drafted > 0 and not past_eos, lines, {"drafted": drafted, "past_eos": past_eos},
                 tests)


def acceptance_check(stats: list) -> Check:
    """A z-test per draft position and one over all positions."""
    tests: list[StatTest] = []
    width = max((len(s.position_tested) for s in stats), default=0)
    for i in range(width):
        accepted = sum(s.position_accepted[i] for s in stats if i < len(s.position_accepted))
        tested = sum(s.position_tested[i] for s in stats if i < len(s.position_tested))
        beta = sum(s.position_beta_sum[i] for s in stats if i < len(s.position_beta_sum))
        beta_sq = sum(s.position_beta_sq_sum[i] for s in stats if i < len(s.position_beta_sq_sum))
        if tested:
            tests.append(acceptance_z(f"draft position {i + 1}: accepted {accepted}/{tested} vs Σβ {beta:.1f}",
                                      accepted, beta, beta_sq, tested))
    accepted, tested = sum(s.accepted for s in stats), sum(s.beta_count for s in stats)
    beta, beta_sq = sum(s.beta_sum for s in stats), sum(s.beta_sq_sum for s in stats)
    if not tested:
        return Check("acceptance", True, ["no draft position was tested: nothing to compare"], {"tested": 0})
    tests.append(acceptance_z(f"all positions: accepted {accepted}/{tested} vs Σβ {beta:.1f}", accepted, beta,
                              beta_sq, tested))
    lines = [f"count estimate α = {accepted / tested:.4f}, mean β = Σmin(p,q)/n = {beta / tested:.4f}"]
    return Check("acceptance", True, lines, {"alpha_count": accepted / tested, "beta_mean": beta / tested,
                                             "tested": tested}, tests)


@torch.inference_mode()
def reproduce(backend, sequence: list[int], prompt_len: int, index: int, round_start: int,
              rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's logits for generated token `index` of `sequence` twice: from a one-position pass
    (plain decoding's) and from row index - round_start of a `rows`-position pass (the pass
    speculation ran there; positions after that row are filled in, which cannot change it)."""
    at = prompt_len + index - 1  # the position whose logits predict the token
    backend.prefill(torch.tensor(sequence[:at]))
    one = backend.forward(torch.tensor(sequence[at : at + 1]))[0]
    first = prompt_len + round_start - 1
    inputs = sequence[first : at + 1]
    inputs = inputs + [inputs[-1]] * (rows - len(inputs))
    backend.prefill(torch.tensor(sequence[:first]))
    many = backend.forward(torch.tensor(inputs))[index - round_start]
    backend.rollback(first)
    return one, many


def scores(logits: torch.Tensor, sampling: SamplingParams, position: int) -> torch.Tensor:
    """What the token at `position` is the argmax of: the logits (greedy), or log p − log E with the
    position's noise (drafter-invariant sampling)."""
    if sampling.greedy:
        return logits.float()
    log_p = probs(logits[None], sampling)[0].double().log()
    return log_p - position_noise(sampling.seed, position, logits.shape[-1]).log()


@torch.inference_mode()
def parity_check(plain, spec, backend, prompts: list[list[int]], max_new_tokens: int, gamma,
                 sampling: SamplingParams, seeds: list[int | None]) -> Check:
    """Speculative output against plain output token for token: greedy, or drafter-invariant
    sampling with each seed (whose output must not depend on the drafter either)."""
    lines, divergences, failed = [], [], False
    name = "greedy parity" if sampling.greedy else "seeded parity"
    for i, ids in enumerate(prompts):
        identical = 0
        for seed in seeds:
            params = sampling if seed is None else replace(sampling, seed=seed)
            expected = plain.generate(ids, params, SpecConfig(gamma=0, max_new_tokens=max_new_tokens)).run().tokens
            run = spec.generate(ids, params, SpecConfig(gamma=gamma, max_new_tokens=max_new_tokens)).run()
            got = run.tokens
            where = f"prompt {i}" + ("" if seed is None else f", seed {seed}")
            if got == expected:
                identical += 1
                continue
            j = next((t for t, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            if j >= min(len(got), len(expected)):  # the same tokens, but one run stopped and the other went on
                failed = True
                lines.append(f"{where}: one output stops after token {j}, the other goes on -> NOT explained")
                divergences.append({"prompt": i, "seed": seed, "position": j, "explained": False})
                continue
            round_start, rows = run.stats.pass_of(j)
            spec_path, plain_path = backend.numeric_path(rows), backend.numeric_path(1)
            one, many = reproduce(backend, ids + expected[: j + 1], len(ids), j, round_start, rows)
            one, many = scores(one, params, len(ids) + j), scores(many, params, len(ids) + j)
            a, b = expected[j], got[j]
            gap = float(one[a] - one[b])  # the plain pass's margin for its own token
            delta = abs(gap - float(many[a] - many[b]))
            explained = spec_path == plain_path and gap <= 2 * delta
            failed |= not explained
            divergences.append({"prompt": i, "seed": seed, "position": j, "gap": gap, "rounding_difference": delta,
                                "speculative_pass": {"rows": rows, "path": spec_path},
                                "plain_pass": {"rows": 1, "path": plain_path}, "explained": explained})
            cause = (f"speculative pass of {rows} positions on {spec_path}, plain pass of 1 on {plain_path}; "
                     f"gap {gap:.4g} between the two tokens, moved by {delta:.4g} between the two row counts")
            verdict = ("explained: a near-tie that the row count's rounding flips" if explained else
                       "NOT explained" + (" (different numeric paths)" if spec_path != plain_path else ""))
            lines.append(f"{where}: diverges at token {j}: {cause} -> {verdict}")
        lines.insert(0, f"prompt {i}: {identical} of {len(seeds)} identical ({max_new_tokens} tokens at most each)")
    return Check(name, not failed, lines, {"divergences": divergences})


def invariant_acceptance_note() -> Check:
    return Check("acceptance", True, ["drafter-invariant sampling: a draft is accepted when the target's own "
                                      "draw there is the same token, so there is no β to test; the seeded "
                                      "parity check covers the verifier"], {"tested": 0})


def run_conformance(target_name: str, dtype: torch.dtype, plain, spec, backend, prompts: list[list[int]],
                    sampling: SamplingParams, gamma, settings: Settings = Settings(), seed: int = 0,
                    drafter_name: str = "") -> Report:
    report = Report(target_name, drafter_name, str(dtype).removeprefix("torch."),
                    {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                     "gamma": gamma, "k": settings.k, "samples": settings.samples,
                     "plain_samples": settings.plain_samples, "long_runs": settings.long_runs,
                     "long_tokens": settings.long_tokens, "alpha": settings.alpha}, path=backend.path)
    stats: list = []
    if sampling.greedy:
        report.checks.append(Check("distribution", True, ["temperature 0: the law is a point mass; see greedy parity"]))
    else:
        report.checks.append(distribution_check(plain, spec, backend, prompts, sampling, gamma, settings, seed, stats))
    greedy = SamplingParams(temperature=0.0)
    report.checks.append(parity_check(plain, spec, backend, prompts, settings.parity_tokens, gamma, greedy, [None]))
    if sampling.drafter_invariant:
        report.checks.append(parity_check(plain, spec, backend, prompts, settings.parity_tokens, gamma, sampling,
                                          list(range(seed, seed + settings.parity_seeds))))
        report.checks.append(invariant_acceptance_note())
    else:
        report.checks.append(acceptance_check(stats))
    family = [t for c in report.checks for t in c.tests]
    holm(family, settings.alpha)
    level = settings.alpha / max(len(family), 1)  # the strictest step of Holm's: power is at least this
    for test in family:
        test.detectable_tv = detectable_tv(test, level)
    for check in report.checks:
        check.passed = check.passed and not any(t.rejected for t in check.tests)
    return report
