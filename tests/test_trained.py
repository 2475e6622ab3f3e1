"""Trained drafters (draft-lm, eagle, eagle3, medusa): caches equal recomputation, greedy parity and Monte
Carlo exactness for each kind (drafting over a vocabulary subset), training lowers the loss and
writes a loadable drafter, and a drafter refuses a target it was not trained for."""

import dataclasses
import json

import pytest
import torch

from helpers import tiny_gemma3, tiny_llama
from specdec.backends import LeanBackend, TransformersBackend
from specdec.cli import main
from specdec.config import SamplingParams, SpecConfig
from specdec.drafters import LookupElseTrained, ModelDrafter, PromptLookupDrafter, build_drafter
from specdec.drafters.base import Drafter, Proposal
from specdec.drafters.nets import DraftConfig, DraftNet
from specdec.drafters.trained import (
    DraftLMBackend,
    EagleDrafter,
    EagleTreeDrafter,
    MedusaDrafter,
    load_trained_drafter,
    save_drafter,
)
from specdec.engine import SpeculativeEngine
from specdec.errors import SpecdecError
from specdec.exactness import exact_continuation_law, goodness_of_fit, sample_continuations
from specdec.models import load_model

KINDS = ("draft-lm", "eagle", "eagle3", "medusa")
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


@pytest.fixture(scope="module")
def trained(tiny_dirs, tmp_path_factory):
    """Each kind trained for a few steps on the tiny chat target's self-distillation data."""
    import os

    from specdec.training.data import DataRecipe, build_data
    from specdec.training.train import TrainRecipe, train

    root = tmp_path_factory.mktemp("trained")
    before = os.environ.get("SPECDEC_CACHE")
    os.environ["SPECDEC_CACHE"] = str(root / "cache")
    try:
        target = load_model(str(tiny_dirs["chat"]), "float32")
        data = build_data(target, DataRecipe(prompts=24, max_new_tokens=16, max_prompt_tokens=24, batch=8, topk=8),
                          log=lambda _: None)
        # eagle3's data: the same answers, and the hidden states entering layers 0 and 1 (a teacher pass only)
        with_aux = build_data(target, DataRecipe(prompts=24, max_new_tokens=16, max_prompt_tokens=24, batch=8, topk=8,
                                                 aux_layers=(0, 1)), log=lambda _: None)
        out = {}
        for kind in KINDS:
            net = train(target, with_aux if kind == "eagle3" else data,
                        TrainRecipe(kind=kind, layers=1, ffn=64, vocab_size=24, steps=40, batch=8, window=32, lr=3e-3,
                                    eval_every=20, aux_layers=(0, 1)), log=lambda _: None, progress=False)
            out[kind] = (net, save_drafter(net, root / kind))
        out["data-with-aux"] = with_aux
    finally:
        if before is None:
            del os.environ["SPECDEC_CACHE"]
        else:
            os.environ["SPECDEC_CACHE"] = before
    return target, data, out


def test_distillation_data_is_consistent(trained):
    target, data, _ = trained
    assert data.sequences == 24
    assert data.features.shape == (data.tokens.numel(), target.model.config.hidden_size)
    assert data.topk_ids.shape == data.topk_probs.shape == (data.tokens.numel(), 8)
    assert torch.all(data.topk_probs[:, :-1] >= data.topk_probs[:, 1:])  # sorted, as topk gives them
    # The recorded features are what the target's head reads: they give back its top token.
    logits = data.features.float() @ target.model.get_output_embeddings().weight.T.float()
    agree = (logits.argmax(-1) == data.topk_ids[:, 0]).float().mean()
    assert agree > 0.97


