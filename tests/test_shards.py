"""Distillation data that outlives the machine: token-id shards with a manifest, training that resumes
with its optimiser state, and runs that stop cleanly on the clock or on SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.models import load_model, target_identity
from specdec.training import shards
from specdec.training.shards import Sequences, read_manifest, read_sequences, write_shard

TRAIN = ["train-drafter", "--kind", "eagle", "--dtype", "float32", "--vocab", "16", "--chat-max-new-tokens", "8"]


@pytest.fixture
def small_shards(monkeypatch):
    monkeypatch.setattr(shards, "SHARD_SEQUENCES", 8)


def test_a_shard_round_trips_with_its_manifest(tiny_dirs, tmp_path):
    target = load_model(str(tiny_dirs["chat"]), "float32")
    identity = target_identity(target)
    made = Sequences([[1, 2, 3], [4]], [[5, 6], []], ["chat", "code"], [0.0, 1.0])
    assert write_shard(tmp_path, made, identity, {"max_new_tokens": 2}, {"chat": "here"}) == "shard-00001.npz"
    assert write_shard(tmp_path, made, identity, {}, {}) == "shard-00002.npz"
    back = read_sequences(tmp_path)
    assert back.prompts == made.prompts * 2 and back.answers == made.answers * 2
    assert back.tasks == made.tasks * 2 and back.temperatures == made.temperatures * 2
    with np.load(tmp_path / "shard-00001.npz") as z:
        assert z["tokens"].dtype == np.uint16  # the vocabulary fits
    manifest = read_manifest(tmp_path, identity)
    assert manifest["target"] == identity and [e["sequences"] for e in manifest["shards"]] == [2, 2]
    assert manifest["shards"][0]["answer_tokens"] == 2 and manifest["shards"][0]["tasks"] == {"chat": 1, "code": 1}
    assert not list(tmp_path.glob("*.tmp"))
    other = target_identity(load_model(str(tiny_dirs["long"]), "float32"))
    with pytest.raises(SpecdecError, match="sampled from"):
        write_shard(tmp_path, made, other, {}, {})
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(SpecdecError, match="not a distillation-data manifest"):
        read_sequences(tmp_path)


def test_new_shards_take_prompts_no_shard_used(tiny_dirs):
    target = load_model(str(tiny_dirs["chat"]), "float32")
    used: set[str] = set()
    pool = shards.prompt_pool(0)
    first = shards.fresh_prompts(target, pool, used, 20, 320)
    again = shards.fresh_prompts(target, shards.prompt_pool(0), used, 20, 320)  # a new run: same pool, same used
    keys = [shards._prompt_key(ids) for _, ids in first + again]
    assert len(first) == len(again) == 20 and len(set(keys)) == 40
    assert {task for task, _ in first} >= {"chat"} and len({task for task, _ in first}) >= 2  # chat and the tasks


def test_train_on_shards_then_resume_with_the_optimiser_state(tiny_dirs, tmp_path, monkeypatch, capsys, small_shards):
    """Sampling writes shards into --data-dir; --resume continues the drafter with AdamW's moments (their step
    counts carry on) and keeps one line a run; on a machine without the local teacher records, one
    teacher-forced pass rebuilds them from the ids, and they agree with what sampling recorded."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    data, out = tmp_path / "data", tmp_path / "drafter"
    target = ["--target", str(tiny_dirs["chat"])]
    assert main([*TRAIN, *target, "--out", str(out), "--data-dir", str(data), "--sample-minutes", "0.05",
                 "--steps", "2"]) == 0
    made = read_manifest(data)["shards"]
    assert made and all(e["sequences"] == 8 for e in made)
    recipe = json.loads((out / "config.json").read_text())["recipe"]
    assert recipe["data"]["shards"] == len(made) and recipe["data"]["data_dir"] == str(data)
    assert set(recipe["held_out"]) <= set(shards.TASKS) and recipe["held_out"]
    from safetensors import safe_open

    with safe_open(str(out / "optimizer-exp_avg.safetensors"), "pt") as f:
        assert set(f.metadata().values()) == {"2"}

    recorded = sorted((tmp_path / "cache" / "distill" / "shards").iterdir())
    assert len(recorded) == len(made)
    sampled = {p.name: _topk(p) for p in recorded}
    for p in recorded:
        p.unlink()  # another machine: only the committed shards
    assert main([*TRAIN, *target, "--resume", str(out), "--data-dir", str(data), "--steps", "3"]) == 0
    err = capsys.readouterr().err
    assert "with its optimiser state" in err and "teacher pass over" in err
    rebuilt = {p.name: _topk(p) for p in sorted((tmp_path / "cache" / "distill" / "shards").iterdir())}
    assert rebuilt.keys() == sampled.keys()
    for name, top in sampled.items():
        assert (rebuilt[name] == top).float().mean() > 0.99  # the engine's records and transformers' pass agree
    recipe = json.loads((out / "config.json").read_text())["recipe"]
    assert [r["steps_done"] for r in recipe["runs"]] == [2, 3]
    with safe_open(str(out / "optimizer-exp_avg.safetensors"), "pt") as f:
        assert set(f.metadata().values()) == {"5"}

    assert main([*TRAIN, *target, "--resume", str(out), "--out", str(tmp_path / "else"), "--steps", "1"]) == 1
    assert "writes it back there" in capsys.readouterr().err
    assert main([*TRAIN, *target, "--out", str(tmp_path / "none"), "--data-dir", str(tmp_path / "empty"),
                 "--steps", "1"]) == 1
    assert "holds no data shards yet" in capsys.readouterr().err
    assert main([*TRAIN, *target, "--out", str(tmp_path / "x"), "--sample-minutes", "1", "--steps", "1"]) == 1
    assert "give one" in capsys.readouterr().err


