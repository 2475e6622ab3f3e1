// x @ w.T on a GGUF file's own quantised blocks (built on first use by quant.py).
//
// A 4-bit model dequantised to float32 reads 4 bytes a weight every step; its GGUF blocks hold 0.56
// (Q4_K) to 1.06 (Q8_0). These kernels read the blocks as the file stores them (a row of w is its
// blocks back to back) and unpack them in registers, 32 weights at a time:
//
//   Q4_0  [d:f16][16 bytes: weight j in the low nibble of byte j, weight j+16 in the high]  w = d (q - 8)
//   Q4_1  [d:f16][m:f16][16 bytes, as Q4_0]                                              w = d q + m
//   Q5_0  [d:f16][4 bytes: bit j = the fifth bit of weight j][16 bytes, as Q4_0]          w = d (q - 16)
//   Q8_0  [d:f16][32 x int8]                                                             w = d q
//   Q4_K  256 weights: [d][dmin][6-bit scale and min of each 32][128 bytes of nibbles]   w = d sc q - dmin m
//   Q6_K  256 weights: [4-bit lows][2-bit highs][int8 scale of each 16][d]               w = d sc (q - 32)
//
// The codes are widened to float32. For a group whose 32 weights share one map w = a q + b (every type
// but Q6_K) each row takes a sum_j q_j x_j + b sum_j x_j (tile_factored: four FMAs a row and one for a,
// 8-30 % faster than dequantising first at one row, even at four, 2-11 % slower at 8 and more); Q6_K's codes are turned
// into exactly the float32 weights gguf-py's (and so transformers') dequantisation gives, with one FMA,
// and multiplied with FMAs (tile). Either way it is the float model's product up to float32 rounding
// (the order of the sums, and where a and b are applied). With int8 = true the activations are rounded
// to int8 per row and 32 columns and multiplied as integers (tile_int8: llama.cpp's arithmetic, a
// slightly different model).
//
// Row invariance: every row of x goes through the same instruction sequence whatever the number of
// rows multiplied together (rows are tiled, each with its own accumulators), so a position's logits do
// not depend on how many positions a pass scores, and speculative decoding emits what plain decoding
// emits token for token at T = 0.
//
// AVX2 + FMA + F16C (Intel since Haswell, AMD since Excavator); supported() checks AVX2 and FMA at run time.
// With int8 activations the blocks are repacked at load (pack_int8, linear_packed: see the section below)
// for vpdpbusd (AVX-512 VNNI), AMX-INT8 tiles, or vpmaddubsw on AVX2, the same numbers on each.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#define SPECDEC_AVX2 __attribute__((target("avx2,fma,f16c")))

#include "amx.h"     // TileConfig, amx_granted
#include "rowops.h"  // hsum, and the row-wise ops layer_step calls

namespace {

constexpr int64_t QK = 32;  // weights per group: every type is read 32 weights at a time
constexpr int64_t ROW_TILE = 8;  // rows of x sharing one unpacking of a group (8 accumulators + 4 weights fit 16 ymm)

enum Kind : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q8_0 = 8, Q4_K = 12, Q6_K = 14 };  // ggml's type ids

int64_t block_weights(int64_t kind) { return kind == Q4_K || kind == Q6_K ? 256 : 32; }

int64_t block_bytes(int64_t kind) {
  switch (kind) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q6_K: return 210;
  }
  TORCH_CHECK(false, "unsupported GGUF block type ", kind);
}

// f(std::integral_constant<int64_t, KIND>{}) for the block type `kind` names: the one place a run-time
// kind becomes a template argument.
template <typename F>
void by_kind(int64_t kind, F&& f) {
  switch (kind) {
    case Q4_0: f(std::integral_constant<int64_t, Q4_0>{}); return;
    case Q4_1: f(std::integral_constant<int64_t, Q4_1>{}); return;
    case Q5_0: f(std::integral_constant<int64_t, Q5_0>{}); return;
    case Q8_0: f(std::integral_constant<int64_t, Q8_0>{}); return;
    case Q4_K: f(std::integral_constant<int64_t, Q4_K>{}); return;
    case Q6_K: f(std::integral_constant<int64_t, Q6_K>{}); return;
  }
  TORCH_CHECK(false, "unsupported GGUF block type ", kind);
}

SPECDEC_AVX2 inline float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// 16 bytes of nibbles -> 32 codes: the low nibbles (weights 0-15), then the high ones (16-31).
SPECDEC_AVX2 inline __m256i nibbles16(const uint8_t* p) {
  __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i low = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), low), _mm_and_si128(raw, low));
}

// The codes of weights g*32 .. g*32+31 of a row (its blocks back to back), 32 bytes in weight order
// (signed for Q8_0, unsigned otherwise), and the affine map to the weights: w = a0 q + b0 for weights
// 0-15, a1 q + b1 for 16-31 (the two differ only in Q6_K, whose scales cover 16 weights).
template <int64_t KIND>
struct Group {
  __m256i q;
  float a0, a1, b0, b1;
  float d = 0.f, dmin = 0.f;          // Q4_K, Q6_K: the superblock's scale (and Q4_K's min scale),
  int8_t scale0 = 0, scale1 = 0;      // the integer scales of weights 0-15 and 16-31 (a = d scale),
  int8_t min = 0;                     // and Q4_K's integer min (b = -dmin min)
};

template <int64_t KIND>
SPECDEC_AVX2 inline Group<KIND> codes(const uint8_t* row, int64_t g) {
  Group<KIND> out;
  float a, b;
  if constexpr (KIND == Q8_0) {
    const uint8_t* block = row + g * 34;
    out.q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 2));
    a = half(block), b = 0.f;
  } else if constexpr (KIND == Q4_0 || KIND == Q4_1) {
    const uint8_t* block = row + g * (KIND == Q4_1 ? 20 : 18);
    out.q = nibbles16(block + (KIND == Q4_1 ? 4 : 2));
    a = half(block), b = KIND == Q4_1 ? half(block + 2) : -8.f * a;
  } else if constexpr (KIND == Q5_0) {  // [d][32 fifth bits][16 bytes of nibbles]: q - 16
    const uint8_t* block = row + g * 22;
    uint32_t bits;
    std::memcpy(&bits, block + 2, 4);
    const __m256i spread = _mm256_shuffle_epi8(  // byte j holds the byte of `bits` that has bit j
        _mm256_set1_epi32(static_cast<int>(bits)),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
    const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    out.q = _mm256_or_si256(nibbles16(block + 6), _mm256_and_si256(set, _mm256_set1_epi8(16)));
    a = half(block), b = -16.f * a;
  } else if constexpr (KIND == Q4_K) {
    // [d][dmin][12 bytes: eight 6-bit scales and mins][128 bytes]: group j of a superblock is the low
    // (j even) or high (j odd) nibbles of bytes 32 (j / 2) .. +31; w = d sc_j q - dmin m_j
    const uint8_t* block = row + (g / 8) * 144;
    const int j = static_cast<int>(g % 8);
    const uint8_t* sm = block + 4;
    int sc, m;
    if (j < 4) {
      sc = sm[j] & 63, m = sm[j + 4] & 63;
    } else {
      sc = (sm[j + 4] & 0xF) | ((sm[j - 4] >> 6) << 4), m = (sm[j + 4] >> 4) | ((sm[j] >> 6) << 4);
    }
    __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16 + 32 * (j / 2)));
    if (j % 2) raw = _mm256_srli_epi16(raw, 4);
    out.q = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));
    out.d = half(block), out.dmin = half(block + 2);
    out.scale0 = out.scale1 = static_cast<int8_t>(sc), out.min = static_cast<int8_t>(m);
    a = out.d * static_cast<float>(sc), b = -(out.dmin * static_cast<float>(m));
  } else {  // Q6_K: [128 bytes low nibbles][64 bytes of 2-bit highs][16 int8 scales][d]; q - 32
    // Group t of the 128-weight half h: low nibbles (t < 2) or high (t >= 2) of ql bytes 64h + 32 (t % 2)
    // .., high bits (qh >> 2t) & 3 of bytes 32h ..; weights 0-15 and 16-31 have scales 8h + 2t and + 1.
    const uint8_t* block = row + (g / 8) * 210;
    const int h = static_cast<int>(g % 8) / 4, t = static_cast<int>(g % 4);
    __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * h + 32 * (t % 2)));
    if (t >= 2) low = _mm256_srli_epi16(low, 4);
    __m256i high = _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * h)), 2 * t);
    out.q = _mm256_or_si256(_mm256_and_si256(low, _mm256_set1_epi8(0x0F)),
                            _mm256_slli_epi16(_mm256_and_si256(high, _mm256_set1_epi8(3)), 4));
    const auto* scales = reinterpret_cast<const int8_t*>(block + 192);
    out.d = half(block + 208), out.scale0 = scales[8 * h + 2 * t], out.scale1 = scales[8 * h + 2 * t + 1];
    out.a0 = out.d * out.scale0, out.a1 = out.d * out.scale1;
    out.b0 = -32.f * out.a0, out.b1 = -32.f * out.a1;
    return out;
  }
  out.a0 = out.a1 = a, out.b0 = out.b1 = b;
  return out;
}