def test_aux_features_are_the_targets_layer_inputs(trained):
    """Data for eagle3 adds, to the same answers, the hidden states entering the asked layers."""
    target, data, out = trained
    with_aux = out["data-with-aux"]
    assert torch.equal(with_aux.tokens, data.tokens) and torch.equal(with_aux.features, data.features)
    d = target.model.config.hidden_size
    assert with_aux.aux.shape == (data.tokens.numel(), 2 * d) and data.aux is None
    first = data.tokens[: int(data.offsets[1])]
    with torch.no_grad():
        states = target.model(first[None], output_hidden_states=True).hidden_states
    torch.testing.assert_close(with_aux.aux[: first.numel()].float(),
                               torch.cat([states[0][0], states[1][0]], dim=-1).to(torch.bfloat16).float())


def test_answer_loop_equals_generate(trained):
    """The data sampler's own batched loop (left padding, finished rows leaving the batch) gives
    transformers' greedy generate() answers, prompt by prompt, in float32."""
    from specdec.training.data import DataRecipe, _answers

    target = trained[0]
    prompts = [target.encode(text) for text in ("hello", "tell me a story about a long river", "why", "a b c d e f")]
    recipe = DataRecipe(max_new_tokens=12, batch=3)
    answers = _answers(target.model, target.tokenizer, prompts, 0.0, recipe, target.eos_token_ids, lambda _: None)
    for prompt, answer in zip(prompts, answers):
        out = target.model.generate(input_ids=torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                                    eos_token_id=sorted(target.eos_token_ids))[0, len(prompt):].tolist()
        assert answer == out


def test_engine_sampler_records_what_a_teacher_pass_gives(trained, tmp_path, monkeypatch):
    """The engine sampler (training.fused: sampling and recording in the same batched passes, prompts
    fed in chunks beside other sequences' decoding) gives, for each sequence, the answer the lean
    backend's own greedy decoding gives at T = 0, and at every position the final-norm features,
    the layer inputs and the top-k of one teacher-forced pass over prompt + answer."""
    from specdec.training.data import DataRecipe, build_data

    target = trained[0]
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    lean = LeanBackend(target.model)
    recipe = DataRecipe(prompts=10, max_new_tokens=12, max_prompt_tokens=24, batch=4, topk=8, aux_layers=(0, 1),
                        sampler="engine")
    data = build_data(target, recipe, log=lambda _: None, backend=lean)
    assert len(list((tmp_path / "distill").iterdir())) == 1
    assert build_data(target, recipe, log=lambda _: None, backend=lean).tokens.equal(data.tokens)  # cached
    assert data.aux.shape == (data.tokens.numel(), 2 * target.model.config.hidden_size)
    assert data.features.shape == (data.tokens.numel(), target.model.config.hidden_size)
    greedy = 0
    for s, sequence in enumerate(data.sequence_list()):
        a, b = int(data.offsets[s]), int(data.offsets[s + 1])
        prompt, answer = sequence[: int(data.prompt_lengths[s])], sequence[int(data.prompt_lengths[s]) :]
        assert 1 <= len(answer) <= 12 and all(t not in target.eos_token_ids for t in answer[:-1])
        if s < 5:  # the first half of the prompts is answered at T = 0 (sequence_order)
            greedy += 1
            plain = SpeculativeEngine(LeanBackend(target.model), eos_token_ids=target.eos_token_ids).generate(
                prompt, SamplingParams(), SpecConfig(gamma=0, max_new_tokens=12)).run().tokens
            assert answer == plain, s
        teacher = LeanBackend(target.model)
        teacher.record_features(True, (0, 1, 2))  # 2 = N: the final-norm features
        logits = teacher.forward(torch.tensor(sequence))
        torch.testing.assert_close(data.aux[a:b].float(), teacher.hidden()[:, :-32].to(torch.bfloat16).float())
        torch.testing.assert_close(data.features[a:b].float(), teacher.hidden()[:, -32:].to(torch.bfloat16).float())
        top = logits.log_softmax(-1).topk(8, dim=-1)
        torch.testing.assert_close(data.topk_probs[a:b], top.values.exp().half().float(), atol=1e-5, rtol=1e-3)  # kept as float16
        assert (data.topk_ids[a:b] == top.indices).float().mean() > 0.99  # ties may order differently
    assert greedy == 5