def _topk(path):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.get_tensor("topk_ids")[:, 0]


def test_optimizer_state_round_trips_and_a_resized_drafter_starts_afresh(tmp_path):
    from specdec.training.train import read_optimizer_state, save_optimizer_state

    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.0)
    for _ in range(3):
        net(torch.randn(5, 4)).square().sum().backward()
        optimizer.step()
    save_optimizer_state(optimizer.state_dict(), tmp_path)
    back = read_optimizer_state(tmp_path, net)
    for i, s in optimizer.state_dict()["state"].items():
        assert int(back[i]["step"]) == 3
        torch.testing.assert_close(back[i]["exp_avg"], s["exp_avg"], rtol=1e-2, atol=1e-6)
        torch.testing.assert_close(back[i]["exp_avg_sq"], s["exp_avg_sq"], rtol=1e-2, atol=1e-8)
    fresh = torch.optim.AdamW(net.parameters(), lr=1e-3)
    fresh.load_state_dict({"state": back, "param_groups": fresh.state_dict()["param_groups"]})
    assert int(fresh.state_dict()["state"][0]["step"]) == 3
    assert read_optimizer_state(tmp_path, torch.nn.Sequential(torch.nn.Linear(4, 2))) is None
    assert read_optimizer_state(tmp_path / "nothing", net) is None


