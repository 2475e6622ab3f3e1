// The bfloat16 products: x @ w.T on AVX-512 BF16 dot products (weights in their natural layout) and on
// AMX tiles (weights packed once at load). Declared in bf16.h, bound by kernels.cpp.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>

#include "bf16.h"
#include "../amx.h"  // TileConfig, tiles_in_use, restore_tiles, amx_granted

namespace specdec::bf16_ops {
namespace {

constexpr int64_t kPrefetchRows = 16;  // dot_tile fetches the weights this many rows ahead

// out[m * NT + n] = sum_k x[m, k] * w[n, k] for an MT x NT tile; w rows are contiguous (stride K).
// vdpbf16ps multiplies bf16 pairs exactly and sums in fp32; only the order of the sum differs from
// oneDNN's. (fp32 FMAs on weights widened by shift/mask were measured too: as fast at one row,
// slower from five rows on.)
template <int MT, int NT>
SPECDEC_AVX512 void dot_tile(const bf16* x, int64_t ldx, const bf16* w, int64_t K, float* out) {
  __m512 acc[MT][NT];
  for (int m = 0; m < MT; ++m)
    for (int n = 0; n < NT; ++n) acc[m][n] = _mm512_setzero_ps();
  // The weights stream from memory once: fetch the lines kPrefetchRows rows ahead of these
  // (measured: one step's matrices take 13 ms instead of 20 without it).
  const bf16* ahead = w + kPrefetchRows * K;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    __m512bh wv[NT];
    for (int n = 0; n < NT; ++n) {
      _mm_prefetch(reinterpret_cast<const char*>(ahead + n * K + k), _MM_HINT_T0);
      wv[n] = (__m512bh)_mm512_loadu_si512(w + n * K + k);
    }
    for (int m = 0; m < MT; ++m) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x + m * ldx + k);
      for (int n = 0; n < NT; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, wv[n]);
    }
  }
  if (k < K) {  // a last partial chunk, zero-filled
    const __mmask32 mask = mask32(K - k);
    __m512bh wv[NT];
    for (int n = 0; n < NT; ++n) wv[n] = load_bf16(w + n * K + k, mask);
    for (int m = 0; m < MT; ++m) {
      const __m512bh xv = load_bf16(x + m * ldx + k, mask);
      for (int n = 0; n < NT; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], xv, wv[n]);
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int n = 0; n < NT; ++n) out[m * NT + n] = _mm512_reduce_add_ps(acc[m][n]);
}

using TileFn = void (*)(const bf16*, int64_t, const bf16*, int64_t, float*);

// Tiles up to 4 x 4 for 1-4 rows (decode), up to 8 x 2 for more (verification): at most 16
// accumulators, so nothing spills, and each weight row is read from memory once per call.
template <int NT>
TileFn tile_for(int64_t mt) {
  if constexpr (NT == 4) {
    switch (mt) {
      case 1: return dot_tile<1, 4>;
      case 2: return dot_tile<2, 4>;
      case 3: return dot_tile<3, 4>;
      default: return dot_tile<4, 4>;
    }
  } else {
    switch (mt) {
      case 1: return dot_tile<1, NT>;
      case 2: return dot_tile<2, NT>;
      case 3: return dot_tile<3, NT>;
      case 4: return dot_tile<4, NT>;
      case 5: return dot_tile<5, NT>;
      case 6: return dot_tile<6, NT>;
      case 7: return dot_tile<7, NT>;
      default: return dot_tile<8, NT>;
    }
  }
}

// The residual's data (nullptr for none), checked to be (M, N) bf16.
const bf16* residual_rows(const c10::optional<at::Tensor>& residual, int64_t M, int64_t N) {
  if (!residual.has_value()) return nullptr;
  check_bf16(*residual, "residual", 2);
  TORCH_CHECK(residual->size(0) == M && residual->size(1) == N, "residual must be (M, N)");
  return residual->data_ptr<bf16>();
}

}  // namespace

