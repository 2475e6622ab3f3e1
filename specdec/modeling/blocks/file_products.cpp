// x @ w.T on a GGUF file's own blocks as the file stores them (quant.cpp's linear for unpacked weights),
// AVX2 + FMA + F16C: float32 activations (tile, tile_factored) or int8 ones (tile_int8).

#include "formats.h"

namespace specdec::blocks {
namespace {

// out[r, n] for rows [r0, r0 + R) of x and output rows [n0, n1): each group of 32 weights is
// dequantised once, then each row multiplies it with FMAs into its own accumulators.
template <int64_t KIND, int64_t R>
SPECDEC_AVX2 void tile(const float* x, const uint8_t* w, float* out, int64_t K, int64_t N, int64_t r0, int64_t n0,
                       int64_t n1) {
  const int64_t groups = K / QK, row_bytes = K / block_weights(KIND) * block_bytes(KIND);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    __m256 acc[R];
    for (int64_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      __m256 c[4];
      group<KIND>(row, g, c);
      for (int64_t r = 0; r < R; ++r) {
        const float* xg = x + (r0 + r) * K + g * QK;
        acc[r] = _mm256_fmadd_ps(c[0], _mm256_loadu_ps(xg), acc[r]);
        acc[r] = _mm256_fmadd_ps(c[1], _mm256_loadu_ps(xg + 8), acc[r]);
        acc[r] = _mm256_fmadd_ps(c[2], _mm256_loadu_ps(xg + 16), acc[r]);
        acc[r] = _mm256_fmadd_ps(c[3], _mm256_loadu_ps(xg + 24), acc[r]);
      }
    }
    for (int64_t r = 0; r < R; ++r) out[(r0 + r) * N + n] = hsum(acc[r]);
  }
}

// tile() for the types whose 32 weights share one affine map (all but Q6_K), factored:
// sum_j (a q_j + b) x_j = a sum_j q_j x_j + b sum_j x_j. The codes become floats once a group; each row
// then takes four FMAs and one for a. The b terms of all the tile's rows take one FMA a group: xsum holds
// each group's sums of x for 8 rows side by side (rows padded to a multiple of 8 with zeros), lane r
// row r0 + r, the same product a row gets in any tile.
template <int64_t KIND, int64_t R>
SPECDEC_AVX2 void tile_factored(const float* x, const float* xsum, const uint8_t* w, float* out, int64_t K, int64_t N,
                                int64_t r0, int64_t n0, int64_t n1) {
  static_assert(KIND != Q6_K, "Q6_K's two halves have different scales");
  const int64_t groups = K / QK, row_bytes = K / block_weights(KIND) * block_bytes(KIND);
  const float* sums = xsum + r0 / 8 * groups * 8 + r0 % 8;  // group g of row r0 + r: sums[g * 8 + r]
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    __m256 acc[R];
    __m256 offset = _mm256_setzero_ps();
    for (int64_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t g = 0; g < groups; ++g) {
      const Group<KIND> c = codes<KIND>(row, g);
      const __m128i lo = _mm256_castsi256_si128(c.q), hi = _mm256_extracti128_si256(c.q, 1);
      const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
      __m256 q[4];
      for (int i = 0; i < 4; ++i)
        q[i] = _mm256_cvtepi32_ps(KIND == Q8_0 ? _mm256_cvtepi8_epi32(parts[i]) : _mm256_cvtepu8_epi32(parts[i]));
      const __m256 a = _mm256_set1_ps(c.a0);
      for (int64_t r = 0; r < R; ++r) {
        const float* xg = x + (r0 + r) * K + g * QK;
        __m256 dot = _mm256_mul_ps(q[0], _mm256_loadu_ps(xg));
        dot = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xg + 8), dot);
        dot = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xg + 16), dot);
        dot = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xg + 24), dot);
        acc[r] = _mm256_fmadd_ps(a, dot, acc[r]);
      }
      if constexpr (KIND != Q8_0) offset = _mm256_fmadd_ps(_mm256_set1_ps(c.b0), _mm256_loadu_ps(sums + g * 8), offset);
    }
    alignas(32) float offsets[8];
    _mm256_store_ps(offsets, offset);
    for (int64_t r = 0; r < R; ++r) out[(r0 + r) * N + n] = hsum(acc[r]) + offsets[r];
  }
}