// The dequantised weights of a group as four float32 vectors: codes widened to float, then w = a q + b
// with one FMA, which is exactly the float32 weight gguf-py's (and so transformers') dequantisation
// gives (a q is exact in float32 for every type here, so both round once).
template <int64_t KIND>
SPECDEC_AVX2 inline void group(const uint8_t* row, int64_t g, __m256 w[4]) {
  const Group<KIND> c = codes<KIND>(row, g);
  const __m128i lo = _mm256_castsi256_si128(c.q), hi = _mm256_extracti128_si256(c.q, 1);
  const __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
  for (int i = 0; i < 4; ++i) {
    const __m256i wide = KIND == Q8_0 ? _mm256_cvtepi8_epi32(parts[i]) : _mm256_cvtepu8_epi32(parts[i]);
    w[i] = _mm256_fmadd_ps(_mm256_set1_ps(i < 2 ? c.a0 : c.a1), _mm256_cvtepi32_ps(wide),
                           _mm256_set1_ps(i < 2 ? c.b0 : c.b1));
  }
}

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

// One group of G (16 or 32) activations rounded to int8 as llama.cpp's Q8 dot products take them: x ~ d q
// with d = max|x| / 127 and q = round(x / d) (ties to even, as std::nearbyint), |q| <= 127. Writes the G
// codes in order to q, the codes' sum to total, and returns d.
SPECDEC_AVX2 inline float quantize_group(const float* v, int64_t G, int8_t* q, int32_t& total) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // packs interleaves 128-bit halves
  __m256 part[4], amax = _mm256_setzero_ps();
  for (int64_t i = 0; i < G / 8; ++i) {
    part[i] = _mm256_loadu_ps(v + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_and_ps(part[i], magnitude));
  }
  __m128 top = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
  top = _mm_max_ps(top, _mm_movehl_ps(top, top));
  const float largest = _mm_cvtss_f32(_mm_max_ss(top, _mm_movehdup_ps(top)));
  const __m256 inverse = _mm256_set1_ps(largest > 0.f ? 127.f / largest : 0.f);
  __m256i codes[4], sum = _mm256_setzero_si256();
  for (int64_t i = 0; i < G / 8; ++i) {  // |x / d| <= 127 (+ rounding)
    codes[i] = _mm256_min_epi32(_mm256_set1_epi32(127), _mm256_max_epi32(_mm256_set1_epi32(-127),
                                _mm256_cvtps_epi32(_mm256_mul_ps(part[i], inverse))));
    sum = _mm256_add_epi32(sum, codes[i]);
  }
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  total = _mm_cvtsi128_si32(t);
  if (G == 32) {
    const __m256i bytes = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(codes[0], codes[1]), _mm256_packs_epi32(codes[2], codes[3])), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), bytes);
  } else {  // G = 16: two vectors of 8
    const __m128i bytes = _mm_packs_epi16(_mm_packs_epi32(_mm256_castsi256_si128(codes[0]), _mm256_extracti128_si256(codes[0], 1)),
                                          _mm_packs_epi32(_mm256_castsi256_si128(codes[1]), _mm256_extracti128_si256(codes[1], 1)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), bytes);
  }
  return largest / 127.f;
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

// ---- int8 activations on AVX-512 VNNI and AMX-INT8, the blocks repacked once at load ----
//
// pack_int8 rewrites a matrix's blocks for the two instructions that multiply bytes: per 16 output rows
// (a "block" here) and group of G weights sharing one map w = a q + b (G = 32, 16 for Q6_K, whose
// scales cover 16), the codes as unsigned bytes in the VNNI order both take, t = (k / 4) 64 + n 4 +
// k % 4 for column n and weight k of the group (G / 4 rows of 64 bytes: an AMX B tile, or G / 4 zmm
// for vpdpbusd against one activation dword each), then the group's a (and b where it is not a
// constant times a) for the 16 columns. The codes keep the file's bits: 4-bit codes as nibbles (byte j
// holds bytes j and j + 8 G of the order), Q5_0's fifth bit and Q6_K's two high bits as bit planes
// (bit t of plane p is bit 4 + p of byte t), Q8_0's bytes as they are, offset by 128 (q + 128, b =
// -128 a). The scales keep the file's too: float16 a (and b) a group for Q4_0, Q4_1, Q5_0, Q8_0; for
// the superblock types (Q4_K, Q6_K) a group holds its integer scales as bytes (Q4_K's 6-bit sc and m,
// Q6_K's int8 scale) and the superblock's float16 d (and -dmin) for the 16 columns follow its groups,
// a = d sc and b = -dmin m formed in float32 as they are read (exact: 11 by 6 or 7 bits). So a
// weight's bytes are the file's within 3 % (Q4_1 20 of 20 a group, Q4_K 18.5 of 18, Q6_K 13.25 of
// 13.125); with the products stored as float32 Q4_K read 1.33 times its file.
//
// The products: activations rounded to int8 per row and group (x ~ d q, as the AVX2 int8 path) and
// each group's integer sum s_int = sum_k q_w q_x formed exactly, by vpdpbusd (few rows) or tdpbsud (AMX,
// many rows), then acc = fma(float(s_int), a d, acc); acc = fma(b, d sum_k q_x, acc), group after group.
// The integer sums are exact whichever instruction makes them and the float steps are one function
// (accumulate_group), so a row's result does not depend on the path or the rows beside it.

#define SPECDEC_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
#define SPECDEC_AMX_INT8 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c,amx-tile,amx-int8")))

#ifndef SPECDEC_PACKED_AHEAD
#define SPECDEC_PACKED_AHEAD 4096  // bytes of a thread's stream prefetched ahead
#endif

constexpr int64_t PACKED_COLS = 16;  // output rows a block holds: one zmm of int32 sums, one AMX C tile row
constexpr int64_t kPackedFlag = 256;  // kind | kPackedFlag: w is pack_int8's layout

struct Format {
  int64_t G;      // weights a group
  bool bytes;     // codes stored as bytes (else nibbles)
  int planes;     // bit planes above the nibbles
  bool has_b;     // b stored (else b = offset a)
  float offset;
  int64_t super;  // groups a superblock (its d, dmin after them; a group's scales as int8), 0: none
};

constexpr Format format_of(int64_t kind) {
  return kind == Q4_0   ? Format{32, false, 0, false, -8.f, 0}
         : kind == Q4_1 ? Format{32, false, 0, true, 0.f, 0}
         : kind == Q5_0 ? Format{32, false, 1, false, -16.f, 0}
         : kind == Q8_0 ? Format{32, true, 0, false, -128.f, 0}
         : kind == Q4_K ? Format{32, false, 0, true, 0.f, 8}
                        : Format{16, false, 2, false, -32.f, 16};  // Q6_K
}