// x (M, K) @ w (N, K).T [+ residual (M, N)] -> (M, N) bf16. Rounds the product to bf16 before the
// residual add, as `h + linear(x)` does in bf16.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& residual) {
  check_bf16(x, "x", 2);
  check_bf16(w, "w", 2);
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K, "x has ", K, " columns but w has ", w.size(1));
  const bf16* res = residual_rows(residual, M, N);
  at::Tensor out = at::empty({M, N}, x.options());
  const bf16* xp = x.data_ptr<bf16>();
  const bf16* wp = w.data_ptr<bf16>();
  bf16* op = out.data_ptr<bf16>();
  const int64_t NT = M <= 4 ? 4 : 2, MT = M <= 4 ? 4 : 8;
  const int64_t blocks = (N + NT - 1) / NT;
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    float tile[8 * 4];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n0 = b * NT, nt = std::min(NT, N - n0);
      for (int64_t m0 = 0; m0 < M; m0 += MT) {
        const int64_t mt = std::min(MT, M - m0);
        if (nt == NT) {
          (NT == 4 ? tile_for<4>(mt) : tile_for<2>(mt))(xp + m0 * K, K, wp + n0 * K, K, tile);
        } else {
          for (int64_t n = 0; n < nt; ++n) {
            float column[8];
            tile_for<1>(mt)(xp + m0 * K, K, wp + (n0 + n) * K, K, column);
            for (int64_t m = 0; m < mt; ++m) tile[m * NT + n] = column[m];
          }
        }
        for (int64_t m = 0; m < mt; ++m)
          for (int64_t n = 0; n < nt; ++n) {
            float v = tile[m * NT + n];
            const int64_t at = (m0 + m) * N + n0 + n;
            if (res) v = round_bf16(v) + static_cast<float>(res[at]);
            op[at] = bf16(v);
          }
      }
    }
  });
  return out;
}

// ---- AMX tiles: x @ w.T for any number of rows, on weights packed once into the tile layout ----
//
// An AMX instruction (tdpbf16ps) multiplies a 16 x 32 bf16 tile of x by a 32 x 16 tile of w.T and
// adds the products into a 16 x 16 fp32 tile: 8192 multiply-adds, where vdpbf16ps does 32. The linear
// layers then cost about what reading their weights costs up to ~32 rows (dot_tile above is bound by
// arithmetic from ~5 rows). Weights are packed at load (pack_tiles) into the layout the B operand
// loads from: per pair of 16-column blocks and per 32 columns of K, two 16 x 64-byte tiles whose row
// kk holds (w[n][2kk], w[n][2kk+1]) for n = 0..15 ("VNNI" pairs), so each pair's stream is contiguous.
//
// Row invariance: every row goes through the same tile instructions in the same order of K whatever
// the number of rows (up to 16 rows are read in place by a tile of that many rows, more are copied
// into zero-padded 16-row tiles, and a tile's rows never mix), so one row's result is the same whether
// it is multiplied alone or with 63 others (tests/test_tiles.py checks it to the bit).

namespace {

constexpr int64_t kTileK = 32;   // bf16 values of K per tile step
constexpr int64_t kTileN = 32;   // output columns per unit of work (two 16-column tiles)
constexpr int64_t kTileM = 32;   // rows per pass over a pair's weights (two 16-row tiles)
// A one-tile pass fetches the weights this many bytes ahead, across the 4 KB pages the hardware
// prefetcher stops at.
constexpr int64_t kTileAhead = 16384;

}  // namespace

SPECDEC_AMX void configure_tiles(int first_rows) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = static_cast<uint8_t>(t < 4 ? first_rows : 16);
    config.colsb[t] = 64;
  }
  asm volatile("" : : "r"(&config) : "memory");  // GCC would drop the stores ldtilecfg reads
  _tile_loadconfig(&config);
}

bool amx_permitted() { return amx_granted(false); }