// Activations quantised per row and group of 32 (what llama.cpp's Q8 dot products take): x ~ d q with
// d = max|x| / 127 and q = round(x / d) in int8 (ties to even), and s = d * (sum of the group's q), for
// the types whose weights have an offset. A row's groups are padded with zeros to a multiple of 8 (the
// tile reads 8 groups at a time); a row's codes depend on that row alone.
struct Int8Rows {
  int64_t groups;         // a row's groups, padded to a multiple of 8
  std::vector<int8_t> q;  // (M, groups, 32)
  std::vector<float> d;   // (M, groups)
  std::vector<float> s;   // (M, groups)
};

SPECDEC_AVX2 Int8Rows quantize_rows(const float* x, int64_t M, int64_t K) {
  const int64_t G = K / QK, P = (G + 7) / 8 * 8;
  Int8Rows out{P, std::vector<int8_t>(M * P * QK, 0), std::vector<float>(M * P, 0.f), std::vector<float>(M * P, 0.f)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < G; ++g) {
      int32_t total;
      const float d = quantize_group(x + m * K + g * QK, QK, out.q.data() + (m * P + g) * QK, total);
      out.d[m * P + g] = d;
      out.s[m * P + g] = d * static_cast<float>(total);
    }
  return out;
}

// The sums of eight int32 vectors' lanes: lane j of the result is the sum of v[j]'s eight lanes.
SPECDEC_AVX2 inline __m256i lane_sums(const __m256i v[8]) {
  const __m256i low = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i high = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  // low: v[0..3]'s sums of lanes 0-3, then of lanes 4-7; high: the same for v[4..7]
  return _mm256_add_epi32(_mm256_permute2x128_si256(low, high, 0x20), _mm256_permute2x128_si256(low, high, 0x31));
}

// lane_sums when v[4..7] are zero: lanes 4-7 of the result are zero.
SPECDEC_AVX2 inline __m256i lane_sums4(const __m256i v[8]) {
  const __m256i sums = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  return _mm256_zextsi128_si256(_mm_add_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1)));
}

// A group of 32 weights as int8 products take them: maddubs multiplies unsigned bytes (magnitude) by
// signed ones (the activations, given sign's signs for Q8_0 and Q6_K: the sign trick), madd then sums
// pairs times multiplier (1, or Q6_K's integer scale of each 16 weights); w = a q + b.
template <int64_t KIND>
struct Int8Group {
  __m256i magnitude, sign, multiplier;
  float a, b;
};

template <int64_t KIND>
SPECDEC_AVX2 inline Int8Group<KIND> int8_codes(const uint8_t* row, int64_t g) {
  const Group<KIND> group = codes<KIND>(row, g);
  Int8Group<KIND> out{group.q, group.q, _mm256_set1_epi16(1), group.a0, group.b0};
  if constexpr (KIND == Q8_0) {
    out.magnitude = _mm256_sign_epi8(group.q, group.q);
  } else if constexpr (KIND == Q6_K) {  // w = d sc (q - 32): a = d, the scales go into madd
    out.sign = _mm256_sub_epi8(group.q, _mm256_set1_epi8(32));
    out.magnitude = _mm256_sign_epi8(out.sign, out.sign);
    out.multiplier = _mm256_set_m128i(_mm_set1_epi16(group.scale1), _mm_set1_epi16(group.scale0));
    out.a = group.d, out.b = 0.f;
  }
  return out;
}

// The integer sum of a group's 32 products with a row's activations, in 8 int32 lanes (exact).
template <int64_t KIND>
SPECDEC_AVX2 inline __m256i int8_dot(const Int8Group<KIND>& group, const int8_t* xq) {
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
  if constexpr (KIND == Q8_0 || KIND == Q6_K) v = _mm256_sign_epi8(v, group.sign);
  const __m256i pairs = _mm256_maddubs_epi16(group.magnitude, v);
  if constexpr (KIND == Q6_K) return _mm256_madd_epi16(pairs, group.multiplier);
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// One row's part of groups c .. c + LIVE - 1 (LIVE <= 8; lanes past LIVE stay zero) in its accumulator:
// the groups' integer sums side by side (lane j: group c + j), times each group's a and the row's d, and
// the offsets b s. av, bv: the groups' a and b.
template <int64_t KIND, int64_t LIVE>
SPECDEC_AVX2 inline __m256 int8_accumulate(const __m256i dots[8], __m256 av, __m256 bv, const Int8Rows& x, int64_t i,
                                           __m256 acc) {
  const __m256 sums = _mm256_cvtepi32_ps(LIVE > 4 ? lane_sums(dots) : lane_sums4(dots));
  acc = _mm256_fmadd_ps(sums, _mm256_mul_ps(av, _mm256_loadu_ps(x.d.data() + i)), acc);
  return _mm256_fmadd_ps(bv, _mm256_loadu_ps(x.s.data() + i), acc);
}

SPECDEC_AVX2 inline __m256 vector8(const float v[8]) {
  return _mm256_setr_ps(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]);
}

