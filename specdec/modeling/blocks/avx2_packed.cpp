#include "formats.h"

namespace specdec::blocks {
namespace {

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
    // take the whole group as one run, so no int32 sums live through its steps (which would make 8 rows
    // spill sums and accumulators to the stack every group). The same integers in any order, the same bits.
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
// 16 columns (8 lanes each) in one pass over its groups, so the memory streams the block once (a pass a
// half would read lines already in the cache the second time, with nothing prefetched meanwhile). A
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
#define SPECDEC_AVX2_ROWS 8  // rows a tile on AVX2: fewer reread the codes more often, more spill registers
#endif

template <int64_t KIND, int64_t... Less>
void avx2_rest(std::integer_sequence<int64_t, Less...>, const PackedActs& x, const uint8_t* w, int64_t stride,
               float* out, int64_t N, int64_t r0, int64_t rows, int64_t b0, int64_t b1) {
  ((rows == Less + 1 ? avx2_rows<KIND, Less + 1>(x, w, stride, out, N, r0, b0, b1) : void()), ...);
}

}  // namespace

void avx2_blocks(int64_t kind, const PackedActs& x, const uint8_t* w, int64_t stride, float* out, int64_t N,
                 int64_t b0, int64_t b1) {
  by_kind(kind, [&](auto k) {
    constexpr int64_t T = SPECDEC_AVX2_ROWS;
    int64_t r = 0;
    for (; r + T <= x.M; r += T) avx2_rows<k(), T>(x, w, stride, out, N, r, b0, b1);
    if (r < x.M) avx2_rest<k()>(std::make_integer_sequence<int64_t, T - 1>{}, x, w, stride, out, N, r, x.M - r, b0, b1);
  });
}

}  // namespace specdec::blocks