// w (N, K) bf16 -> (ceil(N/32), ceil(K/32) * 1024) bf16, zero-padded.
at::Tensor pack_tiles(const at::Tensor& w) {
  check_bf16(w, "w", 2);
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t pairs = (N + kTileN - 1) / kTileN, kb = (K + kTileK - 1) / kTileK;
  at::Tensor out = at::zeros({pairs, kb * 1024}, w.options());
  const bf16* src = w.data_ptr<bf16>();
  bf16* dst = out.data_ptr<bf16>();
  at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t b = 0; b < kb; ++b)
        for (int64_t j = 0; j < 2; ++j)
          for (int64_t kk = 0; kk < 16; ++kk)
            for (int64_t n = 0; n < 16; ++n)
              for (int64_t e = 0; e < 2; ++e) {
                const int64_t row = p * kTileN + j * 16 + n, col = b * kTileK + 2 * kk + e;
                if (row < N && col < K) dst[p * kb * 1024 + (b * 2 + j) * 512 + kk * 32 + n * 2 + e] = src[row * K + col];
              }
  });
  return out;
}

namespace {

// out[m, n0..n0+cols) = acc row m (+ residual, rounding the product to bf16 first, as linear() does).
SPECDEC_AVX512 inline void store_rows(const float* acc, int64_t ld, int64_t rows, int64_t cols, int64_t m0, int64_t n0,
                                      int64_t N, const bf16* res, bf16* op) {
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t n = 0; n < cols; n += 16) {
      const __mmask16 mask = mask16(cols - n);
      const int64_t at = (m0 + m) * N + n0 + n;
      __m512 v = _mm512_maskz_loadu_ps(mask, acc + m * ld + n);
      if (res) v = _mm512_add_ps(rounded(v), widen(res + at, mask));
      _mm256_mask_storeu_epi16(op + at, mask, to_bf16(v));
    }
}

// Output column pairs p0..p1-1 of x @ w.T on one thread's tiles. x: Mp rows (whole 16-row tiles, or
// M <= 16 rows read in place) of Kp columns (a multiple of 32), `stride` bytes apart.
SPECDEC_AMX void tile_pairs(int64_t p0, int64_t p1, const bf16* xp, int64_t M, int64_t Mp, int64_t Kp, int64_t stride,
                            const bf16* wp, int64_t N, const bf16* res, bf16* op) {
  const int64_t kb = Kp / kTileK, ld = stride / 2;
  const TileConfig outer = tiles_in_use();
  configure_tiles(static_cast<int>(std::min<int64_t>(Mp, 16)));  // C tiles 0-3, A 4 (2, 3 in the one-tile loop) and 5,
                                                                 // B 6, 7 (4-7)
  alignas(64) float acc[kTileM * kTileN];
  for (int64_t p = p0; p < p1; ++p) {
    const bf16* wpair = wp + p * kb * 1024;
    for (int64_t m0 = 0; m0 < Mp; m0 += kTileM) {
      const bool two = Mp - m0 > 16;
      const bf16* x0 = xp + m0 * ld;
      _tile_zero(0);
      _tile_zero(1);
      if (!two) {  // one tile of rows: alternate two sets of tiles, so a load need not wait on the last product
        int64_t b = 0;
        for (; b + 2 <= kb; b += 2) {
          {  // the weights stream from memory once: fetch them kTileAhead bytes ahead (measured interleaved with the dot products: one-row
             // passes up to 1.4x slower than theirs in some processes without it, 2-4 % with it)
            const char* ahead = reinterpret_cast<const char*>(wpair + b * 1024) + kTileAhead;
            for (int line = 0; line < 4096; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
          }
          _tile_loadd(4, wpair + b * 1024, 64);
          _tile_loadd(5, wpair + b * 1024 + 512, 64);
          _tile_loadd(2, x0 + b * kTileK, stride);
          _tile_dpbf16ps(0, 2, 4);
          _tile_dpbf16ps(1, 2, 5);
          _tile_loadd(6, wpair + (b + 1) * 1024, 64);
          _tile_loadd(7, wpair + (b + 1) * 1024 + 512, 64);
          _tile_loadd(3, x0 + (b + 1) * kTileK, stride);
          _tile_dpbf16ps(0, 3, 6);
          _tile_dpbf16ps(1, 3, 7);
        }
        if (b < kb) {
          _tile_loadd(4, wpair + b * 1024, 64);
          _tile_loadd(5, wpair + b * 1024 + 512, 64);
          _tile_loadd(2, x0 + b * kTileK, stride);
          _tile_dpbf16ps(0, 2, 4);
          _tile_dpbf16ps(1, 2, 5);
        }
      } else {
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t b = 0; b < kb; ++b) {
          _tile_loadd(6, wpair + b * 1024, 64);
          _tile_loadd(7, wpair + b * 1024 + 512, 64);
          _tile_loadd(4, x0 + b * kTileK, stride);
          _tile_dpbf16ps(0, 4, 6);
          _tile_dpbf16ps(1, 4, 7);
          _tile_loadd(5, x0 + 16 * ld + b * kTileK, stride);
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        }
      }
      _tile_stored(0, acc, kTileN * 4);
      _tile_stored(1, acc + 16, kTileN * 4);
      if (two) {
        _tile_stored(2, acc + 16 * kTileN, kTileN * 4);
        _tile_stored(3, acc + 16 * kTileN + 16, kTileN * 4);
      }
      const int64_t n0 = p * kTileN;
      store_rows(acc, kTileN, std::min<int64_t>(two ? 32 : 16, M - m0), std::min<int64_t>(kTileN, N - n0), m0, n0, N,
                 res, op);
    }
  }
  restore_tiles(outer);
}

}  // namespace

