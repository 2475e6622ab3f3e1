"""Continuous batching (specdec.decoding.batching): a generation in a batch emits exactly what it emits
alone, whoever shares its steps, whenever it joins, however its prompt is chunked."""

import pytest
import torch

from helpers import tiny_gemma3, tiny_llama, tiny_llama_family
from specdec.backends import LeanBackend, Step, TransformersBackend
from specdec.config import SamplingParams, SpecConfig
from specdec.decoding.batching import Batch, SpeculationChoice
from specdec.decoding.engine import SpeculativeEngine
from specdec.drafters import ModelDrafter, PromptLookupDrafter
from specdec.drafters.prompt_lookup import PromptLookupTreeDrafter
from specdec.errors import SpecdecError
from specdec.modeling import Segment
from specdec.modeling.tree import TreeLayout

VOCAB = 40
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 9, 9, 4, 5, 6, 1, 2], [5, 6, 7, 8] * 5, [3, 3, 1, 2, 9, 9, 9, 1, 2],
           list(range(1, 30)), [7, 7, 7, 2]]
ARCHITECTURES = {"llama": lambda seed: tiny_llama(VOCAB, seed=seed),
                 "gemma3": lambda seed: tiny_gemma3(VOCAB, seed=seed, sliding_window=8),
                 "qwen2": lambda seed: tiny_llama_family("qwen2", VOCAB, seed=seed, sliding_window=8),
                 "qwen3": lambda seed: tiny_llama_family("qwen3", VOCAB, seed=seed)}
SAMPLINGS = {"greedy": SamplingParams(temperature=0), "seeded": SamplingParams.for_request(1.0, 0, 0.9, 123)}


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def models(request):
    return ARCHITECTURES[request.param](0), ARCHITECTURES[request.param](1)


def drafters(draft_model):
    return {"none": lambda: None, "prompt-lookup": PromptLookupDrafter, "prompt-lookup-tree": PromptLookupTreeDrafter,
            "model": lambda: ModelDrafter(LeanBackend(draft_model), VOCAB)}


def run_batch(batch, prompts, sampling, spec, join_every=2):
    """Add a prompt every `join_every` steps (while there is room); step until all have ended."""
    members, waiting, steps = {}, list(enumerate(prompts)), 0
    while waiting or batch.members:
        if waiting and not batch.full and steps % join_every == 0:
            i, prompt = waiting.pop(0)
            members[i] = batch.add(prompt, sampling, spec)
        batch.step()
        steps += 1
    return [members[i].tokens for i in range(len(prompts))]


@pytest.mark.parametrize("sampling", list(SAMPLINGS))
@pytest.mark.parametrize("kind", ["none", "prompt-lookup", "prompt-lookup-tree", "model"])
def test_batched_generation_equals_the_same_generation_alone(models, kind, sampling):
    target, draft = models
    make = drafters(draft)[kind]
    params, spec = SAMPLINGS[sampling], SpecConfig(gamma=3, max_new_tokens=30)
    alone = SpeculativeEngine(LeanBackend(target), make())
    expected = [alone.generate(p, params, spec).run().tokens for p in PROMPTS]
    batch = Batch(SpeculativeEngine(LeanBackend(target), make()), max_batch=3, prefill_chunk=5)
    assert run_batch(batch, PROMPTS, params, spec) == expected
    assert len(batch.slots) == 3  # three sequences served five generations
    batch.close()


def test_run_many_equals_each_sequence_run_alone():
    """Decoder.run_many (one pass, chains, a tree and a prompt chunk of several sequences) gives
    each sequence the hidden states and cache entries its own pass gives."""
    torch.manual_seed(0)
    lone, shared = LeanBackend(tiny_gemma3(VOCAB, seed=0, sliding_window=8)), None
    shared = lone.fork()
    contexts = [torch.randint(0, VOCAB, (n,)) for n in (12, 3, 20)]
    steps = [Step(torch.randint(0, VOCAB, (4,))), Step(torch.randint(0, VOCAB, (5,)), torch.tensor([-1, 0, 0, 1])),
             Step(torch.randint(0, VOCAB, (9,)), wants_logits=False)]
    expected, caches = [], []
    for context, step in zip(contexts, steps):
        lone.reset()
        lone.prefill(context)
        expected.append(lone.forward_many([(lone, step)])[0])
        caches.append([k[:, : lone.cache.length].clone() for k in lone.cache.k])
    sequences = [shared] + [shared.fork() for _ in range(2)]
    for sequence, context in zip(sequences, contexts):
        sequence.prefill(context)
    got = shared.forward_many(list(zip(sequences, steps)))
    for want, have, cache, sequence in zip(expected, got, caches, sequences):
        assert (want is None) == (have is None)
        if want is not None:
            torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)
        for k_want, k_have in zip(cache, sequence.cache.k):
            torch.testing.assert_close(k_have[:, : k_want.shape[1]], k_want, rtol=1e-5, atol=1e-5)