// Groups c .. c + LIVE - 1 of output row `row` for rows r0 .. r0 + R - 1 of x. One row takes each group's
// codes straight into its product; several rows unpack the groups once and share them.
template <int64_t KIND, int64_t R, int64_t LIVE>
SPECDEC_AVX2 inline void int8_chunk(const Int8Rows& x, const uint8_t* row, int64_t c, int64_t r0, __m256 acc[R]) {
  float a[8] = {}, b[8] = {};
  __m256i dots[8];
  for (int64_t j = LIVE; j < 8; ++j) dots[j] = _mm256_setzero_si256();
  if constexpr (R == 1) {
    const int64_t i = r0 * x.groups + c;
    for (int64_t j = 0; j < LIVE; ++j) {
      const Int8Group<KIND> group = int8_codes<KIND>(row, c + j);
      a[j] = group.a, b[j] = group.b;
      dots[j] = int8_dot<KIND>(group, x.q.data() + (i + j) * QK);
    }
    acc[0] = int8_accumulate<KIND, LIVE>(dots, vector8(a), vector8(b), x, i, acc[0]);
  } else {
    Int8Group<KIND> groups[LIVE];
    for (int64_t j = 0; j < LIVE; ++j) {
      groups[j] = int8_codes<KIND>(row, c + j);
      a[j] = groups[j].a, b[j] = groups[j].b;
    }
    const __m256 av = vector8(a), bv = vector8(b);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t i = (r0 + r) * x.groups + c;
      for (int64_t j = 0; j < LIVE; ++j) dots[j] = int8_dot<KIND>(groups[j], x.q.data() + (i + j) * QK);
      acc[r] = int8_accumulate<KIND, LIVE>(dots, av, bv, x, i, acc[r]);
    }
  }
}

// tile() on int8 activations. Each group's products of codes and activations are summed as integers
// (maddubs, then madd: exact). The types with an offset (Q4_0, Q4_1, Q5_0, Q4_K: w = a q + b, codes
// 0..31) take 8 groups at a time: their integer sums side by side in one vector (lane j: group c + j),
// times each group's a and the row's d, plus b s, added up lane by lane (the offsets cost one FMA for 8
// groups). Q8_0 and Q6_K have signed codes (Q6_K's q - 32), taken with the sign trick (|q| times x with
// q's sign), and no offset: each group's 8 lanes of sums are scaled by a d and added up as they come;
// Q6_K's integer scale of each 16 weights multiplies in madd (its a is the superblock's d). Every step
// after the integer sums is lane-wise and a row's groups always fill the same lanes, so a row's result
// does not depend on the tile.
template <int64_t KIND, int64_t R>
SPECDEC_AVX2 void tile_int8(const Int8Rows& x, const uint8_t* w, float* out, int64_t K, int64_t N, int64_t r0,
                            int64_t n0, int64_t n1) {
  const int64_t G = K / QK, row_bytes = K / block_weights(KIND) * block_bytes(KIND);
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* row = w + n * row_bytes;
    __m256 acc[R];
    for (int64_t r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    if constexpr (KIND == Q8_0 || KIND == Q6_K) {
      for (int64_t g = 0; g < G; ++g) {
        const Int8Group<KIND> group = int8_codes<KIND>(row, g);
        for (int64_t r = 0; r < R; ++r) {
          const int64_t i = (r0 + r) * x.groups + g;
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(int8_dot<KIND>(group, x.q.data() + i * QK)),
                                   _mm256_set1_ps(group.a * x.d[i]), acc[r]);
        }
      }
    } else {
      int64_t c = 0;
      for (; c + 8 <= G; c += 8) int8_chunk<KIND, R, 8>(x, row, c, r0, acc);
      switch (G - c) {  // the last groups, fewer than 8
        case 7: int8_chunk<KIND, R, 7>(x, row, c, r0, acc); break;
        case 6: int8_chunk<KIND, R, 6>(x, row, c, r0, acc); break;
        case 5: int8_chunk<KIND, R, 5>(x, row, c, r0, acc); break;
        case 4: int8_chunk<KIND, R, 4>(x, row, c, r0, acc); break;
        case 3: int8_chunk<KIND, R, 3>(x, row, c, r0, acc); break;
        case 2: int8_chunk<KIND, R, 2>(x, row, c, r0, acc); break;
        case 1: int8_chunk<KIND, R, 1>(x, row, c, r0, acc); break;
      }
    }
    for (int64_t r = 0; r < R; ++r) out[(r0 + r) * N + n] = hsum(acc[r]);
  }
}

