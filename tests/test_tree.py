"""Token trees: the law a tree round emits equals the target's, computed exactly (every child
draw, every accept/reject outcome) on small vocabularies, for sampled and deterministic children,
one level and two; each planted bug breaks it; the greedy walk; the tree's mask and depths."""

import itertools
from collections import Counter, defaultdict

import pytest
import torch

import specdec.decoding.rejection
from specdec.decoding.rejection import point_mass, verify_tree, verify_tree_greedy, walk_tree
from specdec.drafters import Drafter
from specdec.modeling.tree import ancestor_mask, chain, check_parents, depths

V = 4


def dist(seed: int, sharp: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(V, generator=g, dtype=torch.float64) * sharp, -1)


def round_law(p: torch.Tensor, q: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor) -> dict:
    """Exact law of (accepted tokens..., target token) of one round, over the walk's uniforms: each
    tried node's uniform is 0 (accepted iff its probability a > 0) with weight a, or 1 (rejected)
    with weight 1 - a; untried nodes split their weight evenly over both."""
    law = defaultdict(float)
    n = tokens.numel()
    for pattern in itertools.product((0.0, 1.0), repeat=n):
        path, residual, tried, _ = walk_tree(p, q, tokens, parents, torch.tensor(pattern))
        weight = 0.5 ** (n - len(tried))
        for node, a in tried:
            weight *= a if pattern[node] == 0.0 else 1.0 - a
        prefix = tuple(int(tokens[i]) for i in path)
        for t in range(V):
            law[prefix + (t,)] += weight * float(residual[t])
    return law


def two_token_law(round_laws, p1, p2) -> torch.Tensor:
    """(V, V) law of the first two emitted tokens, from weighted round laws; a round that emits one
    token is followed by the target's own next-token law (the next round)."""
    out = torch.zeros(V, V, dtype=torch.float64)
    for weight, law in round_laws:
        for seq, mass in law.items():
            if len(seq) >= 2:
                out[seq[0], seq[1]] += weight * mass
            else:
                out[seq[0]] += weight * mass * p2[seq[0]]
    return out


P1 = dist(0)
P2 = torch.stack([dist(10 + x) for x in range(V)])  # p(x2 | x1)
Q1 = dist(1, sharp=0.8)
Q2 = torch.stack([dist(20 + x, sharp=0.8) for x in range(V)])


def one_level_laws(kinds: str):
    """Round laws of a one-level tree whose children are sampled from Q1 ('s') or fixed tokens
    ('d': the likeliest under Q1 first), over every draw of the sampled ones."""
    fixed = iter(Q1.argsort(descending=True).tolist())
    choices = [range(V) if k == "s" else [next(fixed)] for k in kinds]
    parents = torch.full((len(kinds),), -1)
    for draw in itertools.product(*choices):
        weight = 1.0
        q = torch.zeros(len(kinds), V, dtype=torch.float64)
        for i, (kind, token) in enumerate(zip(kinds, draw)):
            if kind == "s":
                weight *= float(Q1[token])
                q[i] = Q1
            else:
                q[i] = point_mass(torch.tensor([token]), V)[0].double()
        p = torch.cat([P1[None], P2[list(draw)]])
        yield weight, round_law(p, q, torch.tensor(draw), parents)


@pytest.mark.parametrize("kinds", ["s", "ss", "sss", "d", "dd", "ddd", "sd", "ds"])
def test_one_level_emits_the_target_law_exactly(kinds):
    law = two_token_law(list(one_level_laws(kinds)), P1, P2)
    expected = P1[:, None] * P2
    assert torch.allclose(law, expected, atol=1e-9), (law - expected).abs().max()


