// F16 and BF16 matrices (a GGUF file's unquantised weights) times float32 activations: each weight widened
// to float32 in registers (F16C's vcvtph2ps; a bfloat16 by a 16-bit shift, exactly), eight lanes of FMAs
// over the inputs in order, then one horizontal sum. Every (row, output) is that one sequence of
// operations whatever else shares the call, so a row's result does not depend on how many rows are
// multiplied together (speculative and plain decoding stay token for token equal). A step reads 2 bytes a
// weight instead of the 4 of a float32 copy.

#include "formats.h"

namespace specdec::blocks {
namespace {

constexpr int64_t kColumnRun = 64;  // output rows a thread's run takes at a time: their weights stay in L2

template <bool BF16>
SPECDEC_AVX2 inline __m256 widen8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

// out[m0 + r][n] = x[m0 + r] . w[n] for r < R: weight vector j (weights 8j .. 8j + 7) joins chain j % 4
// of each row's sum (four chains, so no sum waits on its last FMA), then (c0 + c1) + (c2 + c3) and one
// horizontal sum. A weight row is read once for the R rows, in order: one stream a thread (rows of
// weights 2K bytes apart, read side by side, fell into the same L1 sets at K = 2048).
template <bool BF16, int R>
SPECDEC_AVX2 void tile(const float* x, const uint16_t* w, float* out, int64_t K, int64_t N, int64_t m0, int64_t n) {
  const float* xr = x + m0 * K;
  const uint16_t* row = w + n * K;
  __m256 acc[R][4];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m256 wv[4];
    for (int c = 0; c < 4; ++c) wv[c] = widen8<BF16>(row + k + 8 * c);
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + r * K + k + 8 * c), wv[c], acc[r][c]);
  }
  for (int c = 0; k < K; k += 8, ++c) {  // the last K % 32 weights: chains 0, 1, 2 in turn
    const __m256 wv = widen8<BF16>(row + k);
    for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(_mm256_loadu_ps(xr + r * K + k), wv, acc[r][c]);
  }
  for (int r = 0; r < R; ++r)
    out[(m0 + r) * N + n] = hsum(_mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3])));
}

template <bool BF16>
void matmul(const float* x, const uint16_t* w, float* out, int64_t M, int64_t K, int64_t N) {
  at::parallel_for(0, (N + kColumnRun - 1) / kColumnRun, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t n0 = c * kColumnRun, n1 = std::min(N, n0 + kColumnRun);
      int64_t m = 0;
      for (; m + 2 <= M; m += 2)
        for (int64_t n = n0; n < n1; ++n) tile<BF16, 2>(x, w, out, K, N, m, n);
      if (m < M)
        for (int64_t n = n0; n < n1; ++n) tile<BF16, 1>(x, w, out, K, N, m, n);
    }
  });
}

}  // namespace

void half_matmul(int64_t kind, const float* x, const uint16_t* w, float* out, int64_t M, int64_t K, int64_t N) {
  TORCH_CHECK(kind == F16 || kind == BF16, "half_matmul takes F16 or BF16 weights");
  TORCH_CHECK(K % 8 == 0, "F16 and BF16 rows must hold a multiple of 8 weights");
  if (kind == BF16)
    matmul<true>(x, w, out, M, K, N);
  else
    matmul<false>(x, w, out, M, K, N);
}

}  // namespace specdec::blocks
