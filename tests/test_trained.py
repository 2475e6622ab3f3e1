"""Trained drafters (draft-lm, eagle, eagle3, medusa): caches equal recomputation, greedy parity and Monte
Carlo exactness for each kind (drafting over a vocabulary subset), the float, kernel and block paths agree,
and a drafter refuses a target it was not trained for or a damaged file."""


import pytest
import torch

from helpers import tiny_gemma3, tiny_llama
from specdec.backends import LeanBackend, TransformersBackend
from specdec.config import SamplingParams, SpecConfig
from specdec.conformance.exactness import exact_continuation_law, goodness_of_fit, sample_continuations
from specdec.decoding.engine import SpeculativeEngine
from specdec.drafters import LookupElseTrained, ModelDrafter, PromptLookupDrafter, build_drafter
from specdec.drafters.base import Drafter, Proposal
from specdec.drafters.draft_lm import DraftLMBackend
from specdec.drafters.eagle import EagleDrafter, EagleTreeDrafter
from specdec.drafters.medusa import MedusaDrafter
from specdec.drafters.nets import KINDS, DraftConfig, DraftNet
from specdec.drafters.trained import load_trained_drafter
from specdec.errors import SpecdecError
from specdec.models import load_model

PROMPT = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 9, 9, 4, 5, 6, 1, 2]


def random_net(kind: str, target, vocab: torch.Tensor, seed: int = 0, head_dim: int = 8) -> DraftNet:
    kind = kind.removesuffix("-blocks").removesuffix("-tree").removeprefix("lookup-else-")
    layers = 2 if kind.endswith("-2layers") else 1
    kind = kind.removesuffix("-2layers")
    torch.manual_seed(seed)
    d = target.config.hidden_size
    aux = [0, 1] if kind == "eagle3" else []  # the embeddings and layer 1's input
    net = DraftNet(DraftConfig(kind, d, layers=layers, head_dim=head_dim, ffn=2 * d, medusa_heads=3, aux_layers=aux),
                   vocab,
                   target.get_input_embeddings().weight, target.get_output_embeddings().weight[vocab]).eval()
    if kind == "medusa":  # break the identity start, so heads differ from the target's own head
        for head in net.medusa:
            torch.nn.init.normal_(head.weight, std=0.3)
    return net


def needs_quant_kernels():
    from specdec.modeling import quant

    if quant.load() is None:
        pytest.skip(f"quant.cpp cannot run here: {quant.unavailable_reason()}")


def random_drafter(kind: str, target, vocab: torch.Tensor, seed: int = 0):
    """An untrained drafter of `kind` for `target`, drafting only over `vocab` (exactness must not
    depend on training: any q the tokens are drawn from is fine). A "-blocks" kind drafts with its
    matrices as int8 blocks (DraftNet.use_blocks)."""
    net = random_net(kind, target, vocab, seed, head_dim=16 if kind.endswith("-blocks") else 8)
    if kind.endswith("-blocks"):
        needs_quant_kernels()
        net = net.float().use_blocks()
        kind = kind.removesuffix("-blocks")
    kind = kind.removesuffix("-2layers")
    width = target.get_output_embeddings().weight.shape[0]
    if kind == "draft-lm":
        return ModelDrafter(DraftLMBackend(net, width), width)
    if kind.endswith("-tree"):
        return EagleTreeDrafter(net, "test", branch=2, beam=2, max_nodes=7)
    if kind.startswith("lookup-else-"):  # prompt lookup where it matches, the trained drafter elsewhere
        return LookupElseTrained(PromptLookupDrafter(), EagleDrafter(net, "test"))
    return (EagleDrafter if kind in ("eagle", "eagle3") else MedusaDrafter)(net, "test")


class _Fixed(Drafter):
    """Always proposes `tokens` (a point-mass chain); counts its proposals."""

    def __init__(self, tokens):
        self.tokens, self.asked, self.name = tokens, 0, "fixed"

    def propose(self, context, gamma, sampling, generator):
        self.asked += 1
        return Proposal(tokens=torch.tensor(self.tokens))