def depth_two_laws(kind_top: str, kind_below: str):
    """Two root children (sampled from Q1, or the top two of Q1), each with one child (sampled from
    Q2[parent], or its top one)."""
    top_choices = [range(V)] * 2 if kind_top == "s" else [[t] for t in Q1.argsort(descending=True)[:2].tolist()]
    parents = torch.tensor([-1, -1, 0, 1])
    for top in itertools.product(*top_choices):
        below_choices = [range(V) if kind_below == "s" else [int(Q2[x].argmax())] for x in top]
        for below in itertools.product(*below_choices):
            tokens = torch.tensor(list(top) + list(below))
            q = torch.zeros(4, V, dtype=torch.float64)
            weight = 1.0
            for i, token in enumerate(tokens.tolist()):
                parent_dist = Q1 if i < 2 else Q2[tokens[int(parents[i])]]
                sampled = (kind_top if i < 2 else kind_below) == "s"
                q[i] = parent_dist if sampled else point_mass(torch.tensor([token]), V)[0].double()
                weight *= float(parent_dist[token]) if sampled else 1.0
            # rows: root, then each node's next-token law (depth-2 nodes: any law; only two tokens are checked)
            p = torch.cat([P1[None], P2[tokens[:2]], torch.stack([dist(99)] * 2)])
            yield weight, round_law(p, q, tokens, parents)


@pytest.mark.parametrize("kind_top,kind_below", [("s", "s"), ("d", "d"), ("s", "d"), ("d", "s")])
def test_a_depth_two_tree_emits_the_target_law_exactly(kind_top, kind_below):
    law = two_token_law(list(depth_two_laws(kind_top, kind_below)), P1, P2)
    assert torch.allclose(law, P1[:, None] * P2, atol=1e-9), (law - P1[:, None] * P2).abs().max()


def trimmed_laws(individually: bool):
    """A depth-2 tree of sampled children (two root draws from Q1, one draw from Q2 under each),
    scored by cumulative q and trimmed to 3 nodes: by Proposal.top (the root family, then the family
    of the likelier root child), or, the negative control, by keeping the likelier grandchild by its
    own score (its value decides whether it stays)."""
    from specdec.drafters import Proposal

    parents = torch.tensor([-1, -1, 0, 1])
    for top in itertools.product(range(V), repeat=2):
        for below in itertools.product(range(V), repeat=2):
            tokens = torch.tensor(list(top) + list(below))
            q = torch.stack([Q1, Q1, Q2[top[0]], Q2[top[1]]])
            weight = float(Q1[top[0]] * Q1[top[1]] * Q2[top[0], below[0]] * Q2[top[1], below[1]])
            scores = torch.tensor([Q1[top[0]], Q1[top[1]], Q1[top[0]] * Q2[top[0], below[0]],
                                   Q1[top[1]] * Q2[top[1], below[1]]])
            if individually:
                keep = [0, 1, 2 if (scores[2], -2) >= (scores[3], -3) else 3]
                trimmed = Proposal(tokens[keep], q[keep], torch.tensor([-1, -1, keep[2] - 2]))
            else:
                trimmed = Proposal(tokens, q, parents, scores).top(3)
            assert trimmed.tokens.numel() == 3 and trimmed.is_tree
            rows = [P1[None]] + [P2[int(t)][None] if i < 2 else dist(99)[None] for i, t in enumerate(trimmed.tokens)]
            yield weight, round_law(torch.cat(rows), trimmed.q, trimmed.tokens, trimmed.parents)


def test_trimming_a_tree_by_families_keeps_the_law():
    """Trimming a scored tree of sampled children to what pays (gamma.py, Proposal.top) keeps the
    target's law exactly; choosing the sampled children one by one by their own score breaks it."""
    expected = P1[:, None] * P2
    law = two_token_law(list(trimmed_laws(individually=False)), P1, P2)
    assert torch.allclose(law, expected, atol=1e-9), (law - expected).abs().max()
    biased = two_token_law(list(trimmed_laws(individually=True)), P1, P2)
    assert (biased - expected).abs().max() > 1e-3


