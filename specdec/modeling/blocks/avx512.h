// The packed layout read on AVX-512: a group's codes in VNNI order and its scales as zmm, and the float
// steps after a group's integer sums (vnni.cpp's products; amx_bf16.cpp dequantises with the same reads).

#pragma once

#include "formats.h"

namespace specdec::blocks {

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

}  // namespace specdec::blocks