constexpr int64_t code_bytes(const Format& f) { return f.bytes ? PACKED_COLS * f.G : PACKED_COLS * f.G / 2; }
constexpr int64_t plane_bytes(const Format& f) { return PACKED_COLS * f.G / 8; }
constexpr int64_t scale_bytes(const Format& f) { return PACKED_COLS * (f.super ? 1 : 2); }  // a's (b's as many)
constexpr int64_t group_bytes(const Format& f) {
  return code_bytes(f) + f.planes * plane_bytes(f) + scale_bytes(f) * (f.has_b ? 2 : 1);
}
constexpr int64_t tail_bytes(const Format& f) { return f.super ? PACKED_COLS * 2 * (f.has_b ? 2 : 1) : 0; }  // d, -dmin
constexpr int64_t super_bytes(const Format& f) { return f.super ? f.super * group_bytes(f) + tail_bytes(f) : group_bytes(f); }
// A block's bytes (16 output rows) for K inputs.
constexpr int64_t packed_bytes(const Format& f, int64_t K) { return K / f.G / (f.super ? f.super : 1) * super_bytes(f); }

// Group g of the block at p, and its superblock's d (and -dmin) where the format has them.
template <int64_t KIND>
inline const uint8_t* group_at(const uint8_t* p, int64_t g) {
  constexpr Format F = format_of(KIND);
  if constexpr (F.super) return p + (g / F.super) * super_bytes(F) + (g % F.super) * group_bytes(F);
  return p + g * group_bytes(F);
}

template <int64_t KIND>
inline const uint8_t* tail_at(const uint8_t* p, int64_t g) {
  constexpr Format F = format_of(KIND);
  return p + (g / (F.super ? F.super : 1)) * super_bytes(F) + (F.super ? F.super : 1) * group_bytes(F);
}

// The bytes that group g's products read: its own, and after the last of a superblock the d's.
template <int64_t KIND>
constexpr int64_t read_bytes(int64_t g) {
  constexpr Format F = format_of(KIND);
  return group_bytes(F) + (F.super && g % F.super == F.super - 1 ? tail_bytes(F) : 0);
}

void check_kind(int64_t kind) {
  TORCH_CHECK(kind == Q4_0 || kind == Q4_1 || kind == Q5_0 || kind == Q8_0 || kind == Q4_K || kind == Q6_K,
              "unsupported GGUF block type ", kind);
}

SPECDEC_AVX2 void store_half(uint8_t* p, float v) {
  const uint16_t h = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
  TORCH_CHECK(_cvtsh_ss(h) == v, "a float16 scale did not survive packing");
  std::memcpy(p, &h, 2);
}

template <int64_t KIND>
SPECDEC_AVX2 void pack_block(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t b, uint8_t* out) {
  constexpr Format F = format_of(KIND);
  constexpr int64_t halves = QK / F.G;  // groups a 32-weight decode holds
  std::vector<uint8_t> order(PACKED_COLS * F.G);
  std::vector<float> a(PACKED_COLS), off(PACKED_COLS), d(PACKED_COLS), dmin(PACKED_COLS);
  std::vector<int8_t> sc(PACKED_COLS), m(PACKED_COLS);
  for (int64_t g32 = 0; g32 < K / QK; ++g32)
    for (int64_t h = 0; h < halves; ++h) {
      const int64_t g = g32 * halves + h;
      for (int64_t n = 0; n < PACKED_COLS; ++n) {
        const Group<KIND> c = codes<KIND>(w + (b * PACKED_COLS + n) * row_bytes, g32);
        alignas(32) uint8_t q[32];
        _mm256_store_si256(reinterpret_cast<__m256i*>(q), c.q);
        for (int64_t k = 0; k < F.G; ++k) {
          uint8_t v = q[h * F.G + k];
          if constexpr (KIND == Q8_0) v ^= 0x80;  // q + 128
          order[(k / 4) * 64 + n * 4 + k % 4] = v;
        }
        a[n] = h ? c.a1 : c.a0, off[n] = KIND == Q8_0 ? -128.f * a[n] : h ? c.b1 : c.b0;  // Q8_0: the + 128
        if (!F.has_b) TORCH_CHECK(off[n] == F.offset * a[n], "a block's offset is not ", F.offset, " times its scale");
        if constexpr (F.super != 0) {
          d[n] = c.d, dmin[n] = -c.dmin, sc[n] = h ? c.scale1 : c.scale0, m[n] = c.min;
          TORCH_CHECK(d[n] * static_cast<float>(sc[n]) == a[n] && (!F.has_b || dmin[n] * static_cast<float>(m[n]) == off[n]),
                      "a superblock's scales do not give its groups' maps");
        }
      }
      uint8_t* p = const_cast<uint8_t*>(group_at<KIND>(out, g));
      const int64_t n_order = PACKED_COLS * F.G;
      if (F.bytes) {
        std::memcpy(p, order.data(), n_order);
      } else {
        for (int64_t j = 0; j < n_order / 2; ++j)
          p[j] = static_cast<uint8_t>((order[j] & 0x0F) | (order[j + n_order / 2] & 0x0F) << 4);
        for (int pl = 0; pl < F.planes; ++pl) {
          uint8_t* plane = p + code_bytes(F) + pl * plane_bytes(F);
          for (int64_t t = 0; t < n_order; ++t)
            if (order[t] >> (4 + pl) & 1) plane[t / 8] |= static_cast<uint8_t>(1u << (t % 8));
        }
      }
      uint8_t* scales = p + code_bytes(F) + F.planes * plane_bytes(F);
      if constexpr (F.super != 0) {
        std::memcpy(scales, sc.data(), PACKED_COLS);
        if (F.has_b) std::memcpy(scales + scale_bytes(F), m.data(), PACKED_COLS);
        uint8_t* tail = const_cast<uint8_t*>(tail_at<KIND>(out, g));
        for (int64_t n = 0; n < PACKED_COLS; ++n) {  // the same for each group of the superblock
          store_half(tail + 2 * n, d[n]);
          if (F.has_b) store_half(tail + 2 * PACKED_COLS + 2 * n, dmin[n]);
        }
      } else {
        for (int64_t n = 0; n < PACKED_COLS; ++n) {
          store_half(scales + 2 * n, a[n]);
          if (F.has_b) store_half(scales + scale_bytes(F) + 2 * n, off[n]);
        }
      }
    }
}

// A matrix's blocks (N, row bytes), N a multiple of 16 -> (N / 16, groups x group bytes) in the layout above.
torch::Tensor pack_int8(torch::Tensor w, int64_t kind, int64_t K) {
  check_kind(kind);
  TORCH_CHECK(w.scalar_type() == torch::kUInt8 && w.dim() == 2 && w.is_contiguous(), "w: (N, blocks bytes) uint8");
  TORCH_CHECK(K % block_weights(kind) == 0 && w.size(1) == K / block_weights(kind) * block_bytes(kind),
              "w's rows do not hold ", K, " weights of this block type");
  TORCH_CHECK(w.size(0) % PACKED_COLS == 0, "pack_int8 takes a multiple of 16 output rows, not ", w.size(0));
  const Format f = format_of(kind);
  const int64_t blocks = w.size(0) / PACKED_COLS, row_bytes = w.size(1);
  torch::Tensor out = torch::zeros({blocks, packed_bytes(f, K)}, w.options());
  const uint8_t* wp = w.data_ptr<uint8_t>();
  uint8_t* op = out.data_ptr<uint8_t>();
  const int64_t stride = out.size(1);
  by_kind(kind, [&](auto k) {
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) pack_block<k()>(wp, row_bytes, K, b, op + b * stride);
    });
  });
  return out;
}

// Activations rounded to int8 per row and group of G (x ~ d q, the AVX2 int8 path's rounding), with s = d
// sum q (and the integer sum q itself, which the AVX2 products of Q8_0 add back), laid out by 16 rows:
// group g of rows 16 i .. 16 i + 15 is one AMX A tile, q[(i groups + g) 16 G ..] (16 rows of G bytes),
// and their d and s sit side by side; rows past M are zero (quantize_acts_into: where asked). AVX2 only,
// so every path (AVX2, VNNI, AMX) multiplies the same codes.
struct PackedActs {
  int64_t M, K, groups;
  std::vector<int8_t> q;
  std::vector<float> d, s;
  std::vector<int32_t> total;
  int64_t at(int64_t m, int64_t g) const { return ((m / 16) * groups + g) * 16 + m % 16; }  // d, s; q at G times
};

