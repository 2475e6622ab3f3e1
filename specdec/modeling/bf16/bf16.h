// What kernels.cpp's bfloat16 sources share: the AVX-512 BF16 helpers (loads, rounding, masks), the
// argument checks, and the two products bf16/products.cpp defines (`linear` on weights in their natural
// layout, `linear_tiles` on weights packed for AMX tiles), which kernels.cpp binds.

#pragma once

#include <torch/extension.h>
#include <immintrin.h>

#include <cstdint>

#define SPECDEC_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))
#define SPECDEC_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

namespace specdec::bf16_ops {

using bf16 = at::BFloat16;

inline float round_bf16(float v) { return static_cast<float>(bf16(v)); }

SPECDEC_AVX512 inline __m512bh load_bf16(const bf16* p, __mmask32 mask) {
  return (__m512bh)_mm512_maskz_loadu_epi16(mask, p);
}

SPECDEC_AVX512 inline __m512 widen(const bf16* p, __mmask16 mask) {  // 16 bf16 -> 16 fp32
  __m256i raw = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}

SPECDEC_AVX512 inline __m256i to_bf16(__m512 x) {  // round to nearest even, as c10::BFloat16(float)
  return (__m256i)_mm512_cvtneps_pbh(x);
}

SPECDEC_AVX512 inline __m512 rounded(__m512 x) {  // x rounded to bf16, back in fp32
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(to_bf16(x)), 16));
}

inline __mmask32 mask32(int64_t left) { return left >= 32 ? ~__mmask32(0) : ((__mmask32(1) << left) - 1); }
inline __mmask16 mask16(int64_t left) { return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1); }

inline void check_bf16(const at::Tensor& t, const char* name, int64_t dims) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kBFloat16, name, " must be a bfloat16 CPU tensor");
  TORCH_CHECK(t.dim() == dims && t.is_contiguous(), name, " must be a contiguous ", dims, "-d tensor");
}

// x (M, K) @ w (N, K).T [+ residual (M, N)] -> (M, N) bf16 on AVX-512 BF16 dot products; the product is
// rounded to bf16 before the residual add, as `h + linear(x)` does in bf16.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& residual);

// Whether this CPU and kernel run AMX bf16 tiles.
bool amx_permitted();

// This thread's eight tiles as rows of 64 bytes: 16 rows, tiles 0-3 `first_rows` (a product of fewer
// than 16 rows of x reads them in place).
SPECDEC_AMX void configure_tiles(int first_rows = 16);

// w (N, K) bf16 -> the tile layout linear_tiles reads.
at::Tensor pack_tiles(const at::Tensor& w);

// x (M, K) @ w.T [+ residual] for w packed by pack_tiles from an (N, K) matrix; rounding as linear().
at::Tensor linear_tiles(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                        const c10::optional<at::Tensor>& residual);

}  // namespace specdec::bf16_ops
