// The GGUF block formats quant.cpp's kernels read, the packed layout pack_int8 writes, and the products
// each instruction set's source defines (declared at the end). Included by quant.cpp and blocks/*.cpp.
//
//   Q4_0  [d:f16][16 bytes: weight j in the low nibble of byte j, weight j+16 in the high]  w = d (q - 8)
//   Q4_1  [d:f16][m:f16][16 bytes, as Q4_0]                                              w = d q + m
//   Q5_0  [d:f16][4 bytes: bit j = the fifth bit of weight j][16 bytes, as Q4_0]          w = d (q - 16)
//   Q5_1  [d:f16][m:f16][4 bytes of fifth bits, as Q5_0][16 bytes, as Q4_0]               w = d q + m
//   Q8_0  [d:f16][32 x int8]                                                             w = d q
//   Q4_K  256 weights: [d][dmin][6-bit scale and min of each 32][128 bytes of nibbles]   w = d sc q - dmin m
//   Q5_K  256 weights: [d][dmin][scales and mins, as Q4_K][32 bytes: bit j of byte l = the fifth bit of
//         weight l of the 32 in group j][128 bytes of nibbles, as Q4_K]                  w = d sc q - dmin m
//   Q6_K  256 weights: [4-bit lows][2-bit highs][int8 scale of each 16][d]               w = d sc (q - 32)

#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#ifndef SPECDEC_AVX2
#define SPECDEC_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

#include "../simd.h"  // hsum

namespace specdec::blocks {

using simd::hsum;

constexpr int64_t QK = 32;  // weights per group: every type is read 32 weights at a time
constexpr int64_t ROW_TILE = 8;  // rows of x sharing one unpacking of a group (8 accumulators + 4 weights fit 16 ymm)

enum Kind : int64_t { Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };  // ggml's ids
enum FloatKind : int64_t { F16 = 1, BF16 = 30 };  // unquantised matrices: half_products.cpp

inline int64_t block_weights(int64_t kind) { return kind == Q4_K || kind == Q5_K || kind == Q6_K ? 256 : 32; }

inline int64_t block_bytes(int64_t kind) {
  switch (kind) {
    case Q4_0: return 18;
    case Q4_1: return 20;
    case Q5_0: return 22;
    case Q5_1: return 24;
    case Q8_0: return 34;
    case Q4_K: return 144;
    case Q5_K: return 176;
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
    case Q5_1: f(std::integral_constant<int64_t, Q5_1>{}); return;
    case Q8_0: f(std::integral_constant<int64_t, Q8_0>{}); return;
    case Q4_K: f(std::integral_constant<int64_t, Q4_K>{}); return;
    case Q5_K: f(std::integral_constant<int64_t, Q5_K>{}); return;
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

// 32 bits (bit j: weight j's fifth bit, Q5_0's and Q5_1's qh) -> 16 in the bytes whose bit is set, else 0.
SPECDEC_AVX2 inline __m256i fifth_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  const __m256i spread = _mm256_shuffle_epi8(  // byte j holds the byte of `bits` that has bit j
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0x0000000000000000));
  const __m256i select = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
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
    out.q = _mm256_or_si256(nibbles16(block + 6), fifth_bits(block + 2));
    a = half(block), b = -16.f * a;
  } else if constexpr (KIND == Q5_1) {  // [d][m][32 fifth bits][16 bytes of nibbles]: d q + m
    const uint8_t* block = row + g * 24;
    out.q = _mm256_or_si256(nibbles16(block + 8), fifth_bits(block + 4));
    a = half(block), b = half(block + 2);
  } else if constexpr (KIND == Q4_K || KIND == Q5_K) {
    // [d][dmin][12 bytes: eight 6-bit scales and mins](Q5_K: [32 bytes of fifth bits])[128 bytes]: group j
    // of a superblock is the low (j even) or high (j odd) nibbles of bytes 32 (j / 2) .. +31, and in Q5_K
    // bit j of the fifth bits' bytes; w = d sc_j q - dmin m_j
    constexpr int64_t bytes = KIND == Q5_K ? 176 : 144, nibbles = KIND == Q5_K ? 48 : 16;
    const uint8_t* block = row + (g / 8) * bytes;
    const int j = static_cast<int>(g % 8);
    const uint8_t* sm = block + 4;
    int sc, m;
    if (j < 4) {
      sc = sm[j] & 63, m = sm[j + 4] & 63;
    } else {
      sc = (sm[j + 4] & 0xF) | ((sm[j - 4] >> 6) << 4), m = (sm[j + 4] >> 4) | ((sm[j] >> 6) << 4);
    }
    __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + nibbles + 32 * (j / 2)));
    if (j % 2) raw = _mm256_srli_epi16(raw, 4);
    out.q = _mm256_and_si256(raw, _mm256_set1_epi8(0x0F));
    if constexpr (KIND == Q5_K) {  // bit j of each byte, as 16 (a 16-bit shift: the byte's own bit lands in bit 0)
      const __m256i high = _mm256_srli_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16)), j);
      out.q = _mm256_or_si256(out.q, _mm256_slli_epi16(_mm256_and_si256(high, _mm256_set1_epi8(1)), 4));
    }
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