// Rows [m0, m1) of x into out's int8 groups (each group's own scale; rows are independent).
SPECDEC_AVX2 void quantize_rows(PackedActs& out, const float* x, int64_t m0, int64_t m1, int64_t K, int64_t G) {
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t g = 0; g < out.groups; ++g) {
      const int64_t at = out.at(m, g);
      out.d[at] = quantize_group(x + m * K + g * G, G, out.q.data() + at * G, out.total[at]);
      out.s[at] = out.d[at] * static_cast<float>(out.total[at]);
    }
}

// quantize_acts into `out`, whose buffers are kept from call to call (a SmolLM2 step quantises ~120
// inputs; allocating and zeroing 16 rows' buffers for each cost ~3 % of a one-row step on Zen 2). Rows
// past M are zeroed only where `zero_padding`: AMX reads whole 16-row tiles, the AVX2 and vpdpbusd
// products read rows below M alone.
SPECDEC_AVX2 void quantize_acts_into(PackedActs& out, const float* x, int64_t M, int64_t K, int64_t G, bool zero_padding) {
  const int64_t groups = K / G, Mp = (M + 15) / 16 * 16;
  out.M = M, out.K = K, out.groups = groups;
  out.q.resize(Mp * K), out.d.resize(Mp * groups), out.s.resize(Mp * groups), out.total.resize(Mp * groups);
  if (zero_padding && M < Mp)
    for (int64_t g = 0; g < groups; ++g) {  // the last tile's rows M % 16 .. 15, in every group
      const int64_t at = out.at(M, g), rows = Mp - M;
      std::memset(out.q.data() + at * G, 0, rows * G);
      std::fill_n(out.d.data() + at, rows, 0.f), std::fill_n(out.s.data() + at, rows, 0.f);
      std::fill_n(out.total.data() + at, rows, 0);
    }
  if (M < 32) {  // a step's few rows: not worth waking the other threads
    quantize_rows(out, x, 0, M, K, G);
    return;
  }
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) { quantize_rows(out, x, m0, m1, K, G); });  // a prompt
}

SPECDEC_AVX2 PackedActs quantize_acts(const float* x, int64_t M, int64_t K, int64_t G) {
  PackedActs out{};
  quantize_acts_into(out, x, M, K, G, true);
  return out;
}

// 16 int8 and 16 float16 scales as float32.
SPECDEC_VNNI inline __m512 ints16(const uint8_t* q) {
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
}
SPECDEC_VNNI inline __m512 halves16(const uint8_t* q) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
}

// A group's codes in VNNI order (G / 4 zmm) and its a and b for the block's 16 columns (p: the group,
// tail: its superblock's d and -dmin, for the types that have them).
template <int64_t KIND>
SPECDEC_VNNI inline void unpack_group(const uint8_t* p, const uint8_t* tail, __m512i t[], __m512& a, __m512& b) {
  constexpr Format F = format_of(KIND);
  constexpr int64_t n = F.G / 4;
  if constexpr (F.bytes) {
    for (int64_t i = 0; i < n; ++i) t[i] = _mm512_loadu_si512(p + 64 * i);
  } else {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t i = 0; i < n / 2; ++i) {
      const __m512i v = _mm512_loadu_si512(p + 64 * i);
      t[i] = _mm512_and_si512(v, low);
      t[i + n / 2] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
    }
    for (int pl = 0; pl < F.planes; ++pl) {
      const uint8_t* plane = p + code_bytes(F) + pl * plane_bytes(F);
      const __m512i bit = _mm512_set1_epi8(static_cast<char>(16 << pl));
      for (int64_t i = 0; i < n; ++i) {
        uint64_t mask;
        std::memcpy(&mask, plane + 8 * i, 8);
        t[i] = _mm512_mask_add_epi8(t[i], static_cast<__mmask64>(mask), t[i], bit);
      }
    }
  }
  const uint8_t* scales = p + code_bytes(F) + F.planes * plane_bytes(F);
  if constexpr (F.super != 0) {  // d sc and -dmin m, exact in float32
    a = _mm512_mul_ps(halves16(tail), ints16(scales));
    b = F.has_b ? _mm512_mul_ps(halves16(tail + 2 * PACKED_COLS), ints16(scales + scale_bytes(F)))
                : _mm512_mul_ps(a, _mm512_set1_ps(F.offset));
  } else {
    a = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
    b = F.has_b ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + scale_bytes(F))))
                : _mm512_mul_ps(a, _mm512_set1_ps(F.offset));
  }
}

// The float steps after a group's integer sums, the one place they happen on either path.
__attribute__((always_inline)) SPECDEC_VNNI inline __m512 accumulate_group(__m512i sums, __m512 a, __m512 b, float d, float s, __m512 acc) {
  acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), _mm512_mul_ps(a, _mm512_set1_ps(d)), acc);
  return _mm512_fmadd_ps(b, _mm512_set1_ps(s), acc);
}

SPECDEC_AVX2 inline void prefetch_group(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + SPECDEC_PACKED_AHEAD + o), _MM_HINT_T0);
}

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

// ---- The packed layout on AVX2 (no AVX-512 VNNI: AMD before Zen 4, Intel client and server before Ice Lake) ----
//
// vpdpbusd (four unsigned code bytes times four signed activation bytes, summed into an int32 lane) becomes
// vpmaddubsw (pairs into int16) and vpmaddwd against ones (pairs of pairs into int32), a 16-column block
// taken as two halves of 8 columns (32 bytes of each 64-byte step of the order). The int16 pair sums of
// several steps are added before vpmaddwd where they cannot overflow: codes below 16 (Q4_0, Q4_1, Q4_K)
// all 8 steps of a group (8 x 2 x 15 x 127 = 30480), Q5_0's (below 32) 4, Q6_K's (below 64) 2. Q8_0's
// bytes (q + 128, up to 255) would saturate vpmaddubsw's pairs, so they take the sign trick (|q| times x
// with q's sign; |-128| x 127 x 2 still fits) and 128 sum(x) is added back. The integer sums are then
// vpdpbusd's exactly and the float steps are accumulate_group's lane by lane, so a row's results are
// those of the VNNI and AMX paths to the bit, whatever the rows beside it.

// Steps i and i + STEPS / 2 of a group's codes (4-bit: one load gives both) for columns 8 h .. 8 h + 7,
// bit planes added; for byte codes step i alone (in lo).
template <int64_t KIND>
SPECDEC_AVX2 inline void avx2_steps(const uint8_t* p, int64_t i, int64_t h, __m256i& lo, __m256i& hi) {
  constexpr Format F = format_of(KIND);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * i + 32 * h));
  if constexpr (F.bytes) {
    lo = v;
    return;
  }
  const __m256i low = _mm256_set1_epi8(0x0F);
  lo = _mm256_and_si256(v, low);
  hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
  if constexpr (F.planes > 0) {
    constexpr int64_t half_steps = F.G / 8;
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
    for (int pl = 0; pl < F.planes; ++pl) {
      const uint8_t* plane = p + code_bytes(F) + pl * plane_bytes(F);
      const __m256i bit = _mm256_set1_epi8(static_cast<char>(16 << pl));
      for (int64_t j = 0; j < 2; ++j) {  // byte t of the order: bit t % 8 of plane byte t / 8
        uint32_t bits;
        std::memcpy(&bits, plane + (64 * (i + j * half_steps) + 32 * h) / 8, 4);
        const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
        const __m256i set = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bytes, select), select), bit);
        (j ? hi : lo) = _mm256_or_si256(j ? hi : lo, set);
      }
    }
  }
}

SPECDEC_AVX2 inline __m256i broadcast_dword(const int8_t* q) {
  int32_t dword;
  std::memcpy(&dword, q, 4);
  return _mm256_set1_epi32(dword);
}

// Steps i and i + STEPS / 2 of a group (codes lo, hi from avx2_steps) times a row's activations q, as
// int16 pair sums.
template <int64_t STEPS>
SPECDEC_AVX2 inline __m256i step_pairs(__m256i lo, __m256i hi, const int8_t* q, int64_t i) {
  return _mm256_add_epi16(_mm256_maddubs_epi16(lo, broadcast_dword(q + 4 * i)),
                          _mm256_maddubs_epi16(hi, broadcast_dword(q + 4 * (i + STEPS / 2))));
}

