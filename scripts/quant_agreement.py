"""How far a built-in target on its GGUF blocks agrees with the same target on its dequantised float
weights: greedy tokens until the first difference, and perplexity on held-out text, for the float path,
the blocks with float32 activations (`--weights gguf`) and with int8 activations (`--weights gguf-int8`),
and the float weights quantised at load as `--weights q8_0` and `q4_0` quantise a user's model, plus one
decode step's time on each.

    .venv/bin/python scripts/quant_agreement.py [--target smollm2-135m] [--prompts 8] [--tokens 128]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from specdec.backends import make_backend
from specdec.backends.gguf import QuantisedWeights
from specdec.config import QUANTISED_WEIGHTS, SamplingParams, SpecConfig
from specdec.decoding.engine import SpeculativeEngine
from specdec.models import load_model
from specdec.tasks.corpus import man_pages
from specdec.tasks.prompts import task_prompts


def greedy(backend, ids: list[int], tokens: int, eos: set[int]) -> list[int]:
    backend.reset()
    run = SpeculativeEngine(backend, None, eos).generate(ids, SamplingParams(), SpecConfig(gamma=0, max_new_tokens=tokens))
    return run.run().tokens


@torch.inference_mode()
def perplexity(backend, ids: list[int], chunk: int = 256) -> float:
    """exp(mean negative log-likelihood) of ids[1:], the text fed in chunks of `chunk` positions."""
    backend.reset()
    nll, count = 0.0, 0
    for start in range(0, len(ids) - 1, chunk):
        piece = ids[start : min(start + chunk, len(ids) - 1)]
        logits = backend.forward(torch.tensor(piece)).double()
        targets = torch.tensor(ids[start + 1 : start + 1 + len(piece)])
        nll -= torch.log_softmax(logits, -1).gather(1, targets[:, None]).sum().item()
        count += len(piece)
    return math.exp(nll / count)


def step_ms(backend, ids: list[int], repeats: int = 30) -> float:
    backend.reset()
    backend.forward(torch.tensor(ids))
    length, times = backend.length, []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.forward(torch.tensor(ids[-1:]))
        times.append(time.perf_counter() - start)
        backend.rollback(length)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--ppl-pages", type=int, default=4, help="man pages of held-out text (~1500 tokens each)")
    args = parser.parse_args()
    loaded = load_model(args.target, "float32")
    eos = loaded.eos_token_ids
    paths = {"float": make_backend(loaded.model, "lean"),
             "gguf": make_backend(loaded.model, "lean", gguf=loaded.gguf),
             "gguf-int8": make_backend(loaded.model, "lean", gguf=loaded.gguf, int8_activations=True),
             **{choice: make_backend(loaded.model, "lean", gguf=QuantisedWeights(loaded.model, kind), int8_activations=True)
                for choice, kind in QUANTISED_WEIGHTS.items()}}
    prompts = [p for task in ("chat", "code", "summarise", "translate")
               for p in task_prompts(task, max(1, args.prompts // 4), seed=11)]
    reference = {}
    print(f"{args.target}: greedy answers against the float path's ({len(prompts)} prompts, up to {args.tokens} "
          "new tokens): how many are identical, and where the others first differ")
    for name, backend in paths.items():
        first = []
        for prompt in prompts:
            ids = loaded.encode(prompt.text)
            out = greedy(backend, ids, args.tokens, eos)
            if name == "float":
                reference[prompt.text] = out
            ref = reference[prompt.text]
            same = out == ref
            first.append(None if same else next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b),
                                                min(len(out), len(ref))))
        differ = [i for i in first if i is not None]
        print(f"  {name:10s} identical {first.count(None)}/{len(first)}; first difference at token {sorted(differ)}")
    pages = [text for _, text in man_pages(args.ppl_pages, seed=5)]
    texts = [loaded.tokenizer(text, add_special_tokens=False)["input_ids"][:2048] for text in pages]
    print(f"perplexity on {len(texts)} man pages ({sum(map(len, texts))} tokens), and one decode step")
    for name, backend in paths.items():
        ppl = statistics.mean(perplexity(backend, ids) for ids in texts)
        print(f"  {name:10s} perplexity {ppl:.4f}  step {step_ms(backend, texts[0][:64]):.1f} ms")


if __name__ == "__main__":
    main()