def test_top_keeps_the_likeliest_nodes_with_their_parents():
    from specdec.drafters import Proposal

    tokens, parents = torch.tensor([10, 11, 12, 13, 14]), torch.tensor([-1, -1, 0, 0, 1])
    scores = torch.tensor([0.6, 0.3, 0.35, 0.2, 0.25])
    point = Proposal(tokens, None, parents, scores)
    assert point.top(3).tokens.tolist() == [10, 11, 12] and point.top(3).parents.tolist() == [-1, -1, 0]
    assert point.top(2).tokens.tolist() == [10, 12] and not point.top(2).is_tree  # one path: a chain
    assert point.top(9) is point and point.top(4).scores.tolist() == pytest.approx([0.6, 0.3, 0.35, 0.25])
    sampled = Proposal(tokens, torch.full((5, 16), 1 / 16), parents, scores)
    assert sampled.top(4).tokens.tolist() == [10, 11, 12, 13]  # families whole: node 0's two children
    assert sampled.top(3).tokens.tolist() == [10, 11, 14]  # node 0's family does not fit; node 1's does
    unscored = Proposal(tokens, None, parents)
    assert unscored.top(3).tokens.tolist() == [10, 11, 12]  # no scores: the first nodes, as head


def _no_residual(p, q):
    return p


def _unnormalised_residual(p, q):
    return (p - q).clamp_min(0.0)


@pytest.mark.parametrize("bug", [_no_residual, _unnormalised_residual])
def test_each_planted_bug_breaks_the_law(monkeypatch, bug):
    """The negative control: the same enumeration catches a walk that forgets to update p' after a
    rejected child, or does not renormalise it."""
    monkeypatch.setattr(specdec.decoding.rejection, "residual", bug)
    law = two_token_law(list(one_level_laws("sd")), P1, P2)
    assert (law - P1[:, None] * P2).abs().max() > 1e-3


def test_verify_tree_samples_the_law():
    """verify_tree draws its uniforms and the final token from the generator: by Monte Carlo, the
    first token of a one-level tree of two sampled children follows p (χ², 8000 rounds)."""
    from specdec.conformance.exactness import goodness_of_fit

    g = torch.Generator().manual_seed(0)
    counts = Counter()
    p = torch.cat([P1[None].float(), P2.float()])  # rows for root and for the four possible child tokens
    for _ in range(8000):
        draw = torch.multinomial(Q1.float(), 2, replacement=True, generator=g)
        q = torch.stack([Q1.float(), Q1.float()])
        rows = torch.cat([p[:1], p[1 + draw]])
        verdict = verify_tree(rows, q, draw, torch.tensor([-1, -1]), g)
        first = int(draw[verdict.path[0]]) if verdict.path else verdict.token
        counts[first] += 1
    assert goodness_of_fit("first token", counts, dict(enumerate(P1.tolist()))).p_value > 1e-3


def test_greedy_walk_follows_the_target_choice():
    tokens = torch.tensor([3, 1, 2, 0, 2])
    parents = torch.tensor([-1, -1, 1, 1, 2])
    choice = torch.tensor([1, 9, 0, 2, 0, 3])  # rows: root, nodes 0..4
    verdict = verify_tree_greedy(lambda row: int(choice[row]), tokens, parents)
    assert verdict.path == [1, 3] and verdict.token == 0  # root -> node 1 (token 1) -> node 3 (token 0), a leaf
    assert verify_tree_greedy(lambda row: [2, 0, 0, 0, 0, 0][row], tokens, parents).path == []


def test_mask_depths_and_parents():
    parents = torch.tensor([-1, -1, 0, 0, 2])
    assert depths(parents).tolist() == [1, 1, 2, 2, 3]
    mask = ancestor_mask(parents)
    assert mask[5].tolist() == [True, True, False, True, False, True]  # root, node 0, node 2, itself
    assert mask[2].tolist() == [True, False, True, False, False, False]
    assert ancestor_mask(chain(3)).tolist() == torch.ones(4, 4, dtype=torch.bool).tril().tolist()
    with pytest.raises(ValueError, match="parent before it"):
        check_parents(torch.tensor([0, -1]))