// 8 int8 and 8 float16 scales as float32.
SPECDEC_AVX2 inline __m256 ints8(const uint8_t* q) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}
SPECDEC_AVX2 inline __m256 halves8(const uint8_t* q) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
}

// Half h (columns 8 h .. 8 h + 7) of one group of a block for rows r0 .. r0 + R - 1 of x: the group's
// integer sums, then accumulate_group's float steps into acc, 8 lanes at a time.
template <int64_t KIND, int64_t R>
__attribute__((always_inline)) SPECDEC_AVX2 inline void avx2_half_group(const PackedActs& x, const uint8_t* p,
                                                                        const uint8_t* tail, int64_t g,
                                                                        int64_t h, int64_t r0, __m256 acc[R]) {
  constexpr Format F = format_of(KIND);
  constexpr int64_t STEPS = F.G / 4;
  constexpr int64_t RUN = F.bytes ? 1 : F.planes == 0 ? STEPS : F.planes == 1 ? 4 : 2;  // steps summed as int16
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t at0 = x.at(r0, g);
  const int8_t* q0 = x.q.data() + at0 * F.G;
  __m256i sums[R];
  if constexpr (F.bytes) {  // Q8_0: the sign trick on q = byte - 128
#pragma GCC unroll 16
    for (int64_t r = 0; r < R; ++r) sums[r] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int64_t i = 0; i < STEPS; ++i) {
      __m256i code, unused;
      avx2_steps<KIND>(p, i, h, code, unused);
      const __m256i q = _mm256_xor_si256(code, _mm256_set1_epi8(static_cast<char>(0x80)));
      const __m256i magnitude = _mm256_abs_epi8(q);
#pragma GCC unroll 16
      for (int64_t r = 0; r < R; ++r) {
        const __m256i xs = _mm256_sign_epi8(broadcast_dword(q0 + r * F.G + 4 * i), q);
        sums[r] = _mm256_add_epi32(sums[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, xs), ones));
      }
    }
#pragma GCC unroll 16
    for (int64_t r = 0; r < R; ++r)
      sums[r] = _mm256_add_epi32(sums[r], _mm256_set1_epi32(128 * x.total[at0 + r]));
  } else {
    // int16 pair sums over a run of RUN steps, then one vpmaddwd a run into the int32 sums. 4-bit codes
    // take the whole group as one run, so no int32 sums live through its steps (when they did, 8 rows
    // spilled sums and accumulators to the stack every group; SmolLM2's layers at 16 rows 17.4 -> 16.0
    // ms on Zen 2). The same integers in any order, the same bits.
#pragma GCC unroll 4
    for (int64_t run = 0; run < STEPS / RUN; ++run) {
      const int64_t first = run * RUN / 2;  // a run's first two steps start its sums (no zeroed registers)
      __m256i lo, hi, pairs[R];
      avx2_steps<KIND>(p, first, h, lo, hi);
#pragma GCC unroll 16
      for (int64_t r = 0; r < R; ++r) pairs[r] = step_pairs<STEPS>(lo, hi, q0 + r * F.G, first);
#pragma GCC unroll 1
      for (int64_t i = first + 1; i < (run + 1) * RUN / 2; ++i) {  // rolled: unrolled, GCC spilled
        avx2_steps<KIND>(p, i, h, lo, hi);
#pragma GCC unroll 16
        for (int64_t r = 0; r < R; ++r) pairs[r] = _mm256_add_epi16(pairs[r], step_pairs<STEPS>(lo, hi, q0 + r * F.G, i));
      }
#pragma GCC unroll 16
      for (int64_t r = 0; r < R; ++r) {
        const __m256i run_sums = _mm256_madd_epi16(pairs[r], ones);
        sums[r] = run == 0 ? run_sums : _mm256_add_epi32(sums[r], run_sums);
      }
    }
  }
  const uint8_t* scales = p + code_bytes(F) + F.planes * plane_bytes(F);
  __m256 a, b;
  if constexpr (F.super != 0) {  // unpack_group's d sc and -dmin m, for columns 8 h ..
    a = _mm256_mul_ps(halves8(tail + 16 * h), ints8(scales + 8 * h));
    b = F.has_b ? _mm256_mul_ps(halves8(tail + 2 * PACKED_COLS + 16 * h), ints8(scales + scale_bytes(F) + 8 * h))
                : _mm256_mul_ps(a, _mm256_set1_ps(F.offset));
  } else {
    a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 16 * h)));
    b = F.has_b ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + scale_bytes(F) + 16 * h)))
                : _mm256_mul_ps(a, _mm256_set1_ps(F.offset));
  }
  const float* d = x.d.data() + at0;
  const float* s = x.s.data() + at0;
#pragma GCC unroll 16
  for (int64_t r = 0; r < R; ++r) {  // accumulate_group's steps, 8 lanes at a time
    acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r]), _mm256_mul_ps(a, _mm256_set1_ps(d[r])), acc[r]);
    acc[r] = _mm256_fmadd_ps(b, _mm256_set1_ps(s[r]), acc[r]);
  }
}

// Rows r0 .. r0 + R - 1 of x (within one 16-row tile of PackedActs) times blocks [b0, b1): each group
// unpacked once for the R rows, each row's int16 then int32 sums in registers, both halves of a block's
// 16 columns (8 lanes each) in one pass over its groups. (In a pass a half, the second pass read lines
// already in the cache, and the memory stood idle with nothing prefetched: SmolLM2's products at 1-4 rows
// took 1.08-1.22x the time on Zen 2, at 8-16 the same; docs/results/zen2-epyc/one-pass-ab.txt.) A
// column's sums are the same integers and float steps in the same order either way.
template <int64_t KIND, int64_t R>
SPECDEC_AVX2 void avx2_rows(const PackedActs& x, const uint8_t* w, int64_t stride, float* out, int64_t N, int64_t r0,
                            int64_t b0, int64_t b1) {
  static_assert(R >= 1 && R <= 16, "a row tile is at most 16 rows");
  for (int64_t blk = b0; blk < b1; ++blk) {
    __m256 acc[2][R];
#pragma GCC unroll 2
    for (int64_t h = 0; h < 2; ++h)
#pragma GCC unroll 16
      for (int64_t r = 0; r < R; ++r) acc[h][r] = _mm256_setzero_ps();
    const uint8_t* block = w + blk * stride;
    for (int64_t g = 0; g < x.groups; ++g) {
      const uint8_t* p = group_at<KIND>(block, g);
      const uint8_t* tail = tail_at<KIND>(block, g);
      prefetch_group(p, read_bytes<KIND>(g));
      avx2_half_group<KIND, R>(x, p, tail, g, 0, r0, acc[0]);
      avx2_half_group<KIND, R>(x, p, tail, g, 1, r0, acc[1]);
    }
#pragma GCC unroll 2
    for (int64_t h = 0; h < 2; ++h)
#pragma GCC unroll 16
      for (int64_t r = 0; r < R; ++r) _mm256_storeu_ps(out + (r0 + r) * N + blk * PACKED_COLS + 8 * h, acc[h][r]);
  }
}

#ifndef SPECDEC_AVX2_ROWS
#define SPECDEC_AVX2_ROWS 8  // rows a tile on AVX2 (Zen 3, SmolLM2, 16 rows: 4 took 1.2x the time of 8, 16 about 8)
#endif

template <int64_t KIND, int64_t... Less>
void avx2_rest(std::integer_sequence<int64_t, Less...>, const PackedActs& x, const uint8_t* w, int64_t stride,
               float* out, int64_t N, int64_t r0, int64_t rows, int64_t b0, int64_t b1) {
  ((rows == Less + 1 ? avx2_rows<KIND, Less + 1>(x, w, stride, out, N, r0, b0, b1) : void()), ...);
}

bool vnni_supported() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma");
}

// Whether the packed products take vpdpbusd (where the CPU has AVX-512 VNNI; set_vnni turns it off, for
// tests and benchmarks: the AVX2 products give the same bits).
bool& vnni_on() {
  static bool on = vnni_supported();
  return on;
}

int64_t vnni_max_rows = 24;  // more rows go to AMX where it runs: even with vpdpbusd at 32 rows, 10-15 % faster
                              // at 64 (SmolLM2, Xeon); set_packed_rows changes it (tests, benchmarks)