// x (M, K) @ w.T [+ residual] for w packed by pack_tiles from an (N, K) matrix; rounding as linear().
at::Tensor linear_tiles(const at::Tensor& x, const at::Tensor& packed, int64_t N,
                        const c10::optional<at::Tensor>& residual) {
  check_bf16(x, "x", 2);
  check_bf16(packed, "packed", 2);
  TORCH_CHECK(amx_permitted(), "this CPU or kernel does not grant AMX tiles");
  const int64_t M = x.size(0), K = x.size(1), kb = (K + kTileK - 1) / kTileK, Kp = kb * kTileK;
  const int64_t pairs = (N + kTileN - 1) / kTileN;
  TORCH_CHECK(packed.size(0) == pairs && packed.size(1) == kb * 1024, "packed weights do not match x's ", K,
              " columns and ", N, " outputs");
  const bf16* res = residual_rows(residual, M, N);
  at::Tensor out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  const bf16* xp = x.data_ptr<bf16>();
  int64_t Mp = M;
  at::Tensor padded;
  if (M > 16 || K != Kp) {  // whole 16-row tiles of x, K a multiple of 32 (up to 16 rows are read in place)
    Mp = M > 16 ? (M + 15) / 16 * 16 : M;
    padded = at::empty({Mp, Kp}, x.options());
    bf16* pp = padded.data_ptr<bf16>();
    std::memset(static_cast<void*>(pp), 0, Mp * Kp * sizeof(bf16));
    for (int64_t m = 0; m < M; ++m) std::memcpy(static_cast<void*>(pp + m * Kp), xp + m * K, K * sizeof(bf16));
    xp = pp;
  }
  const bf16* wp = packed.data_ptr<bf16>();
  bf16* op = out.data_ptr<bf16>();
  at::parallel_for(0, pairs, 1, [&](int64_t p0, int64_t p1) {
    tile_pairs(p0, p1, xp, M, Mp, Kp, Kp * 2, wp, N, res, op);
  });
  return out;
}

}  // namespace specdec::bf16_ops
