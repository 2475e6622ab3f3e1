"""Plain greedy decoding of a user's Qwen2, Qwen3 or Mistral model on the lean backend against the transformers
backend (the path such models took before the lean backend knew them): random weights at SmolLM2-135M's
sizes (576 wide, 30 layers, 9 query and 3 KV heads of 64, FFN 1536, 49152 ids), float32, one process,
the two backends alternating, tokens per second, median (min-max) of the runs.

    .venv/bin/python docs/results/llama-family/lean_vs_transformers.py [--runs 5] [--tokens 64]
"""

import argparse
import statistics
import time

import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from specdec.backends import TransformersBackend
from specdec.backends.lean import LeanBackend
from specdec.config import SamplingParams, SpecConfig
from specdec.engine import SpeculativeEngine

SIZES = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
             num_key_value_heads=3, head_dim=64, max_position_embeddings=2048, tie_word_embeddings=True)
MODELS = {"qwen2": lambda: Qwen2ForCausalLM(Qwen2Config(**SIZES)),
          "qwen3": lambda: Qwen3ForCausalLM(Qwen3Config(**SIZES)),
          "mistral": lambda: MistralForCausalLM(MistralConfig(sliding_window=4096, **SIZES))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    torch.manual_seed(0)
    prompt = torch.randint(0, SIZES["vocab_size"], (100,)).tolist()
    spec = SpecConfig(gamma=0, max_new_tokens=args.tokens, stop_at_eos=False)
    for name, make in MODELS.items():
        model = make().eval()
        engines = {"lean": SpeculativeEngine(LeanBackend(model)), "transformers": SpeculativeEngine(TransformersBackend(model))}
        rates: dict[str, list[float]] = {k: [] for k in engines}
        outputs = {}
        for _ in range(args.runs + 1):  # the first round warms up
            for key, engine in engines.items():
                start = time.perf_counter()
                run = engine.generate(prompt, SamplingParams(), spec).run()
                rates[key].append(len(run.tokens) / (time.perf_counter() - start))
                outputs[key] = run.tokens
        same = sum(a == b for a, b in zip(outputs["lean"], outputs["transformers"]))
        summary = {k: f"{statistics.median(v[1:]):.1f} ({min(v[1:]):.1f}-{max(v[1:]):.1f})" for k, v in rates.items()}
        ratio = [a / b for a, b in zip(rates["lean"][1:], rates["transformers"][1:])]
        print(f"{name}: lean {summary['lean']} tok/s, transformers {summary['transformers']} tok/s, lean / transformers "
              f"{statistics.median(ratio):.2f}x ({min(ratio):.2f}-{max(ratio):.2f}); "
              f"greedy tokens equal {same}/{len(outputs['lean'])}", flush=True)


if __name__ == "__main__":
    main()
