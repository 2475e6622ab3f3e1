// Row-wise float32 ops of the lean backend's ATen path, one call each (built on first use by rowops.py);
// the ops themselves are in rowops.h.

#include "rowops.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("supported", &rowops_supported, "whether this CPU has AVX2 and FMA");
  m.def("rms_norm", &rms_norm, "float32 RMSNorm of each row", py::arg("x"), py::arg("weight"), py::arg("eps"));
  m.def("qk_rope_", &qk_rope_, "in place on fused QKV rows: optional q/k RMSNorms, then RoPE on q and k");
  m.def("attend", &attend, "write new keys/values into the cache, then masked attention over it");
  m.def("set_wide_lanes", &set_wide_lanes, "attend's values on AVX-512 (where the CPU has it) or AVX2 lanes; "
        "returns the previous setting (the results are the same: for tests)", py::arg("wide"));
  m.def("act_mul", &act_mul, "silu(gate) * up, or gelu_tanh(gate) * up, of rows [gate | up]", py::arg("gu"),
        py::arg("gelu"));
}
