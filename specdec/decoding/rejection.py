"""Rejection sampling: the paper's algorithm, stated once. p = target, q = draft.

Leviathan, Kalman, Matias 2023 (Algorithm 1) and Chen et al. 2023. Given k draft tokens x_1..x_k,
the distributions q_1..q_k they were drawn from, and the target's p_1..p_{k+1} from ONE batched
target pass, walk the drafts in order:

- accept x_i with probability min(1, p_i(x_i) / q_i(x_i))  (q_i(x_i) = 0 rejects);
- at the first rejection, emit a token drawn from norm(max(0, p_i - q_i)), the *recovered* token;
- if all k are accepted, emit a *bonus* token drawn from p_{k+1}.

The emitted token then follows p exactly: mass q(x)·min(1, p(x)/q(x)) = min(p(x), q(x)) arrives
through acceptance, and (1 - Σ min(p, q))·norm(max(0, p - q))(x) = max(0, p(x) - q(x)) through the
residual; the two add up to p(x).

A drafter that gives no distribution (n-gram table, prompt lookup) proposes a point mass: q is
one-hot at x, so x is accepted with probability p(x) and the residual is p with x removed.

A drafter that draws from a smaller vocabulary S (a trained drafter's head; a draft model with another
tokenizer, restricted to the tokens both vocabularies spell alike: vocab_map.py) reports q over the
target's ids with q = 0 outside S, renormalised over S so that q is the law its draft was drawn from.
The argument above holds for any q: a target token y outside S is never a draft, and arrives through
the residual alone, with mass max(0, p(y) - 0) = p(y). What must be true is only that q is what the
draft was really drawn from (the renormalisation); an unrenormalised q over S breaks it
(tests/test_cross_tokenizer.py).

Temperature 0 has its own exact path, `verify_greedy`: accept while the draft equals the target's
argmax, then emit the target's argmax.

Worked example: p_1 = [0.5, 0.3, 0.2], q_1 = [0.2, 0.7, 0.1], draft x_1 = 1. Acceptance is
min(1, 0.3/0.7) = 3/7. On rejection the residual is max(0, p - q) = [0.3, 0, 0.1] -> [0.75, 0, 0.25].
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .sampling import sample


@dataclass
class Verdict:
    """What one round of verification decided."""

    accepted: int
    """n: the number of draft tokens accepted (0..k)."""
    token: int
    """The one token the target contributes: recovered (at the first rejection) or bonus (all accepted)."""
    beta: torch.Tensor | None = None
    """(n_tested,) Σ_x min(p(x), q(x)) at each position that was tested (the accepted ones and the
    first rejected one); the paper's β, whose mean is α. None on the greedy path."""


