#include "avx512.h"
#include "../amx.h"  // TileConfig, amx_granted, restore_tiles

namespace specdec::blocks {
namespace {

// ---- Prompt rows on AMX-BF16 tiles -------------------------------------------------------------------
//
// A prompt's rows produce no logits, only the keys and values later rows read, and a long prompt is
// hundreds of rows at once: there the int8 tiles above are bound by their per-group float steps (each
// 32-weight group's C tile stored and scaled), ~0.7 ms a row for SmolLM2. Here a matrix is dequantised to
// bfloat16 once per call (w = a code + b, rounded to nearest even: the B tiles of its 16-column blocks)
// and the rows, rounded to bfloat16, are multiplied by tdpbf16ps with float sums over the whole of K in
// the C tiles, no step per group. Every prompt row takes this path whatever the count, so a prompt's
// cache does not depend on how it was cut into chunks (a row's sums are the same in any chunk: each C
// tile row is its own A row's products).

#define SPECDEC_AMX_BF16 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vnni,avx2,fma,f16c,amx-tile,amx-bf16")))

// The block's groups as bfloat16 B tiles: K / 2 rows of 64 bytes, row k / 2 holding weights k and k + 1
// of each of the 16 columns side by side (the VNNI pairs tdpbf16ps takes).
template <int64_t KIND>
SPECDEC_AMX_BF16 void dequant_block(const uint8_t* block, int64_t groups, uint16_t* out) {
  constexpr Format F = format_of(KIND);
  const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i byte = _mm512_set1_epi32(0xFF);
  for (int64_t g = 0; g < groups; ++g) {
    __m512i t[F.G / 4];
    __m512 a, b;
    unpack_group<KIND>(group_at<KIND>(block, g), tail_at<KIND>(block, g), t, a, b);
    for (int64_t i = 0; i < F.G / 4; ++i) {  // weights 4i .. 4i + 3 of the group, column n in dword n
      __m512 w[4];
      for (int j = 0; j < 4; ++j)
        w[j] = _mm512_fmadd_ps(a, _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(t[i], 8 * j), byte)), b);
      for (int j = 0; j < 2; ++j) {
        const __m512i v = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(w[2 * j + 1], w[2 * j]));
        _mm512_storeu_si512(out + ((g * F.G + 4 * i) / 2 + j) * 32, _mm512_permutexvar_epi16(pairs, v));
      }
    }
  }
}

// Rows m0 .. m1 - 1 of x rounded to bfloat16 as A tiles: rows 16 i .. 16 i + 15, inputs 32 j .. 32 j + 31
// are 1 KB at out + (i K / 32 + j) 512, so a tile load reads consecutive lines.
SPECDEC_AMX_BF16 void round_rows_bf16(const float* x, int64_t m0, int64_t m1, int64_t K, uint16_t* out) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t k = 0; k < K; k += 32) {
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + m * K + k + 16), _mm512_loadu_ps(x + m * K + k));
      _mm512_storeu_si512(out + ((m / 16) * (K / 32) + k / 32) * 512 + (m % 16) * 32, reinterpret_cast<__m512i>(v));
    }
}

// C tile t (0-3) into out's rows row .. row + 15 (those below M) at column block blk.
SPECDEC_AMX_BF16 inline void store_c(int t, float* out, int64_t row, int64_t M, int64_t N, int64_t blk, float* spill) {
  float* dst = out + row * N + blk * PACKED_COLS;
  const bool whole = row + 16 <= M;
  float* to = whole ? dst : spill;
  const int64_t stride = whole ? N * 4 : 64;
  switch (t) {  // the tile number must be a constant
    case 0: _tile_stored(0, to, stride); break;
    case 1: _tile_stored(1, to, stride); break;
    case 2: _tile_stored(2, to, stride); break;
    default: _tile_stored(3, to, stride); break;
  }
  if (!whole)  // the last, partial tile: its rows past M are padding
    for (int64_t i = 0; row + i < M; ++i) std::memcpy(dst + i * N, spill + 16 * i, 64);
}

// Row tiles [r0, r1) of the rounded rows times column blocks [b0, b1), two row tiles by two column
// blocks at a time (C tiles 0-3; A tiles 4-5, B tiles 6-7): each tile loaded is used twice.
SPECDEC_AMX_BF16 void prompt_tiles(const uint16_t* xb, const uint16_t* wb, float* out, int64_t M, int64_t K, int64_t N,
                                   int64_t r0, int64_t r1, int64_t b0, int64_t b1) {
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.rows[t] = 16, config.colsb[t] = 64;  // every tile 16 x 64 bytes
  asm volatile("" : : "r"(&config) : "memory");  // GCC would drop the stores ldtilecfg reads
  const TileConfig outer = tiles_in_use();
  _tile_loadconfig(&config);
  alignas(64) float spill[16 * 16];
  const int64_t tile = 16 * K;  // bfloat16 of one row tile (or one column block) over all of K
  for (int64_t blk = b0; blk < b1; blk += 2) {
    const bool two_cols = blk + 1 < b1;
    const uint16_t* b_0 = wb + blk * tile;
    const uint16_t* b_1 = b_0 + tile;
    for (int64_t rt = r0; rt < r1; rt += 2) {
      const bool two_rows = rt + 1 < r1;
      const uint16_t* a_0 = xb + rt * tile;
      const uint16_t* a_1 = a_0 + tile;
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t k = 0; k < K * 16; k += 512) {  // 32 inputs a step: 1 KB of each tile
        _tile_loadd(4, a_0 + k, 64);
        _tile_loadd(6, b_0 + k, 64);
        _tile_dpbf16ps(0, 4, 6);
        if (two_cols) {
          _tile_loadd(7, b_1 + k, 64);
          _tile_dpbf16ps(1, 4, 7);
        }
        if (two_rows) {
          _tile_loadd(5, a_1 + k, 64);
          _tile_dpbf16ps(2, 5, 6);
          if (two_cols) _tile_dpbf16ps(3, 5, 7);
        }
      }
      store_c(0, out, 16 * rt, M, N, blk, spill);
      if (two_cols) store_c(1, out, 16 * rt, M, N, blk + 1, spill);
      if (two_rows) store_c(2, out, 16 * rt + 16, M, N, blk, spill);
      if (two_rows && two_cols) store_c(3, out, 16 * rt + 16, M, N, blk + 1, spill);
    }
  }
  restore_tiles(outer);
}

