"""The command line: bad input gets a clear message and a non-zero exit, never a traceback."""

import json
import subprocess
import sys

import pytest

from specdec.cli import main


def run_cli(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec", *args], capture_output=True, text=True,
                          input=stdin, timeout=600)


def assert_clean_error(proc, *needles):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr


def test_generate_tiny_model_json(tiny_dirs):
    proc = run_cli("generate", "abc abc ab", "--target", str(tiny_dirs["target"]), "--no-chat", "--dtype", "float32",
                   "--max-new-tokens", "12", "--gamma", "3", "--compare", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["identical"] is True
    assert len(out["token_ids"]) <= 12
    assert out["stats"]["drafter"] == "prompt-lookup-tree"  # float32: no kernel fast path, so trees
    assert out["baseline"]["stats"]["drafter"] == "none"
    for field in ("alpha", "tau", "c", "target_calls", "drafted", "accepted", "acceptance_by_position", "predicted_speedup"):
        assert field in out["stats"]


@pytest.mark.parametrize("kind", ["mistral", "qwen2", "qwen3"])
def test_generate_runs_llama_family_models_on_the_lean_path(tmp_path, capsys, kind):
    """A user's Mistral, Qwen2 or Qwen3 directory: the lean backend, exact at T = 0."""
    from helpers import save_tiny_model

    directory = save_tiny_model(tmp_path / kind, kind=kind, seed=1)
    assert main(["generate", "abc abc ab", "--target", str(directory), "--no-chat", "--dtype", "float32",
                 "--max-new-tokens", "12", "--gamma", "3", "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["identical"] is True and out["stats"]["path"] == "lean"


def test_generate_with_draft_model_streams_text_and_summary(tiny_dirs):
    proc = run_cli("generate", "the cat sat", "--target", str(tiny_dirs["target"]), "--drafter",
                   f"model:{tiny_dirs['draft']}", "--no-chat", "--dtype", "float32", "--max-new-tokens", "10",
                   "--temperature", "0.8", "--seed", "1")
    assert proc.returncode == 0, proc.stderr
    assert "tokens in" in proc.stderr and "drafter model:draft" in proc.stderr


def test_generate_with_a_draft_model_of_another_tokenizer(tiny_dirs, capsys):
    """model:DIR whose tokenizer numbers the same characters otherwise: it drafts through the vocabularies'
    intersection, the output is plain decoding's, and the summary says how much it can propose."""
    assert main(["generate", "the cat sat", "--target", str(tiny_dirs["target"]), "--drafter",
                 f"model:{tiny_dirs['alien']}", "--no-chat", "--dtype", "float32", "--max-new-tokens", "12",
                 "--gamma", "3", "--compare"]) == 0
    err = capsys.readouterr().err
    assert "drafter model:alien (proposes 96.8% of the target's vocabulary)" in err  # 30 of 31: not <eos>
    assert "outputs identical: yes" in err


@pytest.mark.parametrize("args,needles", [
    (["generate", ""], ["prompt is empty"]),
    (["generate", "   "], ["prompt is empty"]),
    (["generate", "hi", "--temperature", "-1"], ["temperature"]),
    (["generate", "hi", "--top-p", "0"], ["top-p"]),
    (["generate", "hi", "--top-p", "1.5"], ["top-p"]),
    (["generate", "hi", "--target", "no-such-model-xyz"], ["cannot load model 'no-such-model-xyz'", "smollm2-135m"]),
    (["generate", "hi", "--target", "/no/such/dir"], ["does not exist"]),
    (["generate", "hi", "--drafter", "ngram"], ["ngram:FILE.npz"]),
    (["generate", "hi", "--drafter", "model"], ["model:NAME_OR_DIR"]),
    (["generate", "hi", "--drafter", "model:"], ["after the colon"]),
    (["generate", "hi", "--drafter", "prompt-lookup:x"], ["takes no argument"]),
    (["generate", "hi", "--drafter", "magic"], ["unknown drafter 'magic'", "model:NAME_OR_DIR"]),
    (["generate", "hi", "--dtype", "int3"], ["dtype"]),
])
def test_bad_input_is_a_clear_error(tiny_dirs, capsys, args, needles):
    """In process (an escaping exception fails the test): exit code 1 and a message naming the problem."""
    if "--target" not in args:
        args = args + ["--target", str(tiny_dirs["target"]), "--no-chat"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: ")
    for needle in needles:
        assert needle in err


@pytest.mark.parametrize("args,needles", [
    (["generate", "abcdefgh " * 20, "--target", "{short}", "--no-chat"], ["context holds 64"]),
    (["generate", "abc", "--target", "{target}", "--no-chat", "--drafter", "model:{disjoint}"],
     ["shares no token", "disjoint"]),
    (["generate", "abc", "--target", "{target}", "--chat"], ["no chat template"]),
])
def test_bad_setup_is_a_clear_error(tiny_dirs, capsys, args, needles):
    assert main([a.format(**tiny_dirs) for a in args]) == 1
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err


def test_unknown_model_from_a_real_process_has_no_traceback():
    assert_clean_error(run_cli("generate", "hi", "--target", "no-such-model-xyz"), "cannot load model")


def test_bad_flag_value_is_an_argparse_error():
    proc = run_cli("generate", "hi", "--gamma", "lots")
    assert_clean_error(proc, "gamma")
    assert proc.returncode == 2


@pytest.mark.parametrize("value", ["-2", "1.5"])
def test_negative_gamma_is_refused(capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "hi", "--gamma", value])
    assert exc.value.code == 2
    assert "gamma" in capsys.readouterr().err


@pytest.mark.parametrize("args,needles", [
    (["bench", "--no-peers", "--out", "{file}"], ["--out {file} is a file, not a directory"]),
    (["bench", "--no-peers", "--prompts-per-task", "0"], ["--prompts-per-task and --max-new-tokens must be at least 1"]),
    (["bench", "--no-peers", "--max-new-tokens", "-5"], ["--prompts-per-task and --max-new-tokens must be at least 1"]),
    (["train-drafter", "--kind", "eagle", "--out", "{file}"], ["--out {file} is a file, not a directory"]),
    (["train-drafter", "--kind", "eagle", "--out", "{file}/drafter"], ["cannot create --out {file}/drafter", "Not a directory"]),
    (["export-drafter", "{shipped}", "--out", "{file}"], ["--out {file} is a file, not a directory"]),
    (["ngram", "fit", "--corpus", "man", "--out", "{file}/table.npz"], ["{file} is a file, not a directory"]),
    (["ngram", "fit", "--corpus", "man", "--out", "{tmp}"], ["is a directory: give the path of a file"]),
])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path, capsys, args, needles):
    """Minutes of benchmarking, training or fitting must not end in a traceback because --out cannot be written:
    the path is checked (and its directory made) before any model loads."""
    from specdec.drafters import shipped_drafter

    blocker = tmp_path / "a-file"
    blocker.write_text("the user's file\n")
    names = dict(file=blocker, tmp=tmp_path, shipped=shipped_drafter("smollm2-135m"))
    assert main([a.format(**names) for a in args]) == 1
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: ")
    for needle in needles:
        assert needle.format(**names) in err
    assert blocker.read_text() == "the user's file\n"  # nothing the user had is lost


@pytest.mark.parametrize("value", ["99999", "0", "-1", "http"])
def test_a_port_out_of_range_is_an_argparse_error(capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--port", value])
    assert exc.value.code == 2
    assert "a port is a whole number from 1 to 65535" in capsys.readouterr().err


def test_a_port_in_use_is_a_clear_error_before_the_model_loads(capsys):
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert main(["serve", "--port", str(port), "--target", "no-such-model-xyz"]) == 1  # would fail on loading
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "choose another --port" in err


def test_a_host_that_does_not_resolve_is_a_clear_error(capsys):
    assert main(["serve", "--host", "999.1.1.1", "--target", "no-such-model-xyz"]) == 1
    assert "--host '999.1.1.1' is not an address to listen on" in capsys.readouterr().err