def point_mass(draft: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(k,) draft tokens -> (k, V) one-hot q: the distribution of a deterministic drafter."""
    q = torch.zeros(draft.shape[0], vocab_size)
    q[torch.arange(draft.shape[0]), draft] = 1.0
    return q


def acceptance_probability(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)) per position; 0 where q(x) = 0 (a token q could not have drawn is rejected).

    p, q: (k, V); draft: (k,). Returns (k,)."""
    rows = torch.arange(draft.shape[0])
    p_x, q_x = p[rows, draft], q[rows, draft]  # (k,), (k,)
    ratio = p_x / q_x.clamp_min(torch.finfo(q.dtype).tiny)
    return torch.where(q_x > 0, ratio.clamp(max=1.0), torch.zeros_like(ratio))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)) for (V,) rows; p itself if the residual has no mass (only when p = q up to
    rounding, where a rejection cannot happen in exact arithmetic)."""
    excess = (p - q).clamp_min(0.0)
    total = excess.sum()
    return excess / total if total > 0 else p


def accept_prefix(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor,
                  uniforms: torch.Tensor) -> tuple[int, torch.Tensor]:
    """The deterministic core of `verify`: given one uniform per draft position, how many drafts
    are accepted (x_i is accepted while u_i < min(1, p_i(x_i)/q_i(x_i))) and the distribution the
    target's own token is then drawn from (the residual at the first rejection, p_{k+1} after
    all k). p: (k+1, V); q: (k, V); draft, uniforms: (k,)."""
    k = draft.shape[0]
    accept = uniforms < acceptance_probability(p[:k], q, draft)  # (k,)
    rejected = (~accept).nonzero()
    n = int(rejected[0]) if rejected.numel() else k
    return n, (p[k] if n == k else residual(p[n], q[n]))


def verify(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor, generator: torch.Generator) -> Verdict:
    """Accept a prefix of the draft and emit one token, exactly from p.

    p: (k+1, V) target probabilities; q: (k, V) draft probabilities, or None for a point-mass
    drafter; draft: (k,) token ids. Uses k uniforms and one categorical draw from `generator`."""
    k = draft.shape[0]
    if k == 0:  # nothing to test (plain decoding's rounds): the same draw, without the empty tensor ops
        return Verdict(accepted=0, token=sample(p[0], generator), beta=p.new_zeros(0))
    if q is None:
        q = point_mass(draft, p.shape[-1])
    n, dist = accept_prefix(p, q, draft, torch.rand(k, generator=generator))
    tested = min(n + 1, k)
    beta = torch.minimum(p[:tested], q[:tested]).sum(dim=-1)  # (tested,)
    return Verdict(accepted=n, token=sample(dist, generator), beta=beta)


def verify_greedy(target_argmax: torch.Tensor, draft: torch.Tensor) -> Verdict:
    """Temperature 0: accept while draft[i] equals the target's argmax at i, then emit the target's
    argmax at the first mismatch (or the bonus position). target_argmax: (k+1,); draft: (k,)."""
    target, drafts = target_argmax.tolist(), draft.tolist()  # a few ids: lists beat tensor ops here
    n = next((i for i, (t, d) in enumerate(zip(target, drafts)) if t != d), len(drafts))
    return Verdict(accepted=n, token=target[n])


# -- token trees ---------------------------------------------------------------------------------
#
# A tree proposal: tokens (n,), parents (n,) (-1 = the root, the context's last token; a parent
# comes before its children), and q (n, V): the distribution node i was drawn from, one-hot for a
# deterministic node (a top-k expansion, a prompt-lookup continuation). The target scores root and
# nodes in one pass: p (n + 1, V), row 0 the root, row 1 + i node i (specdec.modeling.tree).
#
# Sampled verification (SpecInfer's multi-step speculative sampling, Miao et al. 2024): start at
# the root with p' = p[root]; try the node's children in order: child c (token x, drawn from q_c
# independently of the other children) is accepted with probability min(1, p'(x)/q_c(x)); if it
# is rejected, p' <- norm(max(0, p' - q_c)) and the next child is tried. An accepted child becomes
# the node (p' = p[child]) and its children are tried in turn; when a node's children are all
# rejected, or it has none, the target's token is drawn from p'.
#
# Why the token emitted at a node follows p: the first child is the chain's rule, so the emitted
# token is x with probability min(p', q_1)(x) through acceptance and, on rejection (probability
# 1 - Σ min(p', q_1)), follows norm(max(0, p' - q_1)); a rejected first child leaves exactly the
# law "residual" to be produced, and the second child, drawn independently of the first, is the
# chain's rule against that residual; by induction over the children the token follows p' = p. A
# point mass q = δ_x accepts with probability p'(x) and the residual is p' without x,
# renormalised. Children of one node may repeat a token: once x is rejected the residual has
# p'(x) < q(x) there, so max(0, p' - q)(x) = 0 and a repeat is rejected surely, which wastes it but
# keeps the law. Depth by depth (p[child] is the target's law after the accepted path), the whole
# emitted sequence follows the target.


def children_of(parents: torch.Tensor) -> dict[int, list[int]]:
    """Node index (-1 = the root) -> its children's indices, in order."""
    out: dict[int, list[int]] = {}
    for i, parent in enumerate(parents.tolist()):
        out.setdefault(parent, []).append(i)
    return out