// The calling thread's bfloat16 copies of a prompt product's matrix and rows, one pair for every block
// type (a static in the template would be one pair per type).
struct PromptBuffers {
  std::vector<uint16_t> w, x;
};

PromptBuffers& prompt_buffers() {
  static thread_local PromptBuffers buffers;
  return buffers;
}

// out (M, N) = x (M, K) @ w.T for prompt rows: w packed (pack_int8), dequantised once for the call.
template <int64_t KIND>
void prompt_product(const float* xp, const uint8_t* w, float* out, int64_t M, int64_t K, int64_t N) {
  constexpr Format F = format_of(KIND);
  const int64_t blocks = N / PACKED_COLS, stride = packed_bytes(F, K), Mp = (M + 15) / 16 * 16;
  // The bfloat16 copies live on between calls (a fresh few-MB buffer a call costs its page faults, as
  // much as the dequantisation for a short prompt); every element is written before it is read.
  // The worker threads take the caller's buffers through these pointers (a thread_local named inside the
  // lambdas would be each worker's own).
  PromptBuffers& buffers = prompt_buffers();
  buffers.w.resize(std::max<size_t>(buffers.w.size(), N * K));
  buffers.x.resize(std::max<size_t>(buffers.x.size(), Mp * K));
  uint16_t* wb = buffers.w.data();
  uint16_t* xb = buffers.x.data();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) dequant_block<KIND>(w + blk * stride, K / F.G, wb + blk * K * 16);
  });
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) { round_rows_bf16(xp, m0, m1, K, xb); });
  for (int64_t m = M; m < Mp; ++m)  // the last row tile's padding rows
    for (int64_t k = 0; k < K; k += 32) std::memset(xb + ((m / 16) * (K / 32) + k / 32) * 512 + (m % 16) * 32, 0, 64);
  const int64_t row_tiles = Mp / 16, chunk = std::max<int64_t>(2, 8192 / K / 2 * 2);  // ~256 KB of rows, pairs
  for (int64_t r0 = 0; r0 < row_tiles; r0 += chunk) {
    const int64_t r1 = std::min(row_tiles, r0 + chunk);
    at::parallel_for(0, (blocks + 1) / 2, 1, [&](int64_t p0, int64_t p1) {  // column blocks in pairs
      prompt_tiles(xb, wb, out, M, K, N, r0, r1, 2 * p0, std::min(blocks, 2 * p1));
    });
  }
}

}  // namespace

bool amx_bf16() { return amx_granted(false); }

void prompt_matmul(int64_t kind, const float* x, const uint8_t* w, float* out, int64_t M, int64_t K, int64_t N) {
  by_kind(kind, [&](auto k) { prompt_product<k()>(x, w, out, M, K, N); });
}

// For tests: whether the AMX products hand a thread's tiles back as they found them (amx.h): a
// configuration unlike any here is loaded, both tile products run on this thread, and what is loaded
// after is compared with it.
bool tiles_left_as_found() {
  TORCH_CHECK(amx_granted(true) && amx_bf16(), "this CPU does not grant AMX-INT8 and AMX-BF16 tiles");
  TileConfig theirs;
  theirs.rows[0] = 3, theirs.colsb[0] = 12, theirs.rows[5] = 7, theirs.colsb[5] = 20;
  restore_tiles(theirs);
  constexpr int64_t K = 64, M = 20;
  std::vector<float> x(M * K, 0.5f), out(M * PACKED_COLS);
  std::vector<uint8_t> w(K / 32 * group_bytes(format_of(Q8_0)), 0);
  const PackedActs acts = quantize_acts(x.data(), M, K, 32);
  amx_int8_blocks(Q8_0, acts, w.data(), static_cast<int64_t>(w.size()), out.data(), PACKED_COLS, 0, 1);
  std::vector<uint16_t> xb(32 * K, 0), wb(16 * K, 0);
  prompt_tiles(xb.data(), wb.data(), out.data(), M, K, PACKED_COLS, 0, 2, 0, 1);
  const TileConfig after = tiles_in_use();
  TileConfig none;
  none.palette = 0;  // all zeros: the tiles' initial state again
  restore_tiles(none);
  return std::memcmp(&after, &theirs, sizeof(TileConfig)) == 0;
}

}  // namespace specdec::blocks
