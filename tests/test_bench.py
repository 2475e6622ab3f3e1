"""`specdec bench --quick` on a tiny random model: rows, table and plots; seeding and interleaving."""

import json

import pytest

from specdec.bench import runner
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.tasks.prompts import TASKS, load_prompts_file, task_prompts


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"task": "custom", "prompt": "abc abc abc ab"}\n{"prompt": "the cat the cat the"}\n')
    return path


def test_bench_quick_writes_rows_table_and_plots(tiny_dirs, prompts_file, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["bench", "--quick", "--target", str(tiny_dirs["target"]), "--drafter", "prompt-lookup",
                 "--drafter", f"model:{tiny_dirs['draft']}", "--prompts", str(prompts_file), "--dtype", "float32",
                 "--out", str(out)])
    assert code == 0
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    methods = {r["method"] for r in rows}
    assert {"plain", "prompt-lookup", f"model:{tiny_dirs['draft']}", "hf-generate", "hf-prompt-lookup"} <= methods
    assert any(m.startswith("hf-assisted") for m in methods)
    for r in rows:
        assert r["prompts"] == 2 and r["speedup"]["median"] > 0
        if r["method"] in ("prompt-lookup",) or r["method"].startswith("model:"):
            assert 0 <= r["alpha"] <= 1 and r["tau"] >= 1 and r["c"] >= 0 and r["predicted_speedup"] > 0
            assert r["identical_to_plain"] == 2  # float32 greedy: speculative = plain, token for token
    table = (out / "table.md").read_text()
    assert table.startswith("| task | method | T | γ | α |") and table.count("\n") == len(rows) + 4
    path = {r["path"] for r in rows if r["method"] == "plain"}.pop()  # which arithmetic ran, said once
    assert path.startswith("lean") and table.endswith(f"\nspecdec ran on: {path}\n")
    for png in ("speedup_vs_gamma.png", "alpha.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stamp = {(r["cpu"], r["commit"], r["date"], r["target"]) for r in rows}
    assert len(stamp) == 1 and stamp.pop()[3] == str(tiny_dirs["target"])  # what the rows were measured on
    capsys.readouterr()
    assert main(["bench", "--report", str(tmp_path)]) == 0  # finds out/rows.jsonl below it
    report = capsys.readouterr().out
    assert report.startswith(f"### {rows[0]['cpu']}\n") and "| plain |" not in report
    assert report.count(f"| {rows[0]['commit']} |") == sum(r["method"] != "plain" for r in rows)


def test_interleaving_and_seeding(tiny_dirs, prompts_file, monkeypatch):
    """Every method of a prompt runs in a seeded shuffled order with the same sampling seed."""
    seen = []
    original = runner._run_one

    def spy(name, key, gamma, prompt, p_index, ids, sampling, *rest):
        seen.append((p_index, sampling.temperature, name, sampling.seed))
        return original(name, key, gamma, prompt, p_index, ids, sampling, *rest)

    monkeypatch.setattr(runner, "_run_one", spy)
    config = runner.BenchConfig(target=str(tiny_dirs["target"]), drafters=["prompt-lookup"], temperatures=[1.0],
                                gammas=[1, 2], prompts_file=str(prompts_file), max_new_tokens=6, dtype="float32")
    runner.run_bench(config)
    first = list(seen)
    seen.clear()
    runner.run_bench(config)
    assert seen == first  # same seed, same order
    for p_index in (0, 1):
        mine = [s for s in first if s[0] == p_index]
        assert len({s[3] for s in mine}) == 1  # one sampling seed shared by every method of a prompt
    orders = [[s[2] for s in first if s[0] == p] for p in (0, 1)]
    assert sorted(orders[0]) == sorted(orders[1])  # every method on every prompt ...
    assert orders[0] != orders[1]  # ... in an order shuffled per prompt (these seeds give two orders)


def test_task_prompts_are_reproducible():
    for task in TASKS:
        a, b = task_prompts(task, 2, seed=3), task_prompts(task, 2, seed=3)
        assert a == b and len(a) == 2 and all(p.text.strip() for p in a)
    assert task_prompts("translate", 2, seed=3) != task_prompts("translate", 2, seed=4)
    assert all(p.reference for p in task_prompts("translate", 3, seed=0))


def test_bad_prompts_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    with pytest.raises(SpecdecError, match="prompt"):
        load_prompts_file(bad)
    with pytest.raises(SpecdecError, match="cannot read"):
        load_prompts_file(tmp_path / "missing.jsonl")


def test_coupled_rows_measure_the_coupling_at_t_above_zero(tiny_dirs, prompts_file, tmp_path):
    out = tmp_path / "out"
    code = main(["bench", "--target", str(tiny_dirs["target"]), "--drafter", f"model:{tiny_dirs['draft']}",
                 "--prompts", str(prompts_file), "--dtype", "float32", "--temperatures", "0,1", "--gammas", "3",
                 "--max-new-tokens", "12", "--no-peers", "--coupled", "--out", str(out)])
    assert code == 0
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    coupled = [r for r in rows if r["method"].endswith("+coupled")]
    assert coupled and all(r["temperature"] == 1.0 for r in coupled)  # greedy has nothing to couple
    assert all(0 <= r["alpha"] <= 1 for r in coupled)


def test_peers_are_compared_end_to_end():
    """A peer's time includes its prefill, so its speedup is against plain decoding's end-to-end rate;
    specdec's own rows compare decoding rates. Rows carry both rates."""
    def run(method, tps, e2e, **extra):
        return {"method": method, "task": "t", "prompt_index": 0, "temperature": 0.0, "gamma": None, "tokens": [1, 2],
                "tps": tps, "e2e_tps": e2e, "peak_rss_mb": 1.0, **extra}

    rows = runner.aggregate([run("plain", 50.0, 40.0), run("llama.cpp", 60.0, 60.0, includes_prefill=True),
                             run("hf-generate", 20.0, 20.0, includes_prefill=True)], runner.BenchConfig())
    by = {r["method"]: r for r in rows}
    assert by["llama.cpp"]["speedup"]["median"] == pytest.approx(1.5)
    assert by["hf-generate"]["speedup"]["median"] == pytest.approx(0.5)
    assert by["plain"]["speedup"]["median"] == 1.0
    assert by["plain"]["e2e_tokens_per_s"] == 40.0 and by["llama.cpp"]["e2e_tokens_per_s_range"] == [60.0, 60.0]
    assert runner.BenchConfig().peers == ("hf", "llama.cpp")


def test_peer_names_are_checked():
    import argparse

    from specdec.cli.bench import peer_list

    assert peer_list("hf,llama.cpp") == ["hf", "llama.cpp"] and peer_list("none") == []
    with pytest.raises(argparse.ArgumentTypeError, match="unknown peer 'vllm'"):
        peer_list("hf,vllm")


def test_multi_turn_needs_a_chat_template_and_is_skipped_without_one(tiny_dirs):
    """A base model (no chat template) cannot hold a conversation: with other tasks beside it the
    multi-turn task is skipped with a note, before anything runs; alone it is a clear error. With a
    template it runs (the first turn's answer is the target's own)."""
    notes = []
    config = runner.BenchConfig(target=str(tiny_dirs["target"]), drafters=["prompt-lookup"], tasks=["chat", "multi-turn"],
                                temperatures=[0.0], gammas=[2], prompts_per_task=1, max_new_tokens=4, dtype="float32",
                                peers=())
    rows = runner.run_bench(config, log=notes.append)
    assert {r["task"] for r in rows} == {"chat"}
    assert notes and "multi-turn" in notes[0] and "chat template" in notes[0]
    config.tasks = ["multi-turn"]
    with pytest.raises(SpecdecError, match="needs a chat template.*choose other --tasks"):
        runner.run_bench(config, log=notes.append)
    config.target = str(tiny_dirs["chat"])
    assert {r["task"] for r in runner.run_bench(config, log=notes.append)} == {"multi-turn"}


@pytest.mark.parametrize("stop", [SpecdecError("the drafter broke"), KeyboardInterrupt()])
def test_a_bench_that_stops_part_way_keeps_the_rows_it_finished(tiny_dirs, prompts_file, tmp_path, monkeypatch, capsys,
                                                                 stop):
    """An error or Ctrl-C in the second prompt's runs: the first prompt's rows are written, and the
    error is reported with where they are (exit 1; Ctrl-C 130)."""
    original = runner._run_one

    def failing(name, key, gamma, prompt, p_index, *rest):
        if p_index == 1:
            raise stop
        return original(name, key, gamma, prompt, p_index, *rest)

    monkeypatch.setattr(runner, "_run_one", failing)
    out = tmp_path / "out"
    code = main(["bench", "--target", str(tiny_dirs["target"]), "--drafter", "prompt-lookup", "--prompts",
                 str(prompts_file), "--dtype", "float32", "--temperatures", "0", "--gammas", "2", "--max-new-tokens", "6",
                 "--no-peers", "--out", str(out)])
    assert code == (130 if isinstance(stop, KeyboardInterrupt) else 1)
    assert "rows it finished are in" in capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert {r["method"] for r in rows} == {"plain", "prompt-lookup"} and all(r["prompts"] == 1 for r in rows)
    assert (out / "table.md").read_text().count("\n") == len(rows) + 4
