"""Training drafters: self-distillation data (the sampler records what a teacher pass gives, chunks and
shards that resume), training lowers the loss and writes a loadable drafter, Ctrl-C keeps the steps done, and
`specdec train-drafter` end to end."""


import dataclasses
import json

import pytest
import torch

from specdec.backends import LeanBackend
from specdec.cli import main
from specdec.config import SamplingParams, SpecConfig
from specdec.conformance.exactness import goodness_of_fit
from specdec.decoding.engine import SpeculativeEngine
from specdec.drafters.nets import KINDS
from specdec.drafters.trained import load_trained_drafter
from specdec.errors import SpecdecError


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
    from specdec.tasks.prompts import CHAT_QUESTIONS
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