def test_router_takes_lookup_only_for_match_lengths_accepted_as_often_as_the_trained_drafter():
    """lookup-else-trained keeps, per match length, how many tokens lookup's rounds were accepted for:
    1-token matches rejected every round go to the trained drafter (accepted 1 a round), 3-token
    matches that are accepted stay with lookup; a new sequence starts over."""
    lookup, trained = PromptLookupDrafter(), _Fixed([7, 7])
    router = LookupElseTrained(lookup, trained)
    greedy, g = SamplingParams(), torch.Generator()
    one = torch.tensor([5, 1, 2, 3, 9, 1])  # ends in 1, seen before, no longer n-gram repeats
    three = torch.tensor([5, 1, 2, 3, 9, 1, 2, 3])  # ends in 1 2 3, seen before
    router.begin(one)

    def round_of(context, accepted):
        proposal = router.propose(context, 2, greedy, g)
        router.feedback(context.numel() + accepted)
        return proposal

    for _ in range(2):  # tried first (its prior: 2 tokens a round), rejected twice: below the trained drafter's 1
        assert round_of(one, 0).tokens.tolist() == [2, 3] and lookup.matched == 1
    assert trained.asked == 0
    for _ in range(3):  # the trained drafter's rounds are accepted for 1 token; lookup's 1-token ones for 0
        assert round_of(one, 1).tokens.tolist() == [7, 7]
    assert trained.asked == 3
    assert round_of(three, 2).tokens.tolist() == [9, 1] and lookup.matched == 3
    router.begin(one)
    assert round_of(one, 0).tokens.tolist() == [2, 3]