@dataclass
class TreeVerdict:
    """What one tree round decided."""

    path: list[int]
    """Indices of the accepted nodes, root to leaf (their tokens are emitted in this order)."""
    token: int
    """The target's own token after the path (recovered or bonus)."""
    tested: list[float] | None = None
    """The acceptance probability of every child tried, in order (None on the greedy path)."""
    beta: torch.Tensor | None = None
    """The chain's β, per depth: at each node whose children were tried, the probability that one
    of them is accepted, 1 - Π_k (1 - a_k) over all its children (a_k with p' after the rejection
    of children 1..k-1). The accepted count at a depth is Bernoulli(β) given the walk, as in a chain.
    None on the greedy path."""

    @property
    def accepted(self) -> int:
        return len(self.path)


def _child_acceptance(dist: torch.Tensor, q: torch.Tensor, token: torch.Tensor) -> float:
    return float(acceptance_probability(dist[None], q[None], token[None])[0])


def try_children(dist: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor,
                 kids: list[int]) -> list[tuple[float, torch.Tensor]]:
    """For a node's children in order, starting from p' = dist: each one's acceptance probability
    and p' after its rejection (what the next child is tried against)."""
    out = []
    for child in kids:
        a = _child_acceptance(dist, q[child], tokens[child])
        dist = residual(dist, q[child])
        out.append((a, dist))
    return out


def walk_tree(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
              uniforms: torch.Tensor) -> tuple[list[int], torch.Tensor, list[tuple[int, float]], list[float]]:
    """The deterministic core of `verify_tree`: one uniform per node (read only if the node is
    tried; node c is accepted when uniforms[c] < its acceptance probability). Returns the accepted
    path, the distribution the target's token is drawn from, (node, acceptance probability) of
    every child tried, in order, and β of every node whose children were tried."""
    children = children_of(parents)
    node, dist, path, tested, betas = -1, p[0], [], [], []
    while True:
        accepted = None
        kids = children.get(node, [])
        tries = try_children(dist, q, tokens, kids)
        if kids:  # the probability that one child is accepted: 1 - Π (1 - a_k)
            betas.append(1.0 - math.prod(1.0 - a for a, _ in tries))
        for child, (a, after) in zip(kids, tries):
            tested.append((child, a))
            if float(uniforms[child]) < a:
                accepted = child
                break
            dist = after
        if accepted is None:
            return path, dist, tested, betas
        path.append(accepted)
        node, dist = accepted, p[1 + accepted]


def verify_tree(p: torch.Tensor, q: torch.Tensor | None, tokens: torch.Tensor, parents: torch.Tensor,
                generator: torch.Generator) -> TreeVerdict:
    """Accept a root path of the tree and emit one token, exactly from p (see above). p: (n + 1, V);
    q: (n, V), or None when every node is deterministic; tokens, parents: (n,)."""
    if q is None:
        q = point_mass(tokens, p.shape[-1])
    path, dist, tested, betas = walk_tree(p, q, tokens, parents, torch.rand(tokens.numel(), generator=generator))
    return TreeVerdict(path=path, token=sample(dist, generator), tested=[a for _, a in tested],
                       beta=torch.tensor(betas, dtype=torch.float32))


def verify_tree_greedy(target_choice: Callable[[int], int], tokens: torch.Tensor, parents: torch.Tensor) -> TreeVerdict:
    """Follow the root path whose every node is the target's choice at its parent (the argmax at
    temperature 0, or the drafter-invariant draw), then emit the target's choice there.
    target_choice(row): the target's token at a row (0 the root, 1 + i node i); asked only for the
    rows the walk visits, so a costly choice (a drafter-invariant draw) is made only there."""
    children = children_of(parents)
    node, path = -1, []
    while True:
        choice = target_choice(1 + node)
        match = next((c for c in children.get(node, ()) if int(tokens[c]) == choice), None)
        if match is None:
            return TreeVerdict(path=path, token=choice)
        path.append(match)
        node = match