@pytest.mark.parametrize("backend_class,architecture", [("lean", "llama"), ("lean", "gemma3"), ("transformers", "llama")])
def test_tree_pass_equals_each_path_run_as_a_chain(backend_class, architecture):
    """One pass over a tree gives, at every node, the logits of its root path run as a plain
    sequence; keeping a path then continuing equals recomputing (past Gemma's sliding window)."""
    from helpers import tiny_gemma3, tiny_llama
    from specdec.backends import LeanBackend, TransformersBackend

    backend_type = LeanBackend if backend_class == "lean" else TransformersBackend
    model = tiny_llama(40, seed=0) if architecture == "llama" else tiny_gemma3(40, seed=0, sliding_window=8)
    prefix = torch.randint(0, 40, (13,), generator=torch.Generator().manual_seed(1))
    root, tokens = 7, torch.tensor([3, 5, 9, 11, 3, 2])
    parents = torch.tensor([-1, -1, 0, 0, 3, 1])
    backend = backend_type(model)
    assert backend.supports_trees
    backend.prefill(prefix)
    logits = backend.forward_tree(torch.cat([torch.tensor([root]), tokens]), parents)

    def path_to(node: int) -> list[int]:
        path = []
        while node >= 0:
            path.insert(0, node)
            node = int(parents[node])
        return path

    reference = backend_type(model)
    for row in range(tokens.numel() + 1):
        sequence = torch.cat([prefix, torch.tensor([root]), tokens[path_to(row - 1)]])
        reference.reset()
        expected = reference.forward(sequence)[-1]
        torch.testing.assert_close(logits[row], expected, atol=1e-5, rtol=1e-5)

    backend.keep_path(prefix.numel(), path_to(4))  # root -> node 0 -> node 3 -> node 4
    assert backend.held == prefix.tolist() + [root, 3, 11, 3]
    following = torch.tensor([4, 8])
    reference.reset()
    expected = reference.forward(torch.cat([torch.tensor(backend.held), following]))[-2:]
    torch.testing.assert_close(backend.forward(following), expected, atol=1e-5, rtol=1e-5)


# -- the engine with tree drafters ---------------------------------------------------------------


class TableTreeDrafter(Drafter):
    """A test drafter proposing a tree from a draft table LM: two root children drawn i.i.d. from q
    (the top two at temperature 0), a deterministic third (q's likeliest token not yet proposed),
    and under each sampled child one deterministic grandchild (q's likeliest after it)."""

    name = "table-tree"

    def __init__(self, lm):
        self.lm = lm

    def _q(self, sequence, sampling):
        from specdec.decoding.sampling import probs

        logits = self.lm.table[self.lm.index(sequence)][None]
        return probs(logits, sampling if not sampling.greedy else type(sampling)(temperature=1.0))[0]

    def propose(self, context, gamma, sampling, generator):
        from specdec.drafters import Proposal

        sequence = context.tolist()
        q = self._q(sequence, sampling)
        if sampling.greedy:
            first = q.argsort(descending=True)[:2].tolist()
        else:
            first = torch.multinomial(q, 2, replacement=True, generator=generator).tolist()
        third = next(int(t) for t in q.argsort(descending=True) if int(t) not in first)
        tokens, parents, rows = list(first) + [third], [-1, -1, -1], [q, q, point_mass(torch.tensor([third]), q.numel())[0]]
        if gamma >= 2:
            for i, token in enumerate(first):
                below = int(self._q(sequence + [token], sampling).argmax())
                tokens.append(below)
                parents.append(i)
                rows.append(point_mass(torch.tensor([below]), q.numel())[0])
        q_rows = None if sampling.greedy else torch.stack(rows)
        return Proposal(torch.tensor(tokens), q_rows, parents=torch.tensor(parents))


def _tree_conformance(sampling):
    from helpers import TableLM
    from specdec.conformance.check import Settings, run_conformance
    from specdec.decoding.engine import SpeculativeEngine

    backend = TableLM(8, order=2, seed=20, eos=7, eos_bias=-2.5)
    drafter = TableTreeDrafter(TableLM(8, order=1, seed=21, scale=1.2, eos=7, eos_bias=-2.5))
    plain = SpeculativeEngine(backend, None, eos_token_ids={7})
    spec = SpeculativeEngine(backend, drafter, eos_token_ids={7})
    return run_conformance("table", torch.float32, plain, spec, backend, [[0, 1, 2, 3, 4, 5, 6, 1, 2, 3]], sampling, 3,
                           Settings(), seed=1, drafter_name=drafter.name)