def test_engine_sampler_keeps_each_answers_records_when_a_sequence_takes_the_next_prompt(trained):
    """A bf16 target's recorded hidden states are its own buffer's rows: a sequence that ends and takes
    the next prompt must not overwrite the records of the answer it gave (5 prompts on 2 sequences)."""
    from specdec.training.fused import sample_and_record

    model = trained[0].model
    bf16 = type(model)(model.config).to(torch.bfloat16).eval()
    bf16.load_state_dict(model.state_dict())
    prompts = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12], [2, 4, 6], [3, 5, 7, 9]]
    records = sample_and_record(LeanBackend(bf16), prompts, [0.0, 1.0, 0.0, 1.0, 0.0], 10, set(), 4, (0, 2),
                                batch=2, generator=torch.Generator().manual_seed(0))
    for prompt, record in zip(prompts, records):
        teacher = LeanBackend(bf16)
        teacher.record_features(True, (0, 2))
        teacher.forward(torch.tensor(prompt + record.answer)[: record.hidden.shape[0]])
        want = teacher.hidden().float()
        error = (record.hidden.float() - want).norm(dim=-1) / want.norm(dim=-1)
        assert error.max() < 0.05, (prompt, error)


def test_engine_sampler_draws_from_the_tempered_law():
    """The engine sampler's batched draw: argmax at T = 0, and at T > 0 a draw from softmax(logits / T)
    (χ² against the exact law; the law at T = 1 must be rejected for draws at T = 0.5)."""
    from specdec.training.fused import _draw

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5, -30.0], [0.0, 3.0, 1.0, 1.0, 0.0, 0.0]])
    temperatures = torch.tensor([0.5, 0.0])
    generator = torch.Generator().manual_seed(0)
    rows = logits.repeat(4000, 1)
    tokens = _draw(rows, temperatures.repeat(4000), generator).view(4000, 2)
    assert torch.all(tokens[:, 1] == 1)
    from collections import Counter

    counts = Counter(tokens[:, 0].tolist())
    law = dict(enumerate((logits[0] / 0.5).softmax(-1).tolist()))
    assert goodness_of_fit("T = 0.5", counts, law).p_value > 1e-4
    wrong = dict(enumerate(logits[0].softmax(-1).tolist()))
    assert goodness_of_fit("negative control: T = 1", counts, wrong).p_value < 1e-6


def test_data_sets_concatenate(trained):
    from specdec.training.data import DistillData

    data = trained[1]
    both = DistillData.concat([data, data])
    assert both.sequences == 2 * data.sequences and both.offsets[-1] == 2 * data.tokens.numel()
    n = data.sequences
    for s in (0, n - 1):
        a = slice(int(data.offsets[s]), int(data.offsets[s + 1]))
        b = slice(int(both.offsets[n + s]), int(both.offsets[n + s + 1]))
        assert torch.equal(data.tokens[a], both.tokens[b]) and torch.equal(data.features[a], both.features[b])
    assert torch.equal(both.token_counts, 2 * data.token_counts)


def test_data_files_read_together_equal_the_concatenation(trained, tmp_path):
    from specdec.training.data import DistillData

    data = trained[1]
    data.save(tmp_path / "a.safetensors")
    read = DistillData.load([tmp_path / "a.safetensors", tmp_path / "a.safetensors"])
    both = DistillData.concat([DistillData.load(tmp_path / "a.safetensors")] * 2)
    for name in ("tokens", "offsets", "prompt_lengths", "features", "topk_ids", "topk_probs", "token_counts", "aux"):
        a, b = getattr(read, name), getattr(both, name)
        assert (a is None) == (b is None) and (a is None or (a.dtype == b.dtype and torch.equal(a, b))), name