def test_segments_must_cover_the_rows():
    backend = LeanBackend(tiny_llama(VOCAB, seed=0))
    with pytest.raises(ValueError, match="rows"):
        backend.decoder.run_many(torch.zeros(3, 64), [Segment(backend.cache, 0, 2, TreeLayout.of(torch.tensor([-1])))])


def test_a_cancelled_generation_leaves_only_verified_context():
    """Cancelled between its tree pass and the verdict, a sequence keeps just the context it had
    verified, so the next generation that reuses its prefix computes what a fresh one would."""
    target = tiny_llama(VOCAB, seed=0)
    spec, params = SpecConfig(gamma=4, max_new_tokens=20), SamplingParams(temperature=0)
    expected = SpeculativeEngine(LeanBackend(target), PromptLookupTreeDrafter()).generate(PROMPTS[0], params, spec)
    expected = expected.run().tokens
    batch = Batch(SpeculativeEngine(LeanBackend(target), PromptLookupTreeDrafter()), max_batch=1)
    member = batch.add(PROMPTS[0], params, spec)
    while not member.tokens or member.pending is None or member.pending.step.parents is None:
        batch.step()  # until a tree pass is waiting
    batch.step()  # ... and has run: the cache holds its rows in slot order
    while member.pending is None or member.pending.step.parents is None:
        batch.step()
    batch.cancel(member)
    sequence = member.slot.sequence
    assert sequence.held == PROMPTS[0] + member.tokens[:-1]
    again = batch.add(PROMPTS[0], params, spec)
    while batch.members:
        batch.step()
    assert again.tokens == expected


def test_auto_gamma_drafts_less_as_the_batch_fills():
    target = tiny_llama(VOCAB, seed=0)
    batch = Batch(SpeculativeEngine(LeanBackend(target), PromptLookupDrafter()), max_batch=4, row_budget=8)
    assert [batch.draft_cap(n) for n in (1, 2, 4, 9)] == [None, 3, 1, 0]
    members = [batch.add(PROMPTS[1], SamplingParams(temperature=0), SpecConfig(gamma="auto", max_new_tokens=24))
               for _ in range(4)]
    while batch.members:
        batch.step()
    assert all(len(m.stats.position_tested) <= 1 for m in members)  # at most one draft a round
    assert all(m.stats.drafted > 0 for m in members)
    # the last bigram has five continuations in the prompt: a tree of five or more nodes, capped at 12 // 3 - 1
    branching = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2, 6, 1, 2, 7, 1, 2]
    assert PromptLookupTreeDrafter().propose(torch.tensor(branching), 3, SamplingParams(), None).tokens.numel() >= 5
    trees = Batch(SpeculativeEngine(LeanBackend(target), PromptLookupTreeDrafter()), max_batch=4, row_budget=12)
    members = [trees.add(branching, SamplingParams(temperature=0), SpecConfig(gamma="auto", max_new_tokens=24))
               for _ in range(3)]
    rows = []
    while trees.members:
        trees.step()
        rows += [m.pending.step.rows for m in trees.members if m.pending and m.pending.step.wants_logits]
    assert max(rows) == 3 + 1  # a tree's nodes count against the rows too
    assert any(m.stats.tree_rounds for m in members)
    off = Batch(SpeculativeEngine(LeanBackend(target), PromptLookupDrafter()), max_batch=4, spec_off_at=2)
    auto = [off.add(PROMPTS[1], SamplingParams(temperature=0), SpecConfig(gamma="auto", max_new_tokens=12))
            for _ in range(2)]
    own = off.add(PROMPTS[1], SamplingParams(temperature=0), SpecConfig(gamma=3, max_new_tokens=12))
    while off.members:
        off.step()
    assert [m.stats.drafted for m in auto] == [0, 0] and own.stats.drafted > 0