@pytest.mark.parametrize("sampling", [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9)], ids=["T1", "T0.7-top-p0.9"])
def test_specdec_verify_passes_a_tree_drafter(sampling):
    from specdec.config import SamplingParams

    report = _tree_conformance(SamplingParams(**sampling))
    assert report.passed, report.to_text()


def test_specdec_verify_fails_a_tree_walk_without_the_residual(monkeypatch):
    """The negative control through the whole engine: rejected children leave p' unchanged."""
    from specdec.config import SamplingParams

    monkeypatch.setattr(specdec.decoding.rejection, "residual", _no_residual)
    report = _tree_conformance(SamplingParams(temperature=1.0))
    assert not report.passed, report.to_text()


def _leaf_bonus_from_the_parent_row(p, q, tokens, parents, generator):
    """verify_tree, but a walk that reaches a leaf draws its token from the leaf's parent's row."""
    from specdec.decoding.rejection import TreeVerdict, sample

    if q is None:
        q = point_mass(tokens, p.shape[-1])
    path, dist, tested, betas = walk_tree(p, q, tokens, parents, torch.rand(tokens.numel(), generator=generator))
    if path and not bool((parents == path[-1]).any()):
        dist = p[1 + path[-2]] if len(path) > 1 else p[0]
    return TreeVerdict(path=path, token=sample(dist, generator), tested=[a for _, a in tested],
                       beta=torch.tensor(betas, dtype=torch.float32))


def test_specdec_verify_tests_a_tree_walk_s_bonus_tokens(monkeypatch):
    """A walk accepted down to a leaf ends with the target's own draw there, a bonus token, which the
    check tests apart; drawn from the wrong row, that test rejects."""
    import specdec.decoding.engine
    from specdec.config import SamplingParams

    monkeypatch.setattr(specdec.decoding.engine, "verify_tree", _leaf_bonus_from_the_parent_row)
    report = _tree_conformance(SamplingParams(temperature=1.0))
    bonus = next(t for c in report.checks for t in c.tests if t.name.startswith("bonus tokens"))
    assert bonus.samples > 100 and bonus.rejected, report.to_text()


@pytest.mark.parametrize("backend_class", ["lean", "transformers"])
@pytest.mark.parametrize("architecture", ["llama", "gemma3"])
def test_tree_drafters_keep_greedy_output(architecture, backend_class):
    """At temperature 0 the output is plain greedy decoding's, token for token, with trees scored
    on the lean backend (past Gemma's sliding window) and on transformers (Gemma-3 there verifies
    each tree's first chain), by prompt lookup over every match and by a table drafter."""
    from helpers import TableLM, tiny_gemma3, tiny_llama
    from specdec.backends import LeanBackend, TransformersBackend
    from specdec.config import SamplingParams, SpecConfig
    from specdec.decoding.engine import SpeculativeEngine
    from specdec.drafters import NGramTable, NGramTreeDrafter, PromptLookupTreeDrafter

    backend_type = LeanBackend if backend_class == "lean" else TransformersBackend
    model = tiny_llama(40, seed=0) if architecture == "llama" else tiny_gemma3(40, seed=0, sliding_window=8)
    prompt = [1, 2, 3, 4, 5, 1, 2, 6, 7, 1, 2, 3, 9, 1, 2]
    greedy, spec = SamplingParams(), SpecConfig(gamma=3, max_new_tokens=40)
    expected = SpeculativeEngine(backend_type(model)).generate(prompt, greedy, SpecConfig(gamma=0, max_new_tokens=40)).run()
    text = prompt + torch.randint(0, 40, (60,), generator=torch.Generator().manual_seed(4)).tolist()
    ngram = NGramTreeDrafter(NGramTable.fit([text], n=2))  # a table with several successors per token
    for drafter in (PromptLookupTreeDrafter(max_ngram=2), TableTreeDrafter(TableLM(40, order=1, seed=3)), ngram):
        backend = backend_type(model)
        run = SpeculativeEngine(backend, drafter).generate(prompt, greedy, spec).run()
        assert run.tokens == expected.tokens, drafter.name
        assert run.stats.drafted > 0 and (run.stats.tree_rounds > 0) == backend.supports_trees, drafter.name
    # gamma = auto trims prompt lookup's scored trees to the measured cost of positions
    auto = SpeculativeEngine(backend_type(model), PromptLookupTreeDrafter(max_ngram=2))
    assert auto.generate(prompt, greedy, SpecConfig(gamma="auto", max_new_tokens=40)).run().tokens == expected.tokens


