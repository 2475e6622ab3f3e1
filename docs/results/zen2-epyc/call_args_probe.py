"""What passing stack_steps' arguments costs, without its work: an inline extension whose function takes the
same argument types and returns at once, called with a SmolLM2 pass's shapes (one sequence, 30 layers), the
signature before commit d6299dc against the one after (the caches as one bound object, the model's shapes
and layer layout held by LayerStack). us a call, means of 3000.

    .venv/bin/python docs/results/zen2-epyc/call_args_probe.py
"""

import time

import torch
from torch.utils.cpp_extension import load_inline

SOURCE = r"""
#include <torch/extension.h>
struct Caches { std::vector<torch::Tensor> k, v; };
int64_t before(torch::Tensor h, const std::vector<torch::Tensor>& cos, const std::vector<torch::Tensor>& sin,
               const std::vector<int64_t>& rope_of, const std::vector<std::vector<torch::Tensor>>& k,
               const std::vector<std::vector<torch::Tensor>>& v, const std::vector<int64_t>& starts,
               const std::vector<std::vector<int64_t>>& los, const std::vector<std::vector<torch::Tensor>>& visibles,
               const std::vector<int64_t>& window_of, const std::vector<int64_t>& rows, const std::vector<bool>& prompts,
               int64_t n_heads, int64_t n_kv, int64_t hd, double eps, double scale, bool gemma, bool int8,
               const std::vector<int64_t>& taps) {
  return static_cast<int64_t>(k.size());
}
int64_t after(torch::Tensor h, const std::vector<torch::Tensor>& cos, const std::vector<torch::Tensor>& sin,
              const std::vector<std::shared_ptr<Caches>>& caches, const std::vector<int64_t>& starts,
              const std::vector<std::vector<int64_t>>& los, const std::vector<std::vector<torch::Tensor>>& visibles,
              const std::vector<int64_t>& rows, const std::vector<bool>& prompts, const std::vector<int64_t>& taps) {
  return static_cast<int64_t>(caches.size());
}
std::shared_ptr<Caches> make(std::vector<torch::Tensor> k, std::vector<torch::Tensor> v) {
  return std::make_shared<Caches>(Caches{std::move(k), std::move(v)});
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<Caches, std::shared_ptr<Caches>>(m, "Caches");
  m.def("before", &before);
  m.def("after", &after);
  m.def("make", &make);
}
"""


def per_call(f, n: int = 3000) -> float:
    for _ in range(50):
        f()
    start = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    module = load_inline("specdec_call_args_probe", cpp_sources=SOURCE)
    h, cos, sin = torch.randn(1, 576), [torch.randn(1, 64)], [torch.randn(1, 64)]
    k = [torch.zeros(3, 256, 64) for _ in range(30)]
    v = [torch.zeros(3, 256, 64) for _ in range(30)]
    visibles = [[torch.empty(0, dtype=torch.bool)]]
    caches = module.make(k, v)
    before = per_call(lambda: module.before(h, cos, sin, [0] * 30, [k], [v], [200], [[0]], visibles, [0] * 30, [1],
                                            [False], 9, 3, 64, 1e-5, 0.125, False, True, []))
    after = per_call(lambda: module.after(h, cos, sin, [caches], [200], [[0]], visibles, [1], [False], []))
    print(f"stack_steps' arguments alone: before {before:.1f} us a call, after {after:.1f} us")


if __name__ == "__main__":
    main()
