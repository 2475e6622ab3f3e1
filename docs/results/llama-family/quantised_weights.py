"""`--weights q8_0` / `q4_0` on a user's model: plain greedy decoding of random Llama and Qwen2 models at
SmolLM2-135M's sizes (576 wide, 30 layers, 9 query and 3 KV heads of 64, FFN 1536, 49152 ids) or, with
`--shape qwen2.5-0.5b`, Qwen2.5-0.5B's (896 wide, 24 layers, 14 and 2 heads, FFN 4864, 151936 ids) on the lean
backend, float32 weights against the same weights quantised at load to Q8_0 and Q4_0 blocks (int8
activations), tokens per second, median (min-max) of the runs, the three alternating in one process; and
the time the quantisation takes.

    .venv/bin/python docs/results/llama-family/quantised_weights.py [--runs 5] [--tokens 64] [--shape qwen2.5-0.5b]
        [--models llama,qwen2]
"""

import argparse
import statistics
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specdec.backends.gguf import QuantisedWeights
from specdec.backends.lean import LeanBackend
from specdec.config import SamplingParams, SpecConfig
from specdec.engine import SpeculativeEngine

SHAPES = {"smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=2048,
                                tie_word_embeddings=True),
          "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                               num_attention_heads=14, num_key_value_heads=2, head_dim=64, max_position_embeddings=32768,
                               tie_word_embeddings=True)}
MODELS = {"llama": lambda sizes: LlamaForCausalLM(LlamaConfig(**sizes)),
          "qwen2": lambda sizes: Qwen2ForCausalLM(Qwen2Config(**sizes))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--shape", choices=list(SHAPES), default="smollm2-135m",
                        help="the sizes of the random models (qwen2.5-0.5b: Qwen2.5-0.5B's)")
    parser.add_argument("--models", default="llama,qwen2", help="which of llama, qwen2 (comma-separated)")
    args = parser.parse_args()
    sizes = SHAPES[args.shape]
    torch.manual_seed(0)
    prompt = torch.randint(0, sizes["vocab_size"], (100,)).tolist()
    spec = SpecConfig(gamma=0, max_new_tokens=args.tokens, stop_at_eos=False)
    for name in args.models.split(","):
        model = MODELS[name](sizes).eval()
        engines = {"float32": SpeculativeEngine(LeanBackend(model))}
        for kind in ("Q8_0", "Q4_0"):
            start = time.perf_counter()
            weights = QuantisedWeights(model, kind)
            seconds = time.perf_counter() - start
            backend = LeanBackend(model, gguf=weights, int8_activations=True)
            print(f"{name}: quantised to {kind} in {seconds:.1f} s ({backend.path})", flush=True)
            engines[kind] = SpeculativeEngine(backend)
        rates: dict[str, list[float]] = {k: [] for k in engines}
        for _ in range(args.runs + 1):  # the first round warms up
            for key, engine in engines.items():
                start = time.perf_counter()
                run = engine.generate(prompt, SamplingParams(), spec).run()
                rates[key].append(len(run.tokens) / (time.perf_counter() - start))
        for key, values in rates.items():
            ratio = [a / b for a, b in zip(values[1:], rates["float32"][1:])]
            print(f"{name} {key}: {statistics.median(values[1:]):.1f} ({min(values[1:]):.1f}-{max(values[1:]):.1f}) tok/s, "
                  f"{statistics.median(ratio):.2f}x float32 ({min(ratio):.2f}-{max(ratio):.2f})", flush=True)


if __name__ == "__main__":
    main()