def test_ngram_tree_drafts_the_tables_top_successors(tmp_path):
    """The worked example of NGramTreeDrafter; the table keeps each context's top successors with
    their shares through save and load, and a version-1 file (one successor, no shares) still loads."""
    import json

    import numpy as np

    from specdec.config import SamplingParams
    from specdec.drafters import NGramTable, NGramTreeDrafter

    table = NGramTable.fit([[5, 6, 5, 6, 5, 7, 6, 5]], n=2)
    assert table.followers([5]) == [(6, pytest.approx(2 / 3)), (7, pytest.approx(1 / 3))]
    proposal = NGramTreeDrafter(table, branch=2, beam=1).propose(torch.tensor([9, 5]), 2, SamplingParams(), None)
    assert proposal.tokens.tolist() == [6, 7, 5] and proposal.parents.tolist() == [-1, -1, 0]
    assert proposal.scores.tolist() == pytest.approx([2 / 3, 1 / 3, 2 / 3]) and proposal.q is None
    table.save(tmp_path / "t.npz")
    again = NGramTable.load(tmp_path / "t.npz")
    assert again.top_k == 4 and again.followers([5]) == [(6, pytest.approx(2 / 3)), (7, pytest.approx(1 / 3))]
    header = {"format": "specdec-ngram", "version": 1, "n": 2, "tokenizer": "", "source": ""}
    np.savez(tmp_path / "v1.npz", context_1=np.array([[5], [6]]), next_1=np.array([6, 5]),
             header=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8))
    old = NGramTable.load(tmp_path / "v1.npz")
    assert old.next_token([5]) == 6 and old.followers([6]) == [(5, 1.0)]


def test_prompt_lookup_tree_merges_every_match():
    from specdec.config import SamplingParams
    from specdec.drafters import PromptLookupTreeDrafter

    drafter = PromptLookupTreeDrafter(max_ngram=2)
    proposal = drafter.propose(torch.tensor([5, 1, 2, 5, 1, 3, 5, 1, 2, 9, 5, 1]), 2, SamplingParams(), None)
    assert proposal.tokens.tolist() == [2, 3, 9, 5, 5] and proposal.parents.tolist() == [-1, -1, 0, 1, 0]
    single = drafter.propose(torch.tensor([4, 6, 7, 8, 4, 6]), 3, SamplingParams(), None)
    assert single.tokens.tolist() == [7, 8, 4] and not single.is_tree  # one match: a chain
    capped = PromptLookupTreeDrafter(max_ngram=2, max_nodes=2)
    assert capped.propose(torch.tensor([5, 1, 2, 5, 1, 3, 5, 1, 2, 9, 5, 1]), 2, SamplingParams(), None).tokens.tolist() == [2, 3]


def test_auto_prompt_lookup_proposes_trees_only_off_the_fast_path():
    from helpers import TableLM
    from specdec.config import SamplingParams
    from specdec.drafters import AutoPromptLookup

    context = torch.tensor([5, 1, 2, 5, 1, 3, 5, 1, 2, 9, 5, 1])
    drafter = AutoPromptLookup()
    drafter.bind(TableLM(16))  # every pass on one path: trees
    assert drafter.name == "prompt-lookup-tree" and drafter.propose(context, 2, SamplingParams(), None).is_tree
    drafter.bind(TableLM(16, fast_rows=16))  # chains on a row-invariant fast path (the kernels)
    proposal = drafter.propose(context, 2, SamplingParams(), None)
    assert drafter.name == "prompt-lookup" and not proposal.is_tree and proposal.tokens.tolist() == [2, 9]