// The last rows (1 to 15) of x as one tile of exactly that many: the weights stream once for them (as
// 8 + 4 + 3 tiles they streamed three times; 12 rows cost 7.6 ms a SmolLM2 pass on Zen 5 against 5.2 for 8).
template <int64_t KIND, int64_t... Less>
void vnni_rest(std::integer_sequence<int64_t, Less...>, const PackedActs& x, const uint8_t* w, int64_t stride,
               float* out, int64_t N, int64_t r0, int64_t rows, int64_t b0, int64_t b1) {
  ((rows == Less + 1 ? vnni_rows<KIND, Less + 1>(x, w, stride, out, N, r0, b0, b1) : void()), ...);
}

bool amx_int8() { return amx_granted(true); }

template <int64_t KIND>
void packed_matmul(const float* xp, const uint8_t* w, float* out, int64_t M, int64_t K, int64_t N) {
  constexpr Format F = format_of(KIND);
  const bool amx = M > vnni_max_rows && vnni_on() && amx_int8();
  static thread_local PackedActs buffer;  // one call at a time on a thread: its buffers serve the next
  quantize_acts_into(buffer, xp, M, K, F.G, amx);
  const PackedActs& x = buffer;
  const int64_t blocks = N / PACKED_COLS, stride = packed_bytes(F, K);
  const bool vnni = vnni_on();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    if (amx) {
      amx_rows<KIND>(x, w, stride, out, N, b0, b1);
      return;
    }
    int64_t r = 0;
    if (!vnni) {
      constexpr int64_t T = SPECDEC_AVX2_ROWS;
      for (; r + T <= M; r += T) avx2_rows<KIND, T>(x, w, stride, out, N, r, b0, b1);
      if (r < M) avx2_rest<KIND>(std::make_integer_sequence<int64_t, T - 1>{}, x, w, stride, out, N, r, M - r, b0, b1);
      return;
    }
    for (; r + 16 <= M; r += 16) vnni_rows<KIND, 16>(x, w, stride, out, N, r, b0, b1);
    if (r < M) vnni_rest<KIND>(std::make_integer_sequence<int64_t, 15>{}, x, w, stride, out, N, r, M - r, b0, b1);
  });
}

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

bool amx_bf16() { return amx_granted(false); }

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
void prompt_matmul(const float* xp, const uint8_t* w, float* out, int64_t M, int64_t K, int64_t N) {
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

// For tests: whether the AMX products hand a thread's tiles back as they found them (amx.h): a
// configuration unlike any here is loaded, both tile products run on this thread, and what is loaded
// after is compared with it.
SPECDEC_AMX_BF16 bool tiles_left_as_found() {
  TORCH_CHECK(amx_int8() && amx_bf16(), "this CPU does not grant AMX-INT8 and AMX-BF16 tiles");
  TileConfig theirs;
  theirs.rows[0] = 3, theirs.colsb[0] = 12, theirs.rows[5] = 7, theirs.colsb[5] = 20;
  restore_tiles(theirs);
  constexpr int64_t K = 64, M = 20;
  std::vector<float> x(M * K, 0.5f), out(M * PACKED_COLS);
  std::vector<uint8_t> w(K / 32 * group_bytes(format_of(Q8_0)), 0);
  const PackedActs acts = quantize_acts(x.data(), M, K, 32);
  amx_rows<Q8_0>(acts, w.data(), static_cast<int64_t>(w.size()), out.data(), PACKED_COLS, 0, 1);
  std::vector<uint16_t> xb(32 * K, 0), wb(16 * K, 0);
  prompt_tiles(xb.data(), wb.data(), out.data(), M, K, PACKED_COLS, 0, 2, 0, 1);
  const TileConfig after = tiles_in_use();
  TileConfig none;
  none.palette = 0;  // all zeros: the tiles' initial state again
  restore_tiles(none);
  return std::memcmp(&after, &theirs, sizeof(TileConfig)) == 0;
}

bool packed_supported() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

// x @ w.T on pack_int8's layout: int8 activations (packed_matmul), or for prompt rows the bfloat16 tiles
// (prompt_matmul: K a multiple of 32, AMX-BF16).
torch::Tensor linear_packed(const torch::Tensor& x, const torch::Tensor& w, int64_t kind, int64_t K, bool prompt) {
  TORCH_CHECK(packed_supported(), "the packed int8 kernels need AVX2, FMA and F16C");
  check_kind(kind);
  const Format f = format_of(kind);
  TORCH_CHECK(w.scalar_type() == torch::kUInt8 && w.dim() == 2 && w.is_contiguous(), "w: packed uint8 blocks");
  TORCH_CHECK(K % f.G == 0 && w.size(1) == packed_bytes(f, K), "w is not pack_int8's layout for ", K, " inputs");
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && x.size(-1) == K, "x: float32 with ", K, " features");
  TORCH_CHECK(!prompt || (K % 32 == 0 && amx_bf16()), "prompt rows on the tiles need AMX-BF16 and K a multiple of 32");
  torch::Tensor x2 = as_rows(x, K);
  const int64_t M = x2.size(0), N = w.size(0) * PACKED_COLS;
  torch::Tensor out = torch::empty({M, N}, x.options());
  const float* xp = x2.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  if (M > 0) by_kind(kind, [&](auto k) {
      if (prompt) {
        prompt_matmul<k()>(xp, wp, op, M, K, N);
      } else {
        packed_matmul<k()>(xp, wp, op, M, K, N);
      }
    });
  return shaped_as(out, x, N);
}

// Whether prompt rows take the bfloat16 tiles (where the CPU has AMX-BF16; set_prompt_tiles turns them
// off or on again for tests and benchmarks).
bool& prompt_tiles_on() {
  static bool on = amx_bf16();
  return on;
}

// Whether prompt rows times w take prompt_matmul: packed blocks whose inputs are whole 32-weight tiles.
bool takes_prompt_tiles(int64_t kind, int64_t K) { return (kind & kPackedFlag) && K % 32 == 0 && prompt_tiles_on(); }

bool supported() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

torch::Tensor linear(torch::Tensor x, torch::Tensor w, int64_t kind, int64_t in_features, bool int8,
                     bool prompt = false) {
  if (kind & kPackedFlag)
    return linear_packed(x, w, kind & ~kPackedFlag, in_features, prompt && takes_prompt_tiles(kind, in_features));
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "quant.linear takes float32 activations");
  TORCH_CHECK(w.scalar_type() == torch::kUInt8 && w.dim() == 2 && w.is_contiguous(), "w: (N, blocks bytes) uint8");
  const int64_t K = in_features, per_block = block_weights(kind);
  TORCH_CHECK(K % per_block == 0, "in_features must be a multiple of ", per_block, " for this block type");
  TORCH_CHECK(w.size(1) == K / per_block * block_bytes(kind), "w's rows hold ", w.size(1), " bytes, expected ",
              K / per_block * block_bytes(kind));
  TORCH_CHECK(x.size(-1) == K, "x has ", x.size(-1), " features, w takes ", K);
  torch::Tensor x2 = as_rows(x, K);
  const int64_t M = x2.size(0), N = w.size(0);
  torch::Tensor out = torch::empty({M, N}, x.options());
  const float* xp = x2.data_ptr<float>();
  const uint8_t* wp = w.data_ptr<uint8_t>();
  float* op = out.data_ptr<float>();
  by_kind(kind, [&](auto k) { matmul<k()>(xp, wp, op, M, K, N, int8); });
  return shaped_as(out, x, N);
}

// Which rows of a pass are prompt rows (their sequences' chunks want no logits): rows are each
// sequence's in turn.
struct PromptRows {
  bool all = false, any = false;
  torch::Tensor prompt, other;  // row indices, when some are and some are not

  PromptRows(const std::vector<int64_t>& rows, const std::vector<bool>& prompts) {
    std::vector<int64_t> p, o;
    int64_t row = 0;
    for (size_t s = 0; s < rows.size(); ++s)
      for (int64_t r = 0; r < rows[s]; ++r, ++row) (prompts[s] ? p : o).push_back(row);
    all = o.empty(), any = !p.empty();
    if (any && !all) prompt = torch::tensor(p, torch::kLong), other = torch::tensor(o, torch::kLong);
  }
};