def test_more_answers_a_prompt_and_chunks_that_resume(trained, tmp_path, monkeypatch):
    """samples = 2: every prompt answered once at the rotation's temperature, then once more at T = 1;
    a recipe of more sequences than a chunk is cached chunk by chunk, and a lost chunk is all that is
    sampled again."""
    from specdec.training import data as data_module
    from specdec.training.data import DataRecipe, build_data, sequence_order

    assert sequence_order(5, 2, 3) == [(0, 0), (2, 0), (4, 0), (1, 1), (3, 1)] + [(i, 1) for i in range(5)] * 2
    target = trained[0]
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(data_module, "CHUNK_SEQUENCES", 7)
    lean = LeanBackend(target.model)
    recipe = DataRecipe(prompts=6, max_new_tokens=6, max_prompt_tokens=16, batch=4, topk=4, sampler="engine", samples=2)
    logs: list[str] = []
    data = build_data(target, recipe, log=logs.append, backend=lean)
    parts = sorted((tmp_path / "distill").glob("*.part*"))
    assert len(parts) == 2 and data.sequences == 12
    prompts = [tuple(s[: int(n)]) for s, n in zip(data.sequence_list(), data.prompt_lengths)]
    order = sequence_order(6, 2)
    assert prompts[6:] == [prompts[order.index((i, i % 2))] for i in range(6)]  # the second answers, prompt order
    assert build_data(target, recipe, log=logs.append, backend=lean).tokens.equal(data.tokens)
    assert "cached" in logs[-1]
    second = next(p for p in parts if ".part2of2" in p.name)
    second.unlink()
    logs.clear()
    again = build_data(target, recipe, log=logs.append, backend=lean)
    assert any("chunk 1 of 2 cached" in line for line in logs) and second.is_file()
    assert again.tokens[: int(again.offsets[7])].equal(data.tokens[: int(data.offsets[7])])


def test_chunks_an_eagle3_run_left_part_way_are_continued_for_the_other_kinds(trained, tmp_path, monkeypatch):
    """A recipe without aux features, with nothing of its own cached, continues the chunks an eagle3 run
    (the same answers, with aux) sampled before it stopped, instead of sampling everything again."""
    from specdec.drafters import eagle3_format
    from specdec.training import data as data_module
    from specdec.training.data import DataRecipe, data_files

    target = trained[0]
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(eagle3_format, "default_aux_layers", lambda layers: [0, 1])
    monkeypatch.setattr(data_module, "CHUNK_SEQUENCES", 3)
    lean = LeanBackend(target.model)
    recipe = DataRecipe(prompts=6, max_new_tokens=4, max_prompt_tokens=16, batch=4, topk=4, sampler="engine")
    with_aux = data_files(target, dataclasses.replace(recipe, aux_layers=(0, 1)), log=lambda _: None, backend=lean)
    assert len(with_aux) == 2
    kept = with_aux[0].read_bytes()
    with_aux[1].unlink()  # the eagle3 run stopped after its first chunk
    logs: list[str] = []
    assert data_files(target, recipe, log=logs.append, backend=lean) == with_aux
    assert with_aux[0].read_bytes() == kept  # the first chunk read, not sampled again
    assert any("continuing" in line for line in logs) and any("chunk 1 of 2 cached" in line for line in logs)


def test_data_sampled_for_eagle3_serves_the_other_kinds(trained, tmp_path, monkeypatch):
    """Data cached with the default aux layers' hidden states (an eagle3 run's) is what a recipe without
    them reads, nothing sampled again; read without aux it holds none."""
    from specdec.drafters import eagle3_format
    from specdec.training.data import DataRecipe, DistillData, data_files

    target = trained[0]
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setattr(eagle3_format, "default_aux_layers", lambda layers: [0, 1])
    lean = LeanBackend(target.model)
    recipe = DataRecipe(prompts=4, max_new_tokens=4, max_prompt_tokens=16, batch=4, topk=4, sampler="engine")
    logs: list[str] = []
    with_aux = data_files(target, dataclasses.replace(recipe, aux_layers=(0, 1)), log=logs.append,
                          backend=lean)
    assert data_files(target, recipe, log=logs.append, backend=lean) == with_aux
    assert "cached, with layers [0, 1]' inputs" in logs[-1]
    plain = DistillData.load(with_aux, aux=False)
    assert plain.aux is None and plain.features is not None
    assert DistillData.load(with_aux).aux is not None