def test_beta_is_the_probability_that_a_depth_accepts():
    """β at the root equals the exact probability (over child draws and uniforms) that the walk
    accepts a child there, for sampled and deterministic children alike."""
    for kinds in ("s", "ss", "sd", "ddd"):
        accept_mass = beta_mass = 0.0
        for weight, law in one_level_laws(kinds):
            accept_mass += weight * sum(mass for seq, mass in law.items() if len(seq) == 2)
        fixed = iter(Q1.argsort(descending=True).tolist())
        choices = [range(V) if k == "s" else [next(fixed)] for k in kinds]
        for draw in itertools.product(*choices):
            weight, q = 1.0, torch.zeros(len(kinds), V, dtype=torch.float64)
            for i, (kind, token) in enumerate(zip(kinds, draw)):
                q[i] = Q1 if kind == "s" else point_mass(torch.tensor([token]), V)[0].double()
                weight *= float(Q1[token]) if kind == "s" else 1.0
            p = torch.cat([P1[None], P2[list(draw)]])
            _, _, _, betas = walk_tree(p, q, torch.tensor(draw), torch.full((len(kinds),), -1), torch.ones(len(kinds)))
            beta_mass += weight * betas[0]
        assert abs(accept_mass - beta_mass) < 1e-9, kinds


def test_suffix_drafter_finds_continuations_in_earlier_sequences():
    from specdec.config import SamplingParams
    from specdec.drafters import SequenceHistory, SuffixDrafter

    history = SequenceHistory(max_tokens=12)
    drafter = SuffixDrafter(history, max_ngram=2)
    drafter.begin(torch.tensor([0]))
    drafter.propose(torch.tensor([3, 7, 8, 9, 4]), 2, SamplingParams(), None)  # a first sequence, as drafted for
    drafter.begin(torch.tensor([0]))  # the next one starts: the first joins the history
    assert history.sequences[-1] == [3, 7, 8, 9, 4]
    proposal = drafter.propose(torch.tensor([1, 2, 7, 8]), 3, SamplingParams(), None)
    assert proposal.tokens.tolist() == [9, 4] and not proposal.is_tree  # within one sequence only
    both = drafter.propose(torch.tensor([7, 8, 5, 1, 7, 8]), 2, SamplingParams(), None)  # its own match and the history's
    assert sorted(both.tokens[both.parents == -1].tolist()) == [5, 9]
    history.add([6] * 10)  # 15 tokens > 12: the oldest sequence is dropped
    assert list(history.sequences) == [[6] * 10] and history.continuations([7, 8], 2, 5) == []


def test_suffix_drafter_keeps_greedy_output_across_requests():
    """Greedy output is plain decoding's for a second request that the first one's history drafts for."""
    from helpers import tiny_llama
    from specdec.backends import LeanBackend
    from specdec.config import SamplingParams, SpecConfig
    from specdec.decoding.engine import SpeculativeEngine
    from specdec.drafters import SuffixDrafter

    model = tiny_llama(40, seed=0)
    backend, drafter = LeanBackend(model), SuffixDrafter()
    spec_engine, plain = SpeculativeEngine(backend, drafter), SpeculativeEngine(backend)
    for prompt in ([1, 2, 3, 4, 5, 6], [9, 1, 2, 3, 4, 5, 6]):
        expected = plain.generate(prompt, SamplingParams(), SpecConfig(gamma=0, max_new_tokens=30)).run().tokens
        run = spec_engine.generate(prompt, SamplingParams(), SpecConfig(gamma=3, max_new_tokens=30)).run()
        assert run.tokens == expected
    assert run.stats.accepted > 0  # the second request copies what the first one generated


def test_tree_drafters_are_built_by_name(tiny_dirs):
    from specdec.drafters import PromptLookupTreeDrafter, SuffixDrafter, build_drafter
    from specdec.errors import SpecdecError
    from specdec.models import load_model

    target = load_model(str(tiny_dirs["target"]), "float32")
    assert isinstance(build_drafter("suffix", target), SuffixDrafter)
    assert type(build_drafter("prompt-lookup-tree", target)) is PromptLookupTreeDrafter
    with pytest.raises(SpecdecError, match="takes no argument"):
        build_drafter("suffix:history.npz", target)