// x @ w.T for a projection held as one or more parts (a fused projection whose parts have different
// block types: their outputs side by side), each part (blocks, kind), all taking in_features; prompt rows
// on the bfloat16 tiles where the blocks take them (linear's prompt).
torch::Tensor project(const torch::Tensor& x, const std::vector<torch::Tensor>& blocks, const std::vector<int64_t>& kinds,
                      int64_t in_features, bool int8, bool prompt = false) {
  if (blocks.size() == 1) return linear(x, blocks[0], kinds[0], in_features, int8, prompt);
  std::vector<torch::Tensor> outs;
  for (size_t i = 0; i < blocks.size(); ++i) outs.push_back(linear(x, blocks[i], kinds[i], in_features, int8, prompt));
  return torch::cat(outs, -1);
}

torch::Tensor project(const torch::Tensor& x, const std::vector<torch::Tensor>& blocks, const std::vector<int64_t>& kinds,
                      int64_t in_features, bool int8, const PromptRows& rows) {
  if (!rows.any || rows.all) return project(x, blocks, kinds, in_features, int8, rows.all);
  torch::Tensor prompt = project(x.index_select(0, rows.prompt), blocks, kinds, in_features, int8, true);
  torch::Tensor other = project(x.index_select(0, rows.other), blocks, kinds, in_features, int8, false);
  torch::Tensor out = torch::empty({x.size(0), prompt.size(1)}, x.options());
  out.index_copy_(0, rows.prompt, prompt);
  out.index_copy_(0, rows.other, other);
  return out;
}

// h + x into x, a layer's own fresh output (the same float additions as ATen's h + x, without its dispatch).
SPECDEC_AVX2 torch::Tensor add_residual(torch::Tensor x, const torch::Tensor& h) {
  if (!x.is_contiguous() || !h.is_contiguous() || x.sizes() != h.sizes()) return h + x;
  float* xp = x.data_ptr<float>();
  const float* hp = h.data_ptr<float>();
  const int64_t n = x.numel();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(xp + i, _mm256_add_ps(_mm256_loadu_ps(hp + i), _mm256_loadu_ps(xp + i)));
  for (; i < n; ++i) xp[i] = hp[i] + xp[i];
  return x;
}

// One decoder layer of one or more sequences on GGUF blocks, in one call: what the lean backend's
// layer_aten does with rowops.cpp and these kernels (RMSNorm, fused QKV, Gemma's q/k norms + RoPE,
// attention over each sequence's cache, output projection, Gemma's norm, residual, RMSNorm, fused
// gate/up, act(gate) up, down, Gemma's norm, residual), with the same functions in the same order, so the
// same numbers to the bit; it saves the ~15 Python-level ops a layer and their dispatch (a SmolLM2 step:
// 11.9 -> 11.4 ms; two sequences' step 15.0 -> ~10 ms). h (T, d) float32, the sequences' rows one after
// another (rows[s] of them for sequence s), cos and sin (T, hd) at each row's position; weights[i] the
// parts of projection i (qkv, o, gate/up, down) as (blocks, kind) lists; norms: attn_in, mlp_in, then
// q, k (Gemma's, Qwen3's), attn_out, mlp_out (Gemma's), empty tensors where the model has none;
// qkv_bias: the QKV projection's bias (Qwen2), added to its product as layer_aten adds it, or empty; per
// sequence its caches, start, lo and visible as rowops' attend takes them. The products take every row at once (rows do not depend on how
// many are multiplied together), attention each sequence alone.
torch::Tensor layer_steps(torch::Tensor h, const std::vector<std::vector<torch::Tensor>>& blocks,
                          const std::vector<std::vector<int64_t>>& kinds, const std::vector<torch::Tensor>& norms,
                          const torch::Tensor& qkv_bias, const torch::Tensor& cos, const torch::Tensor& sin,
                          const std::vector<torch::Tensor>& k_caches,
                          const std::vector<torch::Tensor>& v_caches, const std::vector<int64_t>& starts,
                          const std::vector<int64_t>& los, const std::vector<torch::Tensor>& visibles,
                          const std::vector<int64_t>& rows, const std::vector<bool>& prompts, int64_t n_heads, int64_t n_kv,
                          int64_t hd, double eps, double scale, bool gemma, bool int8) {
  TORCH_CHECK(h.dim() == 2 && h.scalar_type() == torch::kFloat32, "h: (T, d) float32");
  TORCH_CHECK(blocks.size() == 4 && kinds.size() == 4 && norms.size() == 6, "4 projections and 6 norms");
  const size_t n = rows.size();
  TORCH_CHECK(n >= 1 && k_caches.size() == n && v_caches.size() == n && starts.size() == n && los.size() == n &&
                  visibles.size() == n && prompts.size() == n, "one cache, start, lo, visible mask and prompt flag per sequence");
  const int64_t T = h.size(0), d = h.size(1), hq = n_heads * hd, hkv = n_kv * hd;
  TORCH_CHECK(std::accumulate(rows.begin(), rows.end(), int64_t{0}) == T, "the sequences' rows must add up to h's");
  const PromptRows prompt_rows(rows, prompts);
  torch::Tensor qkv = project(rms_norm(h, norms[0], eps), blocks[0], kinds[0], d, int8, prompt_rows).contiguous();
  if (qkv_bias.numel()) {
    TORCH_CHECK(qkv_bias.dim() == 1 && qkv_bias.size(0) == qkv.size(1) && qkv_bias.scalar_type() == torch::kFloat32,
                "qkv_bias: (hq + 2 hkv) float32");
    qkv.add_(qkv_bias);
  }
  qk_rope_(qkv, cos, sin, n_heads, n_kv, hd, norms[2], norms[3], eps);
  std::vector<AttendJob> jobs;  // each sequence over its own cache, all in one parallel loop
  const int64_t width = hq + 2 * hkv;
  const float* row = qkv.data_ptr<float>();  // the sequence's first row
  for (size_t s = 0; s < n; ++s, row += rows[s - 1] * width)
    jobs.push_back(attend_job(Heads{row, hd, width}, Heads{row + hq, hd, width}, Heads{row + hq + hkv, hd, width},
                              n_heads, n_kv, rows[s], hd, k_caches[s], v_caches[s], starts[s], los[s], visibles[s]));
  attend_all(jobs, scale);
  std::vector<torch::Tensor> attended;
  for (size_t s = 0; s < n; ++s) attended.push_back(jobs[s].out.reshape({rows[s], hq}));
  torch::Tensor attn = n == 1 ? attended[0] : torch::cat(attended, 0);
  torch::Tensor o = project(attn, blocks[1], kinds[1], hq, int8, prompt_rows);
  if (gemma) o = rms_norm(o, norms[4], eps);
  h = add_residual(o, h);
  torch::Tensor gu = project(rms_norm(h, norms[1], eps), blocks[2], kinds[2], d, int8, prompt_rows);
  torch::Tensor m = project(act_mul(gu, gemma), blocks[3], kinds[3], gu.size(-1) / 2, int8, prompt_rows);
  if (gemma) m = rms_norm(m, norms[5], eps);
  return add_residual(m, h);
}

// Every layer's weights, held once (LayerStack) so that a pass through the whole stack is one call
// (stack_steps) instead of one a layer: a SmolLM2 token spent ~0.3 ms in the Python loop over its 30
// layers and its per-layer argument lists, ~10 % of a step on Zen 5. What does not change from pass to
// pass is held here too (the model's shapes; which RoPE table and attention window each layer takes, set
// once by set_layout), and each sequence's caches are one SequenceCaches handle: converting the per-layer
// lists and constants at every call cost ~50 us of a ~60 us call (its arguments alone).
struct LayerStack {
  std::vector<std::vector<std::vector<torch::Tensor>>> blocks;  // per layer: layer_steps' blocks, kinds, norms
  std::vector<std::vector<std::vector<int64_t>>> kinds;
  std::vector<std::vector<torch::Tensor>> norms;
  std::vector<torch::Tensor> qkv_biases;  // per layer, empty where there is none
  int64_t n_heads, n_kv, hd;
  double eps, scale;
  bool gemma, int8;
  std::vector<int64_t> rope_of, window_of;  // per layer: its RoPE table and attention window (set_layout)
};