def test_held_out_prompts_are_held_out_whole():
    from specdec.training.train import held_out_sequences

    assert held_out_sequences(list(range(100))) == [10, 30, 50, 70, 90]  # distinct prompts: every 20th sequence
    prompts = list(range(40)) + list(range(40))  # each answered twice
    assert held_out_sequences(prompts) == [10, 30, 50, 70]
    assert held_out_sequences(["a", "b"]) == [1]


def test_open_questions_are_distinct_seeded_and_leave_out_the_bench():
    from specdec.prompts import CHAT_QUESTIONS
    from specdec.training.topics import open_questions

    questions = open_questions(10_000)
    assert len(questions) == len(set(questions)) > 2800
    assert not set(questions) & set(CHAT_QUESTIONS)
    assert open_questions(50, seed=3) == open_questions(50, seed=3) != open_questions(50, seed=4)


@pytest.mark.parametrize("kind", KINDS)
def test_training_lowers_the_loss_and_saves_a_loadable_drafter(trained, kind):
    target, _, out = trained
    net, directory = out[kind]
    recipe = net.config.recipe
    assert recipe["final_loss"] < recipe["first_loss"], recipe
    config = json.loads((directory / "config.json").read_text())
    assert config["kind"] == kind and config["target"]["tokenizer"]
    drafter = load_trained_drafter(directory, target)
    prompt = target.encode("hello there, how are you")
    engine = SpeculativeEngine(LeanBackend(target.model), drafter, target.eos_token_ids)
    plain = SpeculativeEngine(LeanBackend(target.model), None, target.eos_token_ids)
    spec = SpecConfig(gamma=3, max_new_tokens=30, stop_at_eos=False)
    run = engine.generate(prompt, SamplingParams(), spec).run()
    assert run.tokens == plain.generate(prompt, SamplingParams(), spec).run().tokens
    assert run.stats.drafted > 0


def test_ctrl_c_during_training_keeps_the_steps_done(trained):
    """The first Ctrl-C ends training after the step in progress and returns the drafter, measured; the handler
    in place before training is back afterwards."""
    import os
    import signal
    import threading
    import time

    from specdec.training.train import StopRequest, TrainRecipe, train

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("Python runs signal handlers only in the main thread, and this test runs in another")
    target, data, _ = trained
    before = signal.getsignal(signal.SIGINT)

    def interrupt_once_training_listens() -> None:
        deadline = time.monotonic() + 120
        while not isinstance(getattr(signal.getsignal(signal.SIGINT), "__self__", None), StopRequest):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)

    messages = []
    threading.Thread(target=interrupt_once_training_listens, daemon=True).start()
    net = train(target, data, TrainRecipe(kind="eagle", layers=1, ffn=64, vocab_size=24, steps=10**6, batch=8, window=32,
                                          eval_every=20), log=messages.append, progress=False)
    recipe = net.config.recipe
    assert recipe["interrupted"] is True and 1 <= recipe["steps_done"] < 10**6
    assert any("interrupted: stopping after the step in progress" in m for m in messages)
    assert recipe["history"][-1]["step"] == recipe["steps_done"]  # measured at the step it stopped
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_ctrl_c_abandons_training():
    from specdec.training.train import StopRequest

    stop = StopRequest()
    stop._on_interrupt(2, None)
    assert stop.requested
    with pytest.raises(KeyboardInterrupt):
        stop._on_interrupt(2, None)


def test_drafter_for_another_target_is_refused(trained, tiny_dirs):
    _, _, out = trained
    other = load_model(str(tiny_dirs["long"]), "float32")  # same tokenizer, other weights
    with pytest.raises(SpecdecError, match="trained for target"):
        load_trained_drafter(out["eagle"][1], other)
    alien = load_model(str(tiny_dirs["alien"]), "float32")
    with pytest.raises(SpecdecError, match="tokenizer differ"):
        build_drafter(str(out["medusa"][1]), alien)


