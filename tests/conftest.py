"""Shared fixtures. The models themselves are built in helpers.py.

Everything the tests write goes to a temporary SPECDEC_CACHE made for the run; only what is
expensive to remake and the same for every run (the built-in models' conversion, the compiled
kernels) is shared with the user's cache, by a link.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from helpers import CHARS, save_tiny_model

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here: fail fast instead of retrying


def _temporary_cache() -> None:
    from specdec.paths import cache_dir

    shared = cache_dir()
    run_cache = Path(tempfile.mkdtemp(prefix="specdec-test-cache-"))
    for name in ("models", "kernels", "gguf", "gguf-files", "gguf-tokenizers"):  # the same each run
        (shared / name).mkdir(parents=True, exist_ok=True)
        (run_cache / name).symlink_to(shared / name, target_is_directory=True)
    os.environ["SPECDEC_CACHE"] = str(run_cache)
    atexit.register(shutil.rmtree, run_cache, ignore_errors=True)


_temporary_cache()

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n 2: one core a worker, and for the CLIs it starts
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """target / draft (same tokenizer) / alien (another tokenizer, the same characters) / disjoint (a tokenizer
    sharing no token with the target's) / short (64-token context)."""
    root = tmp_path_factory.mktemp("models")
    return {
        "target": save_tiny_model(root / "target", seed=0, layers=2),
        "draft": save_tiny_model(root / "draft", seed=1, layers=1),
        "alien": save_tiny_model(root / "alien", chars=list(reversed(CHARS)), seed=2, layers=1),
        "disjoint": save_tiny_model(root / "disjoint", chars=list("ABCDEFGHIJ0123456789"), seed=6, layers=1),
        "short": save_tiny_model(root / "short", seed=3, layers=1, max_positions=64),
        "chat": save_tiny_model(root / "chat", seed=4, layers=2, chat=True),
        "long": save_tiny_model(root / "long", seed=5, layers=2, max_positions=8192, chat=True),
    }


@pytest.fixture(scope="session")
def builtin_model():
    """The built-in SmolLM2-135M in float32 (converted and cached on first use)."""
    from specdec.models import load_model

    return load_model("smollm2-135m", dtype="float32")


@pytest.fixture(scope="session")
def trained(tiny_dirs, tmp_path_factory):
    """Each kind trained for a few steps on the tiny chat target's self-distillation data."""
    import os

    from specdec.drafters.checkpoint import save_drafter
    from specdec.drafters.nets import KINDS
    from specdec.models import load_model
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