// One sequence's keys and values, a tensor a layer (KVCache.k and .v as they stand until the cache grows).
struct SequenceCaches {
  std::vector<torch::Tensor> k, v;
};

// Every layer of one or more sequences in turn, each exactly as layer_steps runs it (the same call), so
// the same numbers to the bit. Layer i takes cos[rope_of[i]], sin[rope_of[i]] and, per sequence s,
// caches[s]'s k[i] and v[i], los[window_of[i]][s], visibles[window_of[i]][s] (layers that share a RoPE
// table or an attention window share one entry; rope_of and window_of are the stack's). Returns the last
// layer's output, then the inputs of the layers `taps` names, in that order (EAGLE's features).
std::vector<torch::Tensor> stack_steps(const LayerStack& stack, torch::Tensor h, const std::vector<torch::Tensor>& cos,
                                       const std::vector<torch::Tensor>& sin,
                                       const std::vector<std::shared_ptr<SequenceCaches>>& caches,
                                       const std::vector<int64_t>& starts, const std::vector<std::vector<int64_t>>& los,
                                       const std::vector<std::vector<torch::Tensor>>& visibles,
                                       const std::vector<int64_t>& rows, const std::vector<bool>& prompts,
                                       const std::vector<int64_t>& taps) {
  const size_t layers = stack.blocks.size(), n = rows.size();
  const std::vector<int64_t>& rope_of = stack.rope_of;
  const std::vector<int64_t>& window_of = stack.window_of;
  TORCH_CHECK(rope_of.size() == layers && window_of.size() == layers, "set_layout first: a RoPE table and window a layer");
  TORCH_CHECK(caches.size() == n, "one SequenceCaches per sequence");
  for (size_t s = 0; s < n; ++s)
    TORCH_CHECK(caches[s] && caches[s]->k.size() == layers && caches[s]->v.size() == layers, "one cache per layer");
  for (size_t i = 0; i < layers; ++i) {
    TORCH_CHECK(rope_of[i] >= 0 && rope_of[i] < static_cast<int64_t>(cos.size()) && cos.size() == sin.size(),
                "rope_of names a table that was not given");
    TORCH_CHECK(window_of[i] >= 0 && window_of[i] < static_cast<int64_t>(los.size()) && los.size() == visibles.size(),
                "window_of names a window that was not given");
  }
  std::vector<torch::Tensor> tapped(taps.size());
  std::vector<torch::Tensor> ks(n), vs(n);
  for (size_t i = 0; i < layers; ++i) {
    for (size_t t = 0; t < taps.size(); ++t)
      if (taps[t] == static_cast<int64_t>(i)) tapped[t] = h;
    for (size_t s = 0; s < n; ++s) ks[s] = caches[s]->k[i], vs[s] = caches[s]->v[i];
    h = layer_steps(h, stack.blocks[i], stack.kinds[i], stack.norms[i], stack.qkv_biases[i], cos[rope_of[i]],
                    sin[rope_of[i]], ks, vs,
                    starts, los[window_of[i]], visibles[window_of[i]], rows, prompts, stack.n_heads, stack.n_kv,
                    stack.hd, stack.eps, stack.scale, stack.gemma, stack.int8);
  }
  for (size_t t = 0; t < taps.size(); ++t) TORCH_CHECK(tapped[t].defined(), "taps names layer ", taps[t], " of ", layers);
  std::vector<torch::Tensor> out{h};
  out.insert(out.end(), tapped.begin(), tapped.end());
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("supported", &supported, "whether this CPU has AVX2 and FMA");
  m.def("linear", &linear, "x @ w.T on GGUF Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K blocks; float32 activations, or int8; "
        "prompt: rows of a prompt (on bfloat16 tiles where packed blocks take them)",
        py::arg("x"), py::arg("w"), py::arg("kind"), py::arg("in_features"), py::arg("int8") = false,
        py::arg("prompt") = false);
  m.def("tiles_left_as_found", &tiles_left_as_found, "for tests: the AMX products restore the tile configuration "
        "they found on the thread");
  m.def("amx_bf16", &amx_bf16, "whether this CPU has AMX-BF16 tiles (prompt rows of packed blocks take them)");
  m.def("prompt_tiles", [] { return prompt_tiles_on(); }, "whether prompt rows of packed blocks take the bfloat16 tiles");
  m.def("set_prompt_tiles", [](bool on) { return std::exchange(prompt_tiles_on(), on && amx_bf16()); },
        "prompt rows of packed blocks on the bfloat16 tiles (where the CPU has them) or not; returns the previous "
        "setting");
  m.def("pack_int8", &pack_int8, "a matrix's blocks (N a multiple of 16) in the layout of the packed int8 kernels",
        py::arg("w"), py::arg("kind"), py::arg("in_features"));
  m.def("packed_supported", &packed_supported, "whether this CPU runs the packed int8 kernels (AVX2, FMA, F16C)");
  m.def("vnni", [] { return vnni_on(); }, "whether the packed int8 kernels take vpdpbusd here (AVX-512 VNNI), else AVX2");
  m.def("set_vnni", [](bool on) { return std::exchange(vnni_on(), on && vnni_supported()); },
        "turn vpdpbusd (and AMX-INT8) off or on again, for tests and benchmarks (the AVX2 products give the same bits)",
        py::arg("on"));
  m.def("amx_int8", &amx_int8, "whether the packed int8 kernels take many rows on AMX-INT8 tiles here");
  m.def("set_packed_rows", [](int64_t rows) { return std::exchange(vnni_max_rows, rows); },
        "the most rows the packed kernels multiply on vpdpbusd before AMX takes them (default 24); returns the "
        "previous value");
  m.def("packed_flag", [] { return kPackedFlag; }, "kind | packed_flag() names a packed matrix to linear and stack_steps");
  py::class_<LayerStack>(m, "LayerStack", "every layer's weights (blocks, kinds, norms per layer) and the model's "
                         "shapes, held for stack_steps")
      .def(py::init([](std::vector<std::vector<std::vector<torch::Tensor>>> blocks,
                       std::vector<std::vector<std::vector<int64_t>>> kinds, std::vector<std::vector<torch::Tensor>> norms,
                       std::vector<torch::Tensor> qkv_biases, int64_t n_heads, int64_t n_kv, int64_t hd, double eps,
                       double scale, bool gemma, bool int8) {
        TORCH_CHECK(blocks.size() == kinds.size() && blocks.size() == norms.size() && blocks.size() == qkv_biases.size(),
                    "one entry per layer in each list");
        return LayerStack{std::move(blocks), std::move(kinds), std::move(norms), std::move(qkv_biases), n_heads, n_kv, hd,
                          eps, scale, gemma, int8, {}, {}};
      }))
      .def("set_layout", [](LayerStack& stack, std::vector<int64_t> rope_of, std::vector<int64_t> window_of) {
        TORCH_CHECK(rope_of.size() == stack.blocks.size() && window_of.size() == stack.blocks.size(),
                    "a RoPE table and a window index for every layer");
        stack.rope_of = std::move(rope_of), stack.window_of = std::move(window_of);
      }, "which RoPE table (index into stack_steps' cos and sin) and attention window each layer takes");
  py::class_<SequenceCaches, std::shared_ptr<SequenceCaches>>(m, "SequenceCaches",
                                                              "one sequence's key and value caches, a tensor a layer")
      .def(py::init([](std::vector<torch::Tensor> k, std::vector<torch::Tensor> v) {
        TORCH_CHECK(k.size() == v.size(), "as many value caches as key caches");
        return std::make_shared<SequenceCaches>(SequenceCaches{std::move(k), std::move(v)});
      }));
  // Without the GIL: a pass (a long prompt's chunk: a second or more) would otherwise hold up every other
  // Python thread, the server's HTTP loop among them, for all of its layers (one call a layer let it in between).
  m.def("stack_steps", &stack_steps, "every decoder layer of one or more sequences in one call (layer_steps each)",
        py::call_guard<py::gil_scoped_release>());
}