@pytest.mark.parametrize("kind", ["draft-lm", "eagle", "eagle-2layers"])
def test_cached_drafting_equals_recomputation(kind):
    """Writing the cache in pieces, with a rollback in between, gives the full pass's outputs."""
    net = random_net(kind, tiny_llama(40, seed=0), torch.arange(0, 40, 2))
    assert len(net.blocks) == (2 if kind.endswith("2layers") else 1)
    x, f = torch.randint(0, 40, (1, 12)), torch.randn(1, 12, 32)
    run = (lambda lo, hi, c, s: net.lm(x[:, lo:hi], c, s)) if kind == "draft-lm" else \
          (lambda lo, hi, c, s: net.eagle(f[:, lo:hi], x[:, lo:hi], c, s))
    with torch.no_grad():
        full = run(0, 12, None, 0)
        cache = net.new_cache()
        a, b = run(0, 5, cache, 0), run(5, 9, cache, 5)
        cache.length = 7  # reject the last two
        c = run(7, 12, cache, 7)
    torch.testing.assert_close(torch.cat([a, b[:, :2], c], dim=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", [LeanBackend, TransformersBackend])
@pytest.mark.parametrize("kind", KINDS + ("eagle-tree", "eagle3-tree", "lookup-else-eagle3", "eagle-blocks",
                                          "eagle3-tree-blocks", "eagle-2layers-blocks"))
@pytest.mark.parametrize("architecture", ["llama", "gemma3"])
def test_greedy_parity_each_kind(kind, backend, architecture):
    target = tiny_llama(40, seed=0) if architecture == "llama" else tiny_gemma3(40, seed=0, sliding_window=8)
    expected = SpeculativeEngine(backend(target)).generate(
        PROMPT, SamplingParams(), SpecConfig(gamma=0, max_new_tokens=40)).run().tokens
    engine = SpeculativeEngine(backend(target), random_drafter(kind, target, torch.arange(0, 40, 2)))
    for gamma in (1, 3, "auto"):
        run = engine.generate(PROMPT, SamplingParams(temperature=0), SpecConfig(gamma=gamma, max_new_tokens=40)).run()
        assert run.tokens == expected, (kind, gamma)
        assert run.stats.drafted > 0


MC_VOCAB, MC_PROMPT = 5, [0, 1, 2, 3, 4, 1]


@pytest.mark.parametrize("kind,sampling", [
    ("draft-lm", SamplingParams(temperature=1.0)),
    ("eagle", SamplingParams(temperature=1.0)),
    ("medusa", SamplingParams(temperature=1.0)),
    ("eagle", SamplingParams(temperature=0.8, top_k=3, top_p=0.9)),
    ("eagle-tree", SamplingParams(temperature=1.0)),
    ("eagle-tree", SamplingParams(temperature=0.8, top_k=3, top_p=0.9)),
    ("eagle3", SamplingParams(temperature=1.0)),
    ("eagle3-tree", SamplingParams(temperature=0.8, top_k=3, top_p=0.9)),
    ("lookup-else-eagle3", SamplingParams(temperature=1.0)),
    ("lookup-else-eagle3", SamplingParams(temperature=0.8, top_k=3, top_p=0.9)),
    ("eagle-blocks", SamplingParams(temperature=1.0)),
    ("eagle3-tree-blocks", SamplingParams(temperature=0.8, top_k=3, top_p=0.9)),
])
def test_monte_carlo_law_each_kind(kind, sampling):
    """3-token continuations follow the target's exact law, though the draft never proposes id 2."""
    target = tiny_llama(MC_VOCAB, layers=2, seed=10, init=0.15)
    drafter = random_drafter(kind, target, torch.tensor([0, 1, 3, 4]), seed=3)
    law = exact_continuation_law(target, MC_PROMPT, 3, sampling)
    engine = SpeculativeEngine(TransformersBackend(target), drafter)
    counts = sample_continuations(engine, MC_PROMPT, 3, sampling, gamma=2, n=2000, seed=1000)
    test = goodness_of_fit("3-token law", counts, law)
    assert test.p_value > 1e-4, test


def test_drafter_for_another_target_is_refused(trained, tiny_dirs):
    _, _, out = trained
    other = load_model(str(tiny_dirs["long"]), "float32")  # same tokenizer, other weights
    with pytest.raises(SpecdecError, match="trained for target"):
        load_trained_drafter(out["eagle"][1], other)
    alien = load_model(str(tiny_dirs["alien"]), "float32")
    with pytest.raises(SpecdecError, match="tokenizer differ"):
        build_drafter(str(out["medusa"][1]), alien)


def test_packed_bf16_drafting_matches_unpacked():
    from specdec.modeling.packing import can_pack

    if not can_pack():
        pytest.skip("this torch build has no oneDNN packed linear")
    target = tiny_llama(40, seed=0)
    x, f = torch.randint(0, 40, (1, 6)), torch.randn(1, 6, 32, dtype=torch.bfloat16)
    aux = torch.randn(1, 6, 64, dtype=torch.bfloat16)
    for kind in KINDS:
        net = random_net(kind, target, torch.arange(0, 40, 2)).to(torch.bfloat16)
        with torch.no_grad():
            run = {"draft-lm": lambda net=net: net.lm(x), "eagle": lambda net=net: net.logits(net.eagle(f, x)),
                   "eagle3": lambda net=net: net.draft_logits(net.predict(net.features_in(aux), x)),
                   "medusa": lambda net=net: net.logits(net.medusa_features(f))}[kind]
            before = run()
            net.pack()
            torch.testing.assert_close(run(), before, atol=0, rtol=0)


def test_a_draw_over_the_draft_vocabulary_picks_what_a_draw_over_q_would():
    """VocabMap.draw samples over the |S| draft probabilities, not q's full width: with the vocabulary
    ascending, the same generator state gives the same token (and q is unchanged), and several
    draws at once (what the tree drafter's branches take) the same tokens. The negative control,
    the vocabulary out of order, changes tokens."""
    from specdec.decoding.sampling import probs, sample, samples
    from specdec.drafters.vocab_map import VocabMap

    width, sampling = 500, SamplingParams(temperature=0.8, top_p=0.95)
    vocab = torch.randperm(width, generator=torch.Generator().manual_seed(1))[:120].sort().values
    shuffled = vocab[torch.randperm(vocab.numel(), generator=torch.Generator().manual_seed(2))]
    ordered, out_of_order = VocabMap(vocab, width), VocabMap(shuffled, width)
    logits = torch.randn(1, vocab.numel(), generator=torch.Generator().manual_seed(3)) * 2
    moved = 0
    for seed in range(300):
        token, _, q = ordered.draw(logits, sampling, torch.Generator().manual_seed(seed), position=0)
        full = ordered.full(probs(logits, sampling), 0.0)[0]
        assert torch.equal(q, full)
        assert token == sample(full, torch.Generator().manual_seed(seed))
        compact = probs(logits, sampling)[0]
        assert [int(vocab[i]) for i in samples(compact, torch.Generator().manual_seed(seed), 2)] == \
            samples(full, torch.Generator().manual_seed(seed), 2)
        other, _, _ = out_of_order.draw(logits, sampling, torch.Generator().manual_seed(seed), position=0)
        moved += other != sample(out_of_order.full(probs(logits, sampling), 0.0)[0], torch.Generator().manual_seed(seed))
    assert moved > 100


def test_auto_and_trained_kinds_without_a_shipped_drafter(tiny_dirs):
    from specdec.drafters import PromptLookupDrafter

    target = load_model(str(tiny_dirs["chat"]), "float32")
    assert isinstance(build_drafter("auto", target), PromptLookupDrafter)
    with pytest.raises(SpecdecError, match="no trained drafter ships"):
        build_drafter("trained", target)


def test_auto_drafts_with_the_trained_drafter_at_t0_only_for_the_targets_listed(trained, monkeypatch):
    """`auto` for a target with a shipped drafter: at T > 0 the drafter; at T = 0 prompt lookup alone,
    or prompt lookup else the drafter (one net for both) for the targets TRAINED_ALSO_AT_T0 names —
    which must each ship a drafter. Greedy output stays plain decoding's either way."""
    from specdec import drafters
    from specdec.drafters.prompt_lookup import AutoPromptLookup
    from specdec.models import BUILTIN_MODELS

    assert drafters.TRAINED_ALSO_AT_T0 <= set(BUILTIN_MODELS)
    assert all(drafters.shipped_drafter(name) for name in drafters.TRAINED_ALSO_AT_T0)
    target, _, out = trained
    monkeypatch.setattr(drafters, "shipped_drafter", lambda name: out["eagle"][1])
    greedy, sampled = SamplingParams(), SamplingParams(temperature=1.0)
    monkeypatch.setattr(drafters, "TRAINED_ALSO_AT_T0", frozenset())
    auto = build_drafter("auto", target)
    assert isinstance(auto.for_sampling(greedy), AutoPromptLookup) and auto.for_sampling(sampled).name.startswith("eagle")
    monkeypatch.setattr(drafters, "TRAINED_ALSO_AT_T0", frozenset({target.name}))
    auto = build_drafter("auto", target)
    routed = auto.for_sampling(greedy)
    assert isinstance(routed, LookupElseTrained) and routed.trained is auto.for_sampling(sampled)
    backend = LeanBackend(target.model)
    ids = target.encode("hello there, how are you")
    expected = SpeculativeEngine(backend, None).generate(ids, greedy, SpecConfig(gamma=0, max_new_tokens=12)).run()
    run = SpeculativeEngine(backend, auto).generate(ids, greedy, SpecConfig(gamma=3, max_new_tokens=12)).run()
    assert run.tokens == expected.tokens and run.stats.drafted > 0


def test_kernel_drafting_matches_aten_drafting():
    """In bf16 the nets draft on the lean backend's kernels.cpp: same logits as the ATen path within
    bf16 rounding, through a KV cache written in steps of several positions and of one."""
    from specdec.modeling import kernels

    kern = kernels.load()
    if kern is None:
        pytest.skip(f"kernels.cpp unavailable here: {kernels.unavailable_reason()}")
    target = tiny_llama(40, seed=0)
    x, f = torch.randint(0, 40, (1, 7)), torch.randn(1, 7, 32, dtype=torch.bfloat16)
    aux = torch.randn(1, 7, 64, dtype=torch.bfloat16)
    for kind in KINDS:
        net = random_net(kind, target, torch.arange(0, 40, 2)).to(torch.bfloat16)
        fast = random_net(kind, target, torch.arange(0, 40, 2)).to(torch.bfloat16)
        fast.load_state_dict(net.state_dict())
        fast.use_kernels(kern)
        caches = {id(net): net.new_cache(), id(fast): fast.new_cache()}

        def run(model, lo, hi, kind=kind, caches=caches):
            cache = caches[id(model)]
            if kind == "draft-lm":
                return model.lm(x[:, lo:hi], cache, lo)
            if kind == "eagle":
                return model.logits(model.eagle(f[:, lo:hi], x[:, lo:hi], cache, lo))
            if kind == "eagle3":
                return model.draft_logits(model.predict(model.features_in(aux[:, lo:hi]), x[:, lo:hi], cache, lo))
            return model.logits(model.medusa_features(f[0, lo:hi]))

        with torch.inference_mode():
            for lo, hi in ((0, 4), (4, 5), (5, 7)):
                a, b = run(fast, lo, hi).float(), run(net, lo, hi).float()
                assert (a - b).abs().max() <= 0.05 * max(1.0, b.abs().max()), (kind, lo, (a - b).abs().max())


@pytest.mark.parametrize("head_dim", [8, 16])  # 16: each layer in one quant.cpp call (layer_step)
def test_block_drafting_follows_float_drafting(head_dim):
    """With its matrices as Q8_0 blocks and int8 activations an eagle/eagle3 net drafts what its float
    weights draft, within int8 rounding, through a KV cache written in steps of several positions and of
    one, and through a token tree; the q it reports is what it drew from (a softmax of its own logits)."""
    needs_quant_kernels()
    from specdec.modeling.tree import TreeLayout

    target = tiny_llama(40, seed=0)
    x, f = torch.randint(0, 40, (1, 7)), torch.randn(1, 7, 32)
    aux = torch.randn(1, 7, 64)
    for kind in ("eagle", "eagle3"):
        net = random_net(kind, target, torch.arange(0, 40, 2), head_dim=head_dim)
        fast = random_net(kind, target, torch.arange(0, 40, 2), head_dim=head_dim)
        fast.load_state_dict(net.state_dict())
        fast.use_blocks()
        assert fast.decoder().layer_step is not None or head_dim != 16
        inputs = f if kind == "eagle" else aux
        caches = {id(net): net.new_cache(), id(fast): fast.new_cache()}

        def run(model, lo, hi, tree=None, start=None, caches=caches, inputs=inputs):
            state = model.predict(model.features_in(inputs[:, lo:hi]), x[:, lo:hi], caches[id(model)],
                                  lo if start is None else start, tree)
            return model.draft_logits(state)

        with torch.inference_mode():
            for lo, hi in ((0, 4), (4, 5), (5, 7)):
                a, b = run(fast, lo, hi), run(net, lo, hi)
                assert (a - b).abs().max() <= 0.05 * max(1.0, b.abs().max()), (kind, lo, (a - b).abs().max())
            tree = TreeLayout.of(torch.tensor([-1, -1]))  # rows 4..6: a root row at 5 and two children at 6
            for model in (net, fast):
                caches[id(model)].length = 5
            a, b = run(fast, 4, 7, tree, start=5), run(net, 4, 7, tree, start=5)
            assert (a - b).abs().max() <= 0.05 * max(1.0, b.abs().max()), (kind, "tree", (a - b).abs().max())
    with pytest.raises(ValueError, match="float32"):
        random_net("eagle", target, torch.arange(0, 40, 2)).to(torch.bfloat16).use_blocks()


@pytest.mark.parametrize("damage,needle", [("repeat", "more than once"), ("range", "outside the target"),
                                           ("missing", "no draft vocabulary")])
def test_damaged_draft_vocabulary_is_refused(trained, tmp_path, damage, needle):
    """A repeated id would make the reported q differ from the drawn one; an id past the target's
    vocabulary would index past its head. Both are refused when the file is read."""
    import shutil

    from safetensors.torch import load_file, save_file

    target, _, out = trained
    directory = tmp_path / damage
    shutil.copytree(out["eagle"][1], directory)
    state = load_file(str(directory / "model.safetensors"))
    if damage == "repeat":
        state["vocab"][1] = state["vocab"][0]
    elif damage == "range":
        state["vocab"][-1] = 10_000
    else:
        del state["vocab"]
    save_file(state, str(directory / "model.safetensors"))
    with pytest.raises(SpecdecError, match=needle):
        load_trained_drafter(directory, target)


@pytest.mark.parametrize("kind", KINDS + ("eagle-tree", "eagle3-tree", "lookup-else-eagle3"))
def test_specdec_verify_passes_each_kind(kind):
    """The conformance check (quick settings) on the lean backend at T = 0.7, top-p 0.9, at a fixed
    gamma = 3 (every medusa head): gamma = auto sizes rounds from measured times, so its draws, and
    the check's verdict, would change from run to run and host to host (a CI run on another host
    drew a bonus-token PIT at p = 8e-5, inside the check's 10^-3 false-alarm rate; 11 independent
    stronger runs here, at 3 and auto, passed). Fixed, the verdict is reproducible; gamma = auto's
    exactness is tested token for token in test_coupled.py."""
    from specdec.conformance.check import Settings, run_conformance

    target = tiny_llama(MC_VOCAB, layers=2, seed=10, init=0.15)
    backend = LeanBackend(target)
    plain = SpeculativeEngine(backend, None)
    spec = SpeculativeEngine(backend, random_drafter(kind, target, torch.tensor([0, 1, 3, 4]), seed=3))
    report = run_conformance("tiny", torch.float32, plain, spec, backend, [MC_PROMPT],
                             SamplingParams(temperature=0.7, top_p=0.9), 3, Settings.quick(), seed=2)
    assert report.passed, report.to_text()


def test_lookup_else_trained_asks_lookup_first_and_the_trained_drafter_where_it_finds_nothing():
    target = tiny_llama(40, seed=0)
    drafter = random_drafter("lookup-else-eagle3", target, torch.arange(0, 40, 2))
    asked = {"lookup": 0, "trained": 0}
    for name, part in (("lookup", drafter.lookup), ("trained", drafter.trained)):
        propose = part.propose

        def counted(*args, name=name, propose=propose):
            out = propose(*args)
            asked[name] += bool(out.tokens.numel())
            return out
        part.propose = counted
    assert drafter.reads_features and drafter.feature_layers == drafter.trained.feature_layers
    run = SpeculativeEngine(LeanBackend(target), drafter).generate(
        PROMPT, SamplingParams(), SpecConfig(gamma=3, max_new_tokens=30)).run()
    assert asked["lookup"] > 0 and asked["trained"] > 0, asked
    assert run.stats.drafted > 0


def test_only_generations_whose_drafter_reads_features_record_them():
    """eagle and a plain engine share one backend (as in `specdec bench`): the plain baseline and
    gamma = 0 generations must not pay for recording features."""
    target = tiny_llama(40, seed=0)
    backend = LeanBackend(target)
    eagle = SpeculativeEngine(backend, random_drafter("eagle", target, torch.arange(0, 40, 2)))
    plain = SpeculativeEngine(backend)
    recorded = []
    store = backend._store_hidden
    backend._store_hidden = lambda start, features: (recorded.append(backend.record_hidden), store(start, features))
    for engine, gamma, expected in ((eagle, 2, True), (plain, 0, False), (eagle, 0, False), (eagle, "auto", True)):
        recorded.clear()
        run = engine.generate(PROMPT, SamplingParams(), SpecConfig(gamma=gamma, max_new_tokens=8)).run()
        assert backend.record_hidden is expected and set(recorded) == {expected}, (engine.drafter, gamma)
        assert len(run.tokens) == 8


def test_eagle_tree_proposes_trees_and_they_are_accepted():
    """Trees really come out (several children, more than one level) and verification walks them."""
    target = tiny_llama(40, seed=0)
    drafter = random_drafter("eagle-tree", target, torch.arange(0, 40, 2))
    engine = SpeculativeEngine(LeanBackend(target), drafter)
    run = engine.generate(PROMPT, SamplingParams(temperature=0), SpecConfig(gamma=3, max_new_tokens=30)).run()
    assert run.stats.tree_rounds > 0 and run.stats.drafted > 3 * run.stats.rounds_with_draft  # wider than a chain
    engine.target.reset()
    engine.target.record_hidden = True
    engine.target.prefill(torch.tensor(PROMPT[:-1]))
    engine.target.forward(torch.tensor(PROMPT[-1:]))
    drafter.begin(torch.tensor(PROMPT))
    proposal = drafter.propose(torch.tensor(PROMPT + [5]), 3, SamplingParams(temperature=0), None)
    parents = proposal.parents.tolist()
    assert proposal.tokens.numel() == 7 and parents.count(-1) == 2 and max(parents) >= 0
    for i, parent in enumerate(parents):  # parents first, siblings distinct
        assert parent < i
        siblings = [proposal.tokens[j] for j, other in enumerate(parents) if other == parent]
        assert len(set(int(t) for t in siblings)) == len(siblings)


def test_trained_tree_kind_loads_eagle_and_refuses_the_others(trained):
    target, _, out = trained
    assert isinstance(load_trained_drafter(out["eagle"][1], target, tree=True), EagleTreeDrafter)
    assert isinstance(load_trained_drafter(out["eagle3"][1], target, tree=True), EagleTreeDrafter)
    assert isinstance(build_drafter(f"trained-tree:{out['eagle'][1]}", target), EagleTreeDrafter)
    with pytest.raises(SpecdecError, match="needs an eagle"):
        build_drafter(f"trained-tree:{out['medusa'][1]}", target)


def test_each_builtin_target_ships_a_small_drafter_made_for_it():
    """Every built-in target has a trained drafter in the package (issue 15: both, each <= 16 MB), whose
    config names that target, records its recipe and training curve, and whose draft vocabulary is
    distinct ids of the target's vocabulary. (test_builtin loads smollm2's against its model; loading
    Gemma-3 here would cost a minute, so its drafter's parity and law are `specdec verify`'s.)"""
    from safetensors import safe_open

    from specdec.config import BUILTIN_TARGETS
    from specdec.drafters import shipped_drafter
    from specdec.drafters.checkpoint import WEIGHTS_FILE, check_vocab, read_config

    for name in BUILTIN_TARGETS:
        path = shipped_drafter(name)
        assert path is not None, f"no drafter ships for {name}"
        config = read_config(path)
        assert config.target["name"] == name
        assert sum(f.stat().st_size for f in path.iterdir()) <= 16_000_000, name
        assert config.recipe["history"] and config.recipe["held_out"], name
        with safe_open(str(path / WEIGHTS_FILE), "pt") as weights:
            check_vocab(weights.get_tensor("vocab"), config.target["vocab_width"], path)  # raises unless valid
