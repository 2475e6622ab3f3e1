"""Per-generation statistics: what the paper measures, from per-round records.

alpha is reported two ways: the count estimate accepted / (accepted + rejections), and, where the
verifier saw q, the mean of beta = Σ_x min(p(x), q(x)) over the same tested positions. tau is the
number of tokens per target call, bonus included. c is the time of one draft token over the time
of one target call, both measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from . import theory


@dataclass
class GenerationStats:
    drafter: str = "none"
    path: str = ""
    """Which backend implementation ran the target."""
    draft_vocab_share: float | None = None
    """The share of the target's vocabulary the drafter can propose (None: all of it)."""
    prompt_tokens: int = 0
    new_tokens: int = 0
    target_calls: int = 0
    """Decode-time target forward passes (the prefill is counted apart)."""
    rounds_with_draft: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    tree_rounds: int = 0
    """Rounds that verified a token tree (their `drafted` counts nodes, positions are depths)."""
    beta_sum: float = 0.0
    beta_sq_sum: float = 0.0
    """Σ β², so Σ β(1 - β), the variance of the accepted count given the βs, can be formed."""
    beta_count: int = 0
    position_tested: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    position_beta_sum: list[float] = field(default_factory=list)
    position_beta_sq_sum: list[float] = field(default_factory=list)
    """Σ β and Σ β² per draft position (sampled rounds), so acceptance can be checked position by position."""
    rounds: list[tuple[int, int, int, bool]] = field(default_factory=list, repr=False)
    """(positions scored, drafts accepted, tokens emitted, whether its last token is a bonus token) per
    target call: which pass produced which token (greedy parity names the pass; the conformance check
    tests bonus tokens apart). Left out of to_dict."""
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    decode_seconds: float = 0.0
    finish_reason: str = ""

    def record_round(self, drafted: int, accepted: int, beta=None, emitted: int | None = None,
                     rejected: bool | None = None) -> None:
        """One round: `drafted` tokens proposed, the first `accepted` of them kept; `beta` is the
        verifier's (tested,) Σ min(p, q) per tested position, or None on the greedy path; `emitted`
        the tokens the round added to the output (accepted + 1 unless an end-of-sequence cut it).
        For a token tree, `drafted` counts its nodes, `accepted` the depth of the accepted path and
        `rejected` says whether the walk stopped at a node that had children (positions are depths)."""
        self.target_calls += 1
        emitted = accepted + 1 if emitted is None else emitted
        tree = rejected is not None
        if rejected is None:
            rejected = accepted < drafted
        # a bonus token: the target's own draw after a walk that no draft stopped (every draft of a
        # chain accepted, or a tree's path accepted down to a leaf), unless an end of sequence cut it
        self.rounds.append((drafted + 1, accepted, emitted, drafted > 0 and not rejected and emitted == accepted + 1))
        if drafted == 0:
            return
        self.rounds_with_draft += 1
        self.drafted += drafted
        self.accepted += accepted
        self.tree_rounds += tree
        self.rejections += rejected
        if beta is not None:
            self.beta_sum += float(beta.sum())
            self.beta_sq_sum += float((beta * beta).sum())
            self.beta_count += beta.numel()
        tested = accepted + 1 if rejected else accepted
        while len(self.position_tested) < tested:
            self.position_tested.append(0)
            self.position_accepted.append(0)
            self.position_beta_sum.append(0.0)
            self.position_beta_sq_sum.append(0.0)
        for i in range(tested):
            self.position_tested[i] += 1
            self.position_accepted[i] += i < accepted
        if beta is not None:
            for i, b in enumerate(beta.tolist()):
                self.position_beta_sum[i] += b
                self.position_beta_sq_sum[i] += b * b

    def bonus_indices(self) -> list[int]:
        """Indices (into the generated tokens) of the bonus tokens: the target's own token after a
        round whose every draft was accepted (for a tree: whose accepted path reached a leaf)."""
        out, index = [], 0
        for _, _, emitted, bonus in self.rounds:
            if bonus:
                out.append(index + emitted - 1)
            index += emitted
        return out

    def pass_of(self, index: int) -> tuple[int, int]:
        """(index of the first token that pass produced, positions it scored) for the target pass
        that produced the generated token at `index`."""
        start = 0
        for rows, _, emitted, _ in self.rounds:
            if index < start + emitted:
                return start, rows
            start += emitted
        raise IndexError(f"token {index} was not generated (the run made {start})")

    @property
    def alpha(self) -> float | None:
        """Count estimate of the acceptance rate: accepted / (accepted + rejections)."""
        tested = self.accepted + self.rejections
        return self.accepted / tested if tested else None

    @property
    def beta(self) -> float | None:
        """Mean of Σ min(p, q) over tested positions (the paper's alpha = E[beta])."""
        return self.beta_sum / self.beta_count if self.beta_count else None

    @property
    def tau(self) -> float | None:
        """Tokens per target call, bonus included."""
        return self.new_tokens / self.target_calls if self.target_calls else None

    @property
    def c(self) -> float | None:
        """Draft time per drafted token over target time per call."""
        if not self.drafted or not self.target_calls or not self.target_seconds:
            return None
        return (self.draft_seconds / self.drafted) / (self.target_seconds / self.target_calls)

    @property
    def mean_gamma(self) -> float | None:
        return self.drafted / self.rounds_with_draft if self.rounds_with_draft else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.new_tokens / self.decode_seconds if self.decode_seconds else None

    @property
    def predicted_speedup(self) -> float | None:
        """Theorem 3.8 at the measured alpha, mean gamma and c (the paper's cost model, for chains)."""
        if self.alpha is None or self.c is None or self.tree_rounds:
            return None
        return theory.walltime_improvement(self.alpha, round(self.mean_gamma), self.c)

    def acceptance_by_position(self) -> list[float]:
        return [a / t for a, t in zip(self.position_accepted, self.position_tested)]

    def to_dict(self) -> dict:
        out = asdict(self)
        del out["rounds"]
        for name in ("alpha", "beta", "tau", "c", "mean_gamma", "tokens_per_second", "predicted_speedup"):
            out[name] = getattr(self, name)
        out["acceptance_by_position"] = self.acceptance_by_position()
        return out

    def summary(self) -> str:
        """One line for people."""

        def fmt(x, spec=".2f"):
            return "-" if x is None else format(x, spec)

        parts = [
            f"{self.new_tokens} tokens in {self.decode_seconds:.2f}s ({fmt(self.tokens_per_second, '.1f')} tok/s)",
            f"target calls {self.target_calls}" + (f" on {self.path}" if self.path else ""),
            f"drafter {self.drafter}" + (f" (proposes {self.draft_vocab_share:.1%} of the target's vocabulary)"
                                         if self.draft_vocab_share is not None else ""),
        ]
        if self.drafted:
            parts += [
                f"drafted {self.drafted}" + (f" in {self.tree_rounds} trees" if self.tree_rounds else "")
                + f", accepted {self.accepted}",
                f"alpha {fmt(self.alpha)}" + (f" (beta {fmt(self.beta)})" if self.beta is not None else ""),
                f"tau {fmt(self.tau)}",
                f"c {fmt(self.c, '.3f')}",
            ]
            if self.predicted_speedup is not None:  # Theorem 3.8 covers chains
                parts.append(f"predicted speedup {fmt(self.predicted_speedup)}x")
        return " | ".join(parts)
