// The packed int8 products on AVX-512 VNNI (vpdpbusd, few rows) and AMX-INT8 tiles (tdpbsud, many rows).

#include "avx512.h"
#include "../amx.h"  // TileConfig, restore_tiles

namespace specdec::blocks {
namespace {

// Rows r0 .. r0 + R - 1 of x times blocks [b0, b1) on vpdpbusd: each group unpacked once for the R rows,
// each row's sums in one zmm (G / 4 instructions against its broadcast dwords). The R rows lie within
// one 16-row tile of PackedActs (r0 % 16 + R <= 16), so row r of a group sits at at(r0, g) + r. The row
// loop is unrolled so that the R accumulators stay in registers (rolled, GCC kept them on the stack:
// a load and a store a row and group, 8 rows 2.1 steps on Zen 5 against 1.2 for 4).
template <int64_t KIND, int64_t R>
SPECDEC_VNNI void vnni_rows(const PackedActs& x, const uint8_t* w, int64_t stride, float* out, int64_t N, int64_t r0,
                            int64_t b0, int64_t b1) {
  static_assert(R >= 1 && R <= 16, "a row tile is at most 16 rows");
  constexpr Format F = format_of(KIND);
  for (int64_t blk = b0; blk < b1; ++blk) {
    const uint8_t* block = w + blk * stride;
    __m512 acc[R];
#pragma GCC unroll 16
    for (int64_t r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t g = 0; g < x.groups; ++g) {
      const uint8_t* p = group_at<KIND>(block, g);
      prefetch_group(p, read_bytes<KIND>(g));
      __m512i t[F.G / 4];
      __m512 a, b;
      unpack_group<KIND>(p, tail_at<KIND>(block, g), t, a, b);
      const int64_t at0 = x.at(r0, g);
      const int8_t* q0 = x.q.data() + at0 * F.G;
      const float* d = x.d.data() + at0;
      const float* s = x.s.data() + at0;
#pragma GCC unroll 16
      for (int64_t r = 0; r < R; ++r) {
        const int8_t* q = q0 + r * F.G;
        __m512i sums = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int64_t i = 0; i < F.G / 4; ++i) {
          int32_t dword;
          std::memcpy(&dword, q + 4 * i, 4);
          sums = _mm512_dpbusd_epi32(sums, t[i], _mm512_set1_epi32(dword));
        }
        acc[r] = accumulate_group(sums, a, b, d[r], s[r], acc[r]);
      }
    }
#pragma GCC unroll 16
    for (int64_t r = 0; r < R; ++r) _mm512_storeu_ps(out + (r0 + r) * N + blk * PACKED_COLS, acc[r]);
  }
}

// A C tile of a group's sums for 16 rows into their accumulators: ab the group's a, then b; d and s the
// rows' (PackedActs.d and .s of the tile).
__attribute__((always_inline)) SPECDEC_VNNI inline void accumulate_tile(const int32_t* sums, const float* ab,
                                                                        const float* d, const float* s, __m512 acc[16]) {
  const __m512 a = _mm512_load_ps(ab), b = _mm512_load_ps(ab + PACKED_COLS);
#pragma GCC unroll 16
  for (int r = 0; r < 16; ++r) acc[r] = accumulate_group(_mm512_load_si512(sums + 16 * r), a, b, d[r], s[r], acc[r]);
}

// Up to four groups' products for one 16-row tile of x (tile: its first group's A tile), through C tiles
// 0-3, accumulated in group order into acc. A in tiles 4-5 and B in 6-7, alternating.
template <int64_t KIND>
__attribute__((always_inline)) SPECDEC_AMX_INT8 inline void amx_groups(int n, const uint8_t* btiles, const float* scales,
                                                                       const int8_t* tile, const float* d, const float* s,
                                                                       int32_t (*c)[256], __m512 acc[16]) {
  constexpr Format F = format_of(KIND);
  constexpr int64_t TILE = F.G / 4 * 64, A = 16 * F.G;
  _tile_zero(0);
  _tile_loadd(6, btiles, 64);
  _tile_loadd(4, tile, F.G);
  _tile_dpbsud(0, 4, 6);
  if (n > 1) {
    _tile_zero(1);
    _tile_loadd(7, btiles + TILE, 64);
    _tile_loadd(5, tile + A, F.G);
    _tile_dpbsud(1, 5, 7);
  }
  if (n > 2) {
    _tile_zero(2);
    _tile_loadd(6, btiles + 2 * TILE, 64);
    _tile_loadd(4, tile + 2 * A, F.G);
    _tile_dpbsud(2, 4, 6);
  }
  if (n > 3) {
    _tile_zero(3);
    _tile_loadd(7, btiles + 3 * TILE, 64);
    _tile_loadd(5, tile + 3 * A, F.G);
    _tile_dpbsud(3, 5, 7);
  }
  _tile_stored(0, c[0], 64);
  if (n > 1) _tile_stored(1, c[1], 64);
  if (n > 2) _tile_stored(2, c[2], 64);
  if (n > 3) _tile_stored(3, c[3], 64);
  for (int j = 0; j < n; ++j) accumulate_tile(c[j], scales + j * 2 * PACKED_COLS, d + j * 16, s + j * 16, acc);
}

// Up to four of a block's groups (from group g0 of the block) unpacked into B tiles in memory (G / 4
// rows of 64 bytes each), with their a and b side by side.
template <int64_t KIND>
__attribute__((always_inline)) SPECDEC_AMX_INT8 inline void unpack_groups(int n, const uint8_t* block, int64_t g0,
                                                                          uint8_t* btiles, float* scales) {
  constexpr Format F = format_of(KIND);
  constexpr int64_t TILE = F.G / 4 * 64;
  for (int j = 0; j < n; ++j) {
    const uint8_t* p = group_at<KIND>(block, g0 + j);
    prefetch_group(p, read_bytes<KIND>(g0 + j));
    __m512i t[F.G / 4];
    __m512 a, b;
    unpack_group<KIND>(p, tail_at<KIND>(block, g0 + j), t, a, b);
    for (int64_t i = 0; i < F.G / 4; ++i) _mm512_store_si512(btiles + j * TILE + 64 * i, t[i]);
    _mm512_store_ps(scales + j * 2 * PACKED_COLS, a);
    _mm512_store_ps(scales + j * 2 * PACKED_COLS + PACKED_COLS, b);
  }
}

// All M rows of x times blocks [b0, b1) on AMX. A block's groups, four at a time, are unpacked into B
// tiles (unpack_groups: the next four while the tiles take the last, so no tile load waits on the stores
// that wrote it), then multiplied with every 16 rows of x (an A tile a group: PackedActs' layout) by
// tdpbsud into zeroed C tiles, stored, and accumulated group after group by accumulate_group: in 16 zmm,
// one a row, when x has at most 16 rows, else through acc_rows.
template <int64_t KIND>
SPECDEC_AMX_INT8 void amx_rows(const PackedActs& x, const uint8_t* w, int64_t stride, float* out, int64_t N,
                               int64_t b0, int64_t b1) {
  constexpr Format F = format_of(KIND);
  constexpr int64_t TILE = F.G / 4 * 64;
  TileConfig config;
  for (int t = 0; t < 4; ++t) config.rows[t] = 16, config.colsb[t] = 64;  // C: 16 rows x 16 int32
  for (int t = 4; t < 6; ++t) config.rows[t] = 16, config.colsb[t] = static_cast<uint16_t>(F.G);  // A: 16 x G int8
  for (int t = 6; t < 8; ++t) config.rows[t] = static_cast<uint8_t>(F.G / 4), config.colsb[t] = 64;  // B
  asm volatile("" : : "r"(&config) : "memory");  // GCC would drop the stores ldtilecfg reads
  const TileConfig outer = tiles_in_use();
  _tile_loadconfig(&config);
  const int64_t groups = x.groups, Mp = static_cast<int64_t>(x.q.size()) / x.K;  // rows rounded up to 16
  alignas(64) uint8_t btiles[2][4 * TILE];
  alignas(64) float scales[2][4 * 2 * PACKED_COLS];
  alignas(64) int32_t c[4][256];
  std::vector<float> acc_rows(Mp > 16 ? Mp * PACKED_COLS : 0);
  const int64_t chunks = (groups + 3) / 4;
  auto size = [&](int64_t k) { return static_cast<int>(std::min<int64_t>(4, groups - 4 * k)); };
  for (int64_t blk = b0; blk < b1; ++blk) {
    const uint8_t* p = w + blk * stride;
    __m512 acc[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) acc[r] = _mm512_setzero_ps();
    std::fill(acc_rows.begin(), acc_rows.end(), 0.f);
    unpack_groups<KIND>(size(0), p, 0, btiles[0], scales[0]);
    for (int64_t k = 0; k < chunks; ++k) {
      if (k + 1 < chunks) unpack_groups<KIND>(size(k + 1), p, 4 * (k + 1), btiles[(k + 1) % 2], scales[(k + 1) % 2]);
      const uint8_t* bt = btiles[k % 2];
      const float* sc = scales[k % 2];
      for (int64_t r0 = 0; r0 < Mp; r0 += 16) {
        const int64_t first = x.at(r0, 4 * k);
        if (Mp == 16) {
          amx_groups<KIND>(size(k), bt, sc, x.q.data() + first * F.G, x.d.data() + first, x.s.data() + first, c, acc);
          continue;
        }
        float* rows = acc_rows.data() + r0 * PACKED_COLS;
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r) acc[r] = _mm512_loadu_ps(rows + r * PACKED_COLS);
        amx_groups<KIND>(size(k), bt, sc, x.q.data() + first * F.G, x.d.data() + first, x.s.data() + first, c, acc);
#pragma GCC unroll 16
        for (int r = 0; r < 16; ++r) _mm512_storeu_ps(rows + r * PACKED_COLS, acc[r]);
      }
    }
    for (int64_t r = 0; r < x.M; ++r)
      _mm512_storeu_ps(out + r * N + blk * PACKED_COLS, Mp == 16 ? acc[r] : _mm512_loadu_ps(acc_rows.data() + r * PACKED_COLS));
  }
  restore_tiles(outer);
}