def test_sigterm_during_sampling_keeps_every_finished_shard(tiny_dirs, tmp_path):
    """What a scheduler sends: the run ends with exit code 0, every finished shard listed in the manifest,
    none half-written."""
    data = tmp_path / "data"
    proc = subprocess.Popen([sys.executable, "-m", "specdec", *TRAIN, "--target", str(tiny_dirs["chat"]), "--out",
                             str(tmp_path / "d"), "--data-dir", str(data), "--sample-minutes", "10", "--steps", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (data / "manifest.json").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "stopped before training" in err and "Traceback" not in err
    listed = {e["name"] for e in read_manifest(data)["shards"]}
    assert listed and listed == {p.name for p in data.glob("shard-*.npz")} and not list(data.glob("*.tmp"))
    assert not (tmp_path / "d" / "model.safetensors").exists()


def test_second_turns_continue_sampled_chats_but_never_held_out_ones(tiny_dirs):
    """Once the first turns are used up the pool goes on with conversations: a sampled chat's question,
    the target's own answer and a follow-up (a request to go on after an answer cut at the limit), and
    none built on an answer training holds out; then code edits of the standard library's methods."""
    from specdec.training.train import held_out_sequences

    target = load_model(str(tiny_dirs["chat"]), "float32")
    questions = [text for task, text in shards.prompt_pool(0) if task == "chat"][:40]
    eos = sorted(target.eos_token_ids)[0]
    answer = target.encode("A short answer.", chat=False)
    done = Sequences([target.encode(q)[-320:] for q in questions], [answer + [eos] if i % 2 else answer for i in range(40)],
                     ["chat"] * 40, [0.0] * 40)
    made = shards.follow_ups(target, done, [("chat", q) for q in questions], shards.random.Random(0))
    held = held_out_sequences([tuple(p) for p in done.prompts])
    assert len(made) == 40 - len(held) and held
    firsts = [m[0]["content"] for _, m in made]
    assert not {questions[h] for h in held} & set(firsts)
    for _, (user, assistant, follow) in made:
        i = questions.index(user["content"])
        assert assistant["role"] == "assistant" and "short answer" in assistant["content"]
        assert follow["content"] in (shards.FOLLOW_UPS if i % 2 else shards.CONTINUE)
    pool = list(shards.prompt_pool(0, target, done))
    later = pool[pool.index(next(p for p in pool if isinstance(p[1], list))):]
    assert {task for task, _ in later} == {"chat", "code"} and "```python" in later[1][1]
    fresh = shards.fresh_prompts(target, iter(later), set(), 4, 320)
    assert len(fresh) == 4 and all(ids for _, ids in fresh)


def test_the_teacher_pass_stops_on_the_clock_and_training_reads_the_shards_it_reached(tiny_dirs, tmp_path,
                                                                                      monkeypatch):
    """On a fresh machine the teacher pass over every committed shard can outlast a run: it takes the newest
    first, stops between shards at its deadline, and the held-out sequences of the shards it reached are the
    ones a pass over all of them holds out (a prompt held out once is never trained on later)."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "cache"))
    target = load_model(str(tiny_dirs["chat"]), "float32")
    identity = target_identity(target)
    for n in range(3):  # 25 distinct prompts a shard: the 10th, 30th, 50th, 70th of 75 are held out
        prompts = [[1 + n, 2 + i % 30, 3 + i // 30] for i in range(25)]
        write_shard(tmp_path, Sequences(prompts, [[5, 6]] * 25, ["chat", "code"] * 12 + ["chat"], [0.0] * 25),
                    identity, {}, {})
    names = [e["name"] for e in read_manifest(tmp_path)["shards"]]
    assert shards.teacher_files(target, tmp_path, lambda m: None, deadline=time.monotonic()) == {}
    calls = []
    stop_after_one = lambda: bool(calls) or calls.append(1)  # noqa: E731
    reached = shards.teacher_files(target, tmp_path, lambda m: None, should_stop=stop_after_one)
    assert list(reached) == [names[2]]  # the newest
    everything = shards.teacher_files(target, tmp_path, lambda m: None)
    assert list(everything) == names and everything[names[2]] == reached[names[2]]

    whole = read_sequences(tmp_path)
    held_all, _ = shards.held_out_and_tasks(tmp_path, names)
    assert [tuple(whole.prompts[s]) for s in held_all] and held_all == [10, 30, 50, 70]
    held, tasks = shards.held_out_and_tasks(tmp_path, [names[0], names[2]])
    part = read_sequences(tmp_path, [names[0], names[2]])
    assert [part.prompts[s] for s in held] == [whole.prompts[s] for s in held_all if s < 25 or s >= 50]
    assert tasks["code"] == {i for i, t in enumerate(part.tasks) if t == "code"} and len(tasks["code"]) == 24
