// Row-wise float32 ops of the lean backend's ATen path, one call each (built on first use by rowops.py).
//
// On a CPU without kernels.cpp (no AVX-512 BF16) a decode step is ~25 small ATen ops a layer, and each
// costs 3-5 us of dispatch whatever its size: an RMSNorm of one 576-wide row ~25 us, RoPE on q and k
// ~40 us, more than their arithmetic by two orders of magnitude. These do the same arithmetic in one
// call:
//
//   rms_norm   y = (x / sqrt(mean(x^2) + eps)) * w per row (Llama's and, with w = 1 + weight, Gemma's
//              float32 RMSNorm);
//   qk_rope_   in place on a fused QKV block: Gemma's per-head q/k RMSNorms, then RoPE on every q and
//              k head (x cos + rotate_half(x) sin, sin holding rotate_half's sign).
//
// Each row's arithmetic depends on that row alone, so results do not depend on how many rows a pass
// holds, and speculative, batched and plain decoding stay token for token equal.

#include <torch/extension.h>
#include <immintrin.h>

#include <cmath>

#define SPECDEC_AVX2 __attribute__((target("avx2,fma")))

namespace {

SPECDEC_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[i] = (x[i] * r) * w[i], r = 1 / sqrt(mean(x^2) + eps); n a multiple of 8.
SPECDEC_AVX2 void norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  __m256 ss = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    ss = _mm256_fmadd_ps(v, v, ss);
  }
  const __m256 r = _mm256_set1_ps(1.f / std::sqrt(hsum(ss) / static_cast<float>(n) + eps));
  for (int64_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), r), _mm256_loadu_ps(w + i)));
}

// x (hd) <- x * cos + rotate_half(x) * sin, rotate_half(x) = (x[half:], x[:half]); hd a multiple of 16.
SPECDEC_AVX2 void rope_head(float* x, const float* cos, const float* sin, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < half; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + half + i);
    const __m256 lo = _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(cos + i)),
                                    _mm256_mul_ps(b, _mm256_loadu_ps(sin + i)));
    const __m256 hi = _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(cos + half + i)),
                                    _mm256_mul_ps(a, _mm256_loadu_ps(sin + half + i)));
    _mm256_storeu_ps(x + i, lo);
    _mm256_storeu_ps(x + half + i, hi);
  }
}

bool supported() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
  const int64_t n = x.size(-1);
  TORCH_CHECK(weight.numel() == n && n % 8 == 0, "weight must have the rows' width, a multiple of 8");
  torch::Tensor flat = x.reshape({-1, n}).contiguous(), w = weight.contiguous();
  torch::Tensor out = torch::empty_like(flat);
  const float* xp = flat.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  for (int64_t r = 0; r < flat.size(0); ++r) norm_row(xp + r * n, wp, yp + r * n, n, static_cast<float>(eps));
  return out.view(x.sizes());
}

// qkv (T, (n_heads + 2 n_kv) hd) contiguous; cos, sin (T, hd). q_norm/k_norm: (hd) or empty.
void qk_rope_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t n_heads, int64_t n_kv, int64_t hd,
              torch::Tensor q_norm, torch::Tensor k_norm, double eps) {
  TORCH_CHECK(qkv.scalar_type() == torch::kFloat32 && qkv.is_contiguous(), "qkv: contiguous float32");
  TORCH_CHECK(hd % 16 == 0, "head_dim must be a multiple of 16");
  const int64_t width = (n_heads + 2 * n_kv) * hd;
  TORCH_CHECK(qkv.size(-1) == width, "qkv rows hold ", qkv.size(-1), " values, expected ", width);
  const int64_t T = qkv.numel() / width;
  torch::Tensor c = cos.reshape({-1, hd}).contiguous(), s = sin.reshape({-1, hd}).contiguous();
  TORCH_CHECK(c.size(0) == T && s.size(0) == T, "cos and sin need one row per position");
  const bool norms = q_norm.numel() > 0;
  torch::Tensor qn = norms ? q_norm.contiguous() : q_norm, kn = norms ? k_norm.contiguous() : k_norm;
  float* base = qkv.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    float* row = base + t * width;
    for (int64_t h = 0; h < n_heads + n_kv; ++h) {
      float* head = row + h * hd;
      if (norms) norm_row(head, (h < n_heads ? qn : kn).data_ptr<float>(), head, hd, static_cast<float>(eps));
      rope_head(head, c.data_ptr<float>() + t * hd, s.data_ptr<float>() + t * hd, hd);
    }
  }
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("supported", &supported, "whether this CPU has AVX2 and FMA");
  m.def("rms_norm", &rms_norm, "float32 RMSNorm of each row", py::arg("x"), py::arg("weight"), py::arg("eps"));
  m.def("qk_rope_", &qk_rope_, "in place on fused QKV rows: optional q/k RMSNorms, then RoPE on q and k");
}