def test_backends_that_hold_one_sequence_batch_one_at_a_time():
    target = tiny_llama(VOCAB, seed=0)
    params, spec = SamplingParams(temperature=0), SpecConfig(gamma=3, max_new_tokens=16)
    expected = [SpeculativeEngine(TransformersBackend(target), PromptLookupDrafter()).generate(p, params, spec).run().tokens
                for p in PROMPTS[:3]]
    batch = Batch(SpeculativeEngine(TransformersBackend(target), PromptLookupDrafter()), max_batch=8)
    assert batch.max_batch == 1
    assert run_batch(batch, PROMPTS[:3], params, spec) == expected
    with pytest.raises(SpecdecError, match="full"):
        batch.add(PROMPTS[0], params, spec)
        batch.add(PROMPTS[1], params, spec)


def test_the_engine_is_the_batch_s_while_it_runs():
    engine = SpeculativeEngine(LeanBackend(tiny_llama(VOCAB, seed=0)), PromptLookupDrafter())
    batch = Batch(engine)
    with pytest.raises(SpecdecError, match="still running"):
        engine.generate(PROMPTS[0], SamplingParams(temperature=0), SpecConfig(max_new_tokens=4)).run()
    batch.close()
    assert engine.generate(PROMPTS[0], SamplingParams(temperature=0), SpecConfig(max_new_tokens=4)).run().tokens


@pytest.mark.parametrize("rows_cost, expected", [(lambda rows: 1.0, "draft"), (lambda rows: rows ** 1.3, "plain")])
def test_drafting_in_a_batch_runs_where_it_measured_faster(rows_cost, expected):
    """Each pass advances a fake clock by what its rows cost: where rows are free (AMX tiles) drafting
    emits more tokens a second and runs; where a pass costs more than its rows would one by one,
    plain steps win and drafting only comes back in the probes. Outputs stay what they are alone."""
    target = tiny_llama(VOCAB, seed=0)
    backend = LeanBackend(target)
    batch = Batch(SpeculativeEngine(backend, PromptLookupDrafter()), max_batch=2, row_budget=16)
    now = [0.0]
    batch._clock = lambda: now[0]
    forward_many = backend.forward_many

    def timed(steps):
        now[0] += rows_cost(sum(step.rows for _, step in steps))
        return forward_many(steps)

    backend.forward_many = timed
    prompt = PROMPTS[1]  # repetitive: prompt lookup's drafts are accepted
    spec = SpecConfig(gamma="auto", max_new_tokens=120)
    members = [batch.add(prompt, SamplingParams(temperature=0), spec) for _ in range(2)]
    ways = []
    while batch.members:
        if len(batch.members) == 2 and all(m.pending is not None for m in batch.members):
            ways.append(batch.choice.way(2))
        batch.step()
    settled = ways[2 * (batch.choice.settle + 1):]  # each way: a step to switch, then `settle` measured
    assert settled and settled.count(expected) > 0.8 * len(settled)
    alone = SpeculativeEngine(LeanBackend(target), None).generate(prompt, SamplingParams(temperature=0), spec).run()
    assert all(m.tokens == alone.tokens for m in members)


def test_speculation_choice_probes_the_slower_way_again():
    choice = SpeculationChoice(settle=2, probe_every=10)
    ways = []
    for _ in range(40):
        way = choice.way(4)
        ways.append(way)
        choice.observe(4, way, tokens=8 if way == "plain" else 4, seconds=1.0)
    assert ways[:4] == ["draft", "draft", "plain", "plain"]
    assert ways[4:10] == ["plain"] * 6 and ways[10:12] == ["draft", "draft"]  # a probe every 10 steps
    assert ways.count("plain") >= 30
    choice.observe(4, "draft", tokens=0, seconds=0.0)  # a zero-length step is not a measurement
    assert choice.seen[choice.bucket(4), "draft"] == ways.count("draft")
    assert [choice.bucket(n) for n in (2, 3, 4, 5, 8, 9)] == [1, 2, 2, 3, 3, 4]