// Threads split the output rows; each reads its share of w once per 16 output rows for all of x's
// rows (tiles of ROW_TILE, then one of the rest), so w streams from memory once a call.
template <int64_t KIND, typename X, typename Tile>
void for_tiles(const X& x, const uint8_t* w, float* out, int64_t M, int64_t K, int64_t N, Tile tile) {
  constexpr int64_t NCHUNK = 16;
  const int64_t chunks = (N + NCHUNK - 1) / NCHUNK;
  at::parallel_for(0, chunks, 4, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t n0 = c * NCHUNK, n1 = std::min(N, n0 + NCHUNK);
      int64_t r = 0;
      for (; r + ROW_TILE <= M; r += ROW_TILE) tile(std::integral_constant<int64_t, ROW_TILE>{}, r, n0, n1);
      switch (M - r) {  // the rest in one tile: a row's arithmetic is the same in any tile
        case 7: tile(std::integral_constant<int64_t, 7>{}, r, n0, n1); break;
        case 6: tile(std::integral_constant<int64_t, 6>{}, r, n0, n1); break;
        case 5: tile(std::integral_constant<int64_t, 5>{}, r, n0, n1); break;
        case 4: tile(std::integral_constant<int64_t, 4>{}, r, n0, n1); break;
        case 3: tile(std::integral_constant<int64_t, 3>{}, r, n0, n1); break;
        case 2: tile(std::integral_constant<int64_t, 2>{}, r, n0, n1); break;
        case 1: tile(std::integral_constant<int64_t, 1>{}, r, n0, n1); break;
      }
    }
  });
}

template <int64_t KIND>
void matmul(const float* x, const uint8_t* w, float* out, int64_t M, int64_t K, int64_t N, bool int8) {
  if (int8) {
    const Int8Rows xq = quantize_rows(x, M, K);
    for_tiles<KIND>(xq, w, out, M, K, N, [&](auto rows, int64_t r, int64_t n0, int64_t n1) {
      tile_int8<KIND, decltype(rows)::value>(xq, w, out, K, N, r, n0, n1);
    });
  } else if constexpr (KIND != Q6_K) {
    // Each group's sum of x, 8 rows side by side (+ 8 floats so a tile's last load stays inside).
    const int64_t groups = K / QK, blocks8 = (M + 7) / 8;
    std::vector<float> xsum(blocks8 * groups * 8 + 8, 0.f);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t g = 0; g < groups; ++g) {
        float sum = 0.f;
        for (int64_t j = 0; j < QK; ++j) sum += x[m * K + g * QK + j];
        xsum[(m / 8 * groups + g) * 8 + m % 8] = sum;
      }
    for_tiles<KIND>(x, w, out, M, K, N, [&](auto rows, int64_t r, int64_t n0, int64_t n1) {
      tile_factored<KIND, decltype(rows)::value>(x, xsum.data(), w, out, K, N, r, n0, n1);
    });
  } else {
    for_tiles<KIND>(x, w, out, M, K, N, [&](auto rows, int64_t r, int64_t n0, int64_t n1) {
      tile<KIND, decltype(rows)::value>(x, w, out, K, N, r, n0, n1);
    });
  }
}

}  // namespace

void file_matmul(int64_t kind, const float* x, const uint8_t* w, float* out, int64_t M, int64_t K, int64_t N, bool int8) {
  by_kind(kind, [&](auto k) { matmul<k()>(x, w, out, M, K, N, int8); });
}

}  // namespace specdec::blocks