// The last rows (1 to 15) of x as one tile of exactly that many: the weights stream once for them (as
// 8 + 4 + 3 tiles they streamed three times; 12 rows cost 7.6 ms a SmolLM2 pass on Zen 5 against 5.2 for 8).
template <int64_t KIND, int64_t... Less>
void vnni_rest(std::integer_sequence<int64_t, Less...>, const PackedActs& x, const uint8_t* w, int64_t stride,
               float* out, int64_t N, int64_t r0, int64_t rows, int64_t b0, int64_t b1) {
  ((rows == Less + 1 ? vnni_rows<KIND, Less + 1>(x, w, stride, out, N, r0, b0, b1) : void()), ...);
}

}  // namespace

bool vnni_supported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
}


void vnni_blocks(int64_t kind, const PackedActs& x, const uint8_t* w, int64_t stride, float* out, int64_t N,
                 int64_t b0, int64_t b1) {
  by_kind(kind, [&](auto k) {
    int64_t r = 0;
    for (; r + 16 <= x.M; r += 16) vnni_rows<k(), 16>(x, w, stride, out, N, r, b0, b1);
    if (r < x.M) vnni_rest<k()>(std::make_integer_sequence<int64_t, 15>{}, x, w, stride, out, N, r, x.M - r, b0, b1);
  });
}

void amx_int8_blocks(int64_t kind, const PackedActs& x, const uint8_t* w, int64_t stride, float* out, int64_t N,
                     int64_t b0, int64_t b1) {
  by_kind(kind, [&](auto k) { amx_rows<k()>(x, w, stride, out, N, b0, b1); });
}

}  // namespace specdec::blocks