def test_cli_train_then_generate(tiny_dirs, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "medusa"
    args = ["train-drafter", "--target", str(tiny_dirs["chat"]), "--kind", "medusa", "--out", str(out), "--steps", "3",
            "--prompts", "8", "--max-new-tokens", "8", "--vocab", "16", "--dtype", "float32", "--chat-prompts", "4",
            "--chat-max-new-tokens", "6"]
    assert main(args) == 0
    data = json.loads((out / "config.json").read_text())["recipe"]["data"]
    assert data["chat_prompts"] == 4 and data["positions"] > 0 and data["sampled_on"] == "lean"
    assert main(args) == 1  # will not overwrite without --overwrite
    assert "--overwrite" in capsys.readouterr().err
    for how in (["--sampler", "transformers"], []):  # asked for; and where the backend holds one sequence only
        if not how:
            monkeypatch.setattr(LeanBackend, "can_fork", False)
        assert main([*args, *how, "--out", str(tmp_path / "other"), "--overwrite"]) == 0  # the last --out counts
        assert json.loads((tmp_path / "other" / "config.json").read_text())["recipe"]["data"]["sampled_on"] == "transformers"
    assert "sampling with transformers instead" in capsys.readouterr().err
    monkeypatch.undo()
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    assert len(list((tmp_path / "cache" / "distill").iterdir())) == 4  # two recipes, by each sampler
    assert main(["generate", "hello", "--target", str(tiny_dirs["chat"]), "--drafter", str(out), "--dtype", "float32",
                 "--max-new-tokens", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["stats"]["drafter"].startswith("medusa:")
    more = tmp_path / "medusa-more"  # continue training it
    assert main(["train-drafter", "--target", str(tiny_dirs["chat"]), "--kind", "medusa", "--out", str(more), "--steps", "2",
                 "--prompts", "8", "--max-new-tokens", "8", "--dtype", "float32", "--init", str(out), "--lr", "1e-3"]) == 0
    assert json.loads((more / "config.json").read_text())["recipe"]["continued_from"]["path"] == str(out)
    assert main(["train-drafter", "--target", str(tiny_dirs["chat"]), "--kind", "eagle", "--out", str(tmp_path / "e"),
                 "--steps", "1", "--prompts", "8", "--max-new-tokens", "8", "--init", str(out)]) == 1
    assert "is a medusa drafter" in capsys.readouterr().err
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    assert main(["train-drafter", "--target", str(tiny_dirs["chat"]), "--kind", "eagle", "--out", str(tmp_path / "notes"),
                 "--steps", "1"]) == 1
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"
    assert main(["generate", "hi", "--target", str(tiny_dirs["chat"]), "--drafter", str(tmp_path / "notes")]) == 1
    assert "not a trained drafter" in capsys.readouterr().err


def test_train_drafter_samples_the_target_on_the_weights_asked_for(tiny_dirs, tmp_path, monkeypatch, capsys):
    """--weights q8_0: the target answers on its Q8_0 blocks (the model one will generate with), cached apart
    from its float answers; the transformers sampler cannot run them, and says so."""
    from specdec.modeling import quant

    if not quant.packed_int8():
        pytest.skip(f"quant.cpp's packed int8 kernels do not run here: {quant.unavailable_reason() or 'no AVX2/F16C'}")
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    args = ["train-drafter", "--target", str(tiny_dirs["chat"]), "--kind", "eagle", "--steps", "2", "--prompts", "8",
            "--max-new-tokens", "8", "--vocab", "16", "--weights", "q8_0"]
    assert main([*args, "--out", str(tmp_path / "q8")]) == 0
    data = json.loads((tmp_path / "q8" / "config.json").read_text())["recipe"]["data"]
    assert data["sampled_on"].startswith("lean+q8_0-int8")
    assert main([*args, "--out", str(tmp_path / "hf"), "--sampler", "transformers"]) == 1
    assert "use --sampler engine" in capsys.readouterr().err


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
    from specdec.sampling import probs, sample, samples
    from specdec.vocab_map import VocabMap

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
    from specdec.conformance import Settings, run_conformance

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
    Gemma-3 here would cost a minute, so its drafter's parity and law are `specdec verify`'s, in docs/results.)"""
    from safetensors import safe_open

    from specdec.config import BUILTIN_TARGETS
    from specdec.drafters import shipped_drafter
    from specdec.drafters.trained import WEIGHTS_FILE, check_vocab, read_config

    for name in BUILTIN_TARGETS:
        path = shipped_drafter(name)
        assert path is not None, f"no drafter ships for {name}"
        config = read_config(path)
        assert config.target["name"] == name
        assert sum(f.stat().st_size for f in path.iterdir()) <= 16_000_000, name
        assert config.recipe["history"] and config.recipe["held_out"], name
        with safe_open(str(path / WEIGHTS_FILE), "pt") as weights:
            check_vocab(weights.get_tensor("vocab"), config.target["vocab_width"], path)  # raises unless valid


def test_train_drafter_loads_a_builtin_target_as_generation_does(tmp_path, monkeypatch, capsys):
    """The engine sampler records the numbers of the path the drafter will draft for: with --dtype
    auto, train-drafter loads a built-in target in float32 where generation runs it on the GGUF
    blocks (it loaded bf16 and sampled on the bf16 path, recording another path's numbers); an
    explicit dtype is kept. --layers is refused for kinds that have no layer count to set."""
    import specdec.models
    from specdec.backends import gguf

    loaded = []

    def record(name, dtype="auto", device="cpu"):
        loaded.append(dtype)
        raise SpecdecError("stopped after the load")

    monkeypatch.setattr(specdec.models, "load_model", record)
    for blocks_run in (True, False):
        monkeypatch.setattr(gguf.quant, "packed_int8", lambda blocks_run=blocks_run: blocks_run)
        for dtype in ("auto", "bfloat16"):
            assert main(["train-drafter", "--kind", "eagle", "--out", str(tmp_path / "d"), "--dtype", dtype]) == 1
    assert "stopped after the load" in capsys.readouterr().err
    assert loaded == ["float32", "bfloat16", "auto", "bfloat16"]
    for kind in ("eagle3", "medusa"):
        assert main(["train-drafter", "--kind", kind, "--out", str(tmp_path / "d"), "--layers", "2"]) == 1
        assert "--layers takes" in capsys.readouterr().err
    assert len(loaded) == 4  # refused before loading anything


def test_eagle_feature_loss_weighs_the_regression_and_zero_leaves_the_tokens_alone(trained):
    """--feature-loss w: eagle's loss is 0.5 × the token loss + w × the feature regression, per
    unrolled step; w = 0 is the token loss alone (EAGLE-3's objective on EAGLE's net)."""
    from specdec.training.train import Objective, Windows, soft_cross_entropy

    _, data, out = trained
    net = out["eagle"][0]
    batch = Windows(data, list(range(data.sequences)), 32, 0, 0.3).batch(4)
    tokens_only = Objective(net, 1.0, 3, feature_loss=0.0)
    ce = sum(0.5 * soft_cross_entropy(logits, batch["topk_ids"][:, at], batch["topk_probs"][:, at],
                                      tokens_only.to_draft, batch["weight"][:, at])
             for logits, at, _ in tokens_only._outputs(batch))
    with torch.no_grad():
        assert torch.allclose(tokens_only.loss(batch), ce)
        one, two = (Objective(net, 1.0, 3, feature_loss=w).loss(batch) for w in (1.0, 2.0))
        assert one > ce + 1e-4 and torch.allclose(two - ce, 2 * (one - ce), rtol=1e-4)