constexpr int64_t kPackedAhead = 4096;  // bytes of a thread's stream prefetched ahead

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
         : kind == Q5_1 ? Format{32, false, 1, true, 0.f, 0}
         : kind == Q8_0 ? Format{32, true, 0, false, -128.f, 0}
         : kind == Q4_K ? Format{32, false, 0, true, 0.f, 8}
         : kind == Q5_K ? Format{32, false, 1, true, 0.f, 8}
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

inline void check_kind(int64_t kind) {
  TORCH_CHECK(kind == Q4_0 || kind == Q4_1 || kind == Q5_0 || kind == Q5_1 || kind == Q8_0 || kind == Q4_K ||
                  kind == Q5_K || kind == Q6_K,
              "unsupported GGUF block type ", kind);
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

SPECDEC_AVX2 inline void prefetch_group(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + kPackedAhead + o), _MM_HINT_T0);
}


// ---- The products, one source each ----------------------------------------------------------------

// file_products.cpp: out (M, N) = x (M, K) @ w.T on the file's own blocks (N rows of blocks back to back),
// float32 activations or (int8) rounded to int8 per row and 32 columns; AVX2.
void file_matmul(int64_t kind, const float* x, const uint8_t* w, float* out, int64_t M, int64_t K, int64_t N, bool int8);

// packing.cpp: `blocks` blocks of 16 output rows of w (row_bytes each) in the packed layout, block b at
// out + b stride; and the activations rounded to int8 in PackedActs' layout (rows past M zeroed where
// zero_padding: AMX reads whole 16-row tiles).
void pack_blocks(int64_t kind, const uint8_t* w, int64_t blocks, int64_t row_bytes, int64_t K, uint8_t* out,
                 int64_t stride);
void quantize_acts_into(PackedActs& out, const float* x, int64_t M, int64_t K, int64_t G, bool zero_padding);
PackedActs quantize_acts(const float* x, int64_t M, int64_t K, int64_t G);

// vnni.cpp: x's rows times packed blocks [b0, b1) (each `stride` bytes) into out (x.M, N), on vpdpbusd
// (AVX-512 VNNI) or on AMX-INT8 tiles (x padded to whole 16-row tiles).
bool vnni_supported();
void vnni_blocks(int64_t kind, const PackedActs& x, const uint8_t* w, int64_t stride, float* out, int64_t N,
                 int64_t b0, int64_t b1);
void amx_int8_blocks(int64_t kind, const PackedActs& x, const uint8_t* w, int64_t stride, float* out, int64_t N,
                     int64_t b0, int64_t b1);

// avx2_packed.cpp: the same products on AVX2 (vpmaddubsw), to the bit.
void avx2_blocks(int64_t kind, const PackedActs& x, const uint8_t* w, int64_t stride, float* out, int64_t N,
                 int64_t b0, int64_t b1);

// half_products.cpp: out (M, N) = x (M, K) @ w.T for F16 or BF16 weights (N rows of K), float32 activations.
void half_matmul(int64_t kind, const float* x, const uint16_t* w, float* out, int64_t M, int64_t K, int64_t N);

// amx_bf16.cpp: prompt rows times packed blocks on bfloat16 tiles; and, for tests, whether the AMX
// products hand a thread's tiles back as they found them.
bool amx_bf16();
void prompt_matmul(int64_t kind, const float* x, const uint8_t* w, float* out, int64_t M, int64_t K, int64_t N);
bool tiles_left_as_found();

}  // namespace specdec::blocks
