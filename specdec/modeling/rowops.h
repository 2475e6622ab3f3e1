// The row-wise float32 ops of rowops.cpp, as a header: rowops.cpp binds them for Python, and
// quant.cpp calls them inside its one-call decoder layer (layer_step) with the same arithmetic.
//
// On a CPU without kernels.cpp (no AVX-512 BF16) a decode step is ~25 small ATen ops a layer, and each
// costs 3-5 us of dispatch whatever its size: an RMSNorm of one 576-wide row ~25 us, RoPE on q and k
// ~40 us, more than their arithmetic by two orders of magnitude. These do the same arithmetic in one
// call:
//
//   rms_norm   y = (x / sqrt(mean(x^2) + eps)) * w per row (Llama's and, with w = 1 + weight, Gemma's
//              float32 RMSNorm);
//   qk_rope_   in place on a fused QKV block: Gemma's per-head q/k RMSNorms, then RoPE on every q and
//              k head (x cos + rotate_half(x) sin, sin holding rotate_half's sign);
//   attend     one sequence's attention over its KV cache (float32, or float16 as llama.cpp keeps it: half
//              the bytes a step reads a position): write the new keys and values, then for each query
//              and head softmax(q k^T scale) v over the keys a boolean mask allows (causal, sliding
//              window, a token tree's ancestors), grouped KV heads; replaces the cache writes, slices
//              and SDPA call (~40 us a layer for one query);
//   act_mul    silu(gate) up (Llama) or gelu_tanh(gate) up (Gemma) of fused [gate | up] rows.
//
// Each row's arithmetic depends on that row alone, so results do not depend on how many rows a pass
// holds, and speculative, batched and plain decoding stay token for token equal.

#pragma once

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#ifndef SPECDEC_AVX2
#define SPECDEC_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif

#include "simd.h"

namespace {

using specdec::simd::hsum;

// y[i] = (x[i] * r) * w[i], r = 1 / sqrt(mean(x^2) + eps); n a multiple of 8.
SPECDEC_AVX2 void norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
  __m256 ss = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    ss = _mm256_fmadd_ps(v, v, ss);
  }
  const __m256 r = _mm256_set1_ps(1.f / std::sqrt(hsum(ss) / static_cast<float>(n) + eps));
  for (int64_t i = 0; i < n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), r), _mm256_loadu_ps(w + i)));
}

// x (hd) <- x * cos + rotate_half(x) * sin, rotate_half(x) = (x[half:], x[:half]); hd a multiple of 16.
SPECDEC_AVX2 void rope_head(float* x, const float* cos, const float* sin, int64_t hd) {
  const int64_t half = hd / 2;
  for (int64_t i = 0; i < half; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + half + i);
    const __m256 lo = _mm256_add_ps(_mm256_mul_ps(a, _mm256_loadu_ps(cos + i)),
                                    _mm256_mul_ps(b, _mm256_loadu_ps(sin + i)));
    const __m256 hi = _mm256_add_ps(_mm256_mul_ps(b, _mm256_loadu_ps(cos + half + i)),
                                    _mm256_mul_ps(a, _mm256_loadu_ps(sin + half + i)));
    _mm256_storeu_ps(x + i, lo);
    _mm256_storeu_ps(x + half + i, hi);
  }
}

// e^x for 8 floats: 2^n * p(r), x = n ln2 + r, |r| <= ln2 / 2, p Cephes' degree-5 polynomial
// (relative error ~2e-7); x below -87 gives 0.
SPECDEC_AVX2 inline __m256 exp8(__m256 x) {
  const __m256 low = _mm256_set1_ps(-87.3f);
  const __m256 under = _mm256_cmp_ps(x, low, _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, low), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

// Eight values of a KV cache row as float32: the cache holds float32, or float16 (IEEE half bits, as
// uint16_t), which widens exactly.
SPECDEC_AVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
SPECDEC_AVX2 inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// n float32 values into a cache row of C: copied, or rounded to the nearest float16 (ties to even, as
// torch's .half() rounds). n a multiple of 8.
SPECDEC_AVX2 inline void store_row(float* to, const float* from, int64_t n) { std::memcpy(to, from, n * 4); }
SPECDEC_AVX2 inline void store_row(uint16_t* to, const float* from, int64_t n) {
  for (int64_t i = 0; i < n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(from + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

template <class C>
SPECDEC_AVX2 inline float dot(const float* a, const C* b, int64_t n) {
  __m256 s = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) s = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load8(b + i), s);
  return hsum(s);
}

// (hsum(v[0]), ..., hsum(v[7])): the same additions of the same numbers as eight hsums, for the eight at
// once. hsum(v) = ((v0 + v4) + (v2 + v6)) + ((v1 + v5) + (v3 + v7)).
SPECDEC_AVX2 inline __m256 hsum8(const __m256 v[8]) {
  __m256 x[4];  // x[p] = (v_l + v_l+4 of v[2p], l = 0..3 | the same of v[2p + 1])
  for (int p = 0; p < 4; ++p)
    x[p] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * p], v[2 * p + 1], 0x31));
  __m256 y[2];  // y[h] = (s0 + s2, s1 + s3) of v[4h], v[4h + 2] | of v[4h + 1], v[4h + 3]
  for (int h = 0; h < 2; ++h)
    y[h] = _mm256_add_ps(_mm256_shuffle_ps(x[2 * h], x[2 * h + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(x[2 * h], x[2 * h + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m256 z = _mm256_add_ps(_mm256_shuffle_ps(y[0], y[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm256_shuffle_ps(y[0], y[1], _MM_SHUFFLE(3, 1, 3, 1)));  // v0 v2 v4 v6 | v1 v3 v5 v7
  return _mm256_permutevar8x32_ps(z, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// f(std::integral_constant<int, n>{}) for a run-time n in 1..MAX: a kernel templated on its number of
// vectors, chosen once a call.
template <int MAX, class F>
inline void with_vectors(int64_t n, F&& f) {
  [&]<int... N>(std::integer_sequence<int, N...>) {
    ((n == N + 1 ? f(std::integral_constant<int, N + 1>{}) : void()), ...);
  }(std::make_integer_sequence<int, MAX>{});
}

// The value row kValuesAhead rows on from `row`, on its way to the cache: attention streams a KV head's values
// from the memory once a step, and the first use of each row waited on it (perf: ~60 % of weigh_tile's
// samples on its first load). Prefetches never fault, past the cache's end included.
constexpr int64_t kValuesAhead = 32;

template <class C>
SPECDEC_AVX2 inline void prefetch_row(const C* row, int64_t hd) {
  for (int64_t o = 0; o < hd * static_cast<int64_t>(sizeof(C)); o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(row + kValuesAhead * hd) + o, _MM_HINT_T0);
}

// acc[0, 8 NV) += sum_j weights[j] values[j][0, 8 NV) for j in [j0, j1), each lane summed over j
// in order (continuing the sums a previous call left in acc).
template <int NV, class C>
SPECDEC_AVX2 inline void weigh_values(const float* weights, const C* values, int64_t j0,
                                      int64_t j1, int64_t hd, float* acc) {
  __m256 a[NV];
  for (int c = 0; c < NV; ++c) a[c] = _mm256_loadu_ps(acc + 8 * c);
  for (int64_t j = j0; j < j1; ++j) {
    const __m256 w = _mm256_set1_ps(weights[j]);
    const C* row = values + j * hd;
    prefetch_row(row, hd);
    for (int c = 0; c < NV; ++c) a[c] = _mm256_fmadd_ps(w, load8(row + 8 * c), a[c]);
  }
  for (int c = 0; c < NV; ++c) _mm256_storeu_ps(acc + 8 * c, a[c]);
}

template <class C>
SPECDEC_AVX2 void weigh_lanes(const float* weights, const C* values, int64_t j0, int64_t j1,
                              int64_t hd, float* acc) {
  for (int64_t i = 0; i < hd; i += 64)  // 64 lanes (8 accumulators) at a time
    with_vectors<8>(std::min<int64_t>(64, hd - i) / 8, [&](auto nv) {
      weigh_values<decltype(nv)::value>(weights, values + i, j0, j1, hd, acc + i);
    });
}

#ifndef SPECDEC_AVX512F
#define SPECDEC_AVX512F __attribute__((target("avx512f,avx2,fma,f16c")))
#endif

SPECDEC_AVX512F inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
SPECDEC_AVX512F inline __m512 load16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// weigh_values on 16-lane registers, where the CPU has AVX-512: each lane's fmas are the same, so the
// sums are weigh_values' to the bit, in half the instructions.
template <int NZ, class C>
SPECDEC_AVX512F inline void weigh_values16(const float* weights, const C* values, int64_t j0,
                                           int64_t j1, int64_t hd, float* acc) {
  __m512 a[NZ];
  for (int c = 0; c < NZ; ++c) a[c] = _mm512_loadu_ps(acc + 16 * c);
  for (int64_t j = j0; j < j1; ++j) {
    const __m512 w = _mm512_set1_ps(weights[j]);
    const C* row = values + j * hd;
    for (int c = 0; c < NZ; ++c) a[c] = _mm512_fmadd_ps(w, load16(row + 16 * c), a[c]);
  }
  for (int c = 0; c < NZ; ++c) _mm512_storeu_ps(acc + 16 * c, a[c]);
}

// weigh_lanes for hd a multiple of 16, on AVX-512.
template <class C>
SPECDEC_AVX512F void weigh_lanes16(const float* weights, const C* values, int64_t j0,
                                   int64_t j1, int64_t hd, float* acc) {
  for (int64_t i = 0; i < hd; i += 128)  // 128 lanes (8 accumulators) at a time
    with_vectors<8>(std::min<int64_t>(128, hd - i) / 16, [&](auto nz) {
      weigh_values16<decltype(nz)::value>(weights, values + i, j0, j1, hd, acc + i);
    });
}

// Whether attend_rows weighs the values on 16-lane registers: where the CPU has AVX-512, unless a test
// turned it off (set_wide_lanes) to compare the two.
inline bool& wide_lanes() {
  static bool wide = __builtin_cpu_supports("avx512f");
  return wide;
}

bool set_wide_lanes(bool wide) {
  const bool previous = wide_lanes();
  wide_lanes() = wide && __builtin_cpu_supports("avx512f");
  return previous;
}

// The scores of NQ queries against NK keys, the keys read once for all NQ: each (query, key) summed
// exactly as dot() sums it (eight lanes over the head's dimensions in order, then hsum), times scale, into
// out[r][0, NK). NQ * NK = 8: hsum8 reduces all eight (the same additions as eight hsums).
template <int NK, int NQ, class C>
SPECDEC_AVX2 inline void score_tile(const float* const* q, const C* k, int64_t hd, float scale, float* const* out) {
  static_assert(NK * NQ == 8, "one hsum8");
  __m256 s[8];
  for (int x = 0; x < 8; ++x) s[x] = _mm256_setzero_ps();
  for (int64_t i = 0; i < hd; i += 8) {
    __m256 qv[NQ];
    for (int r = 0; r < NQ; ++r) qv[r] = _mm256_loadu_ps(q[r] + i);
    for (int c = 0; c < NK; ++c) {
      const __m256 kv = load8(k + c * hd + i);
      for (int r = 0; r < NQ; ++r) s[r * NK + c] = _mm256_fmadd_ps(qv[r], kv, s[r * NK + c]);
    }
  }
  float sums[8];
  _mm256_storeu_ps(sums, _mm256_mul_ps(hsum8(s), _mm256_set1_ps(scale)));
  for (int r = 0; r < NQ; ++r) std::memcpy(out[r], sums + r * NK, NK * sizeof(float));
}

// acc_r[0, 8 NV) += sum_j weights_r[j] values[j][0, 8 NV) for NQ queries, j in [j0, j1) in order: each
// lane's sum is weigh_values' (the same fmas in the same order), a value row read once for the NQ.
template <int NQ, int NV, class C>
SPECDEC_AVX2 inline void weigh_tile(const float* const* weights, const C* values, int64_t j0, int64_t j1,
                                    int64_t hd, float* const* acc) {
  __m256 a[NQ][NV];
  for (int r = 0; r < NQ; ++r)
    for (int c = 0; c < NV; ++c) a[r][c] = _mm256_loadu_ps(acc[r] + 8 * c);
  for (int64_t j = j0; j < j1; ++j) {
    const C* row = values + j * hd;
    prefetch_row(row, hd);
    __m256 v[NV];
    for (int c = 0; c < NV; ++c) v[c] = load8(row + 8 * c);
    for (int r = 0; r < NQ; ++r) {
      const __m256 w = _mm256_set1_ps(weights[r][j]);
      for (int c = 0; c < NV; ++c) a[r][c] = _mm256_fmadd_ps(w, v[c], a[r][c]);
    }
  }
  for (int r = 0; r < NQ; ++r)
    for (int c = 0; c < NV; ++c) _mm256_storeu_ps(acc[r] + 8 * c, a[r][c]);
}

// weigh_tile for NQ queries over all hd lanes, 32 lanes (4 vectors a query) at a time.
template <int NQ, class C>
SPECDEC_AVX2 void weigh_rows(const float* const* weights, const C* values, int64_t j0, int64_t j1, int64_t hd,
                             float* const* acc) {
  for (int64_t i = 0; i < hd; i += 32) {
    float* at[NQ];
    for (int r = 0; r < NQ; ++r) at[r] = acc[r] + i;
    with_vectors<4>(std::min<int64_t>(32, hd - i) / 8, [&](auto nv) {
      weigh_tile<NQ, decltype(nv)::value>(weights, values + i, j0, j1, hd, at);
    });
  }
}

// One query row's part of attend_rows: its allowed keys' slots and their scores (when a mask hides some),
// its dense scores, then weights, over every key of the call, and its output's sums.
struct QueryWork {
  std::vector<float> dense;   // a score, then an unnormalised weight, for every key of the call (0 where hidden)
  std::vector<int64_t> slots;  // where a mask hides keys: the allowed ones among the rest, in order
  std::vector<float> moved;    // and their weights
  std::vector<float> acc;
  float norm = 0.f;
};

// How many of the keys [0, count) a block of query rows reads: up to the last one any row may see (keys
// past it would only add weights of 0; a prompt chunk's early rows see none of its later rows' keys).
inline int64_t block_reach(const bool* const* allowed, int nq, int64_t count) {
  int64_t reach = 0;
  for (int r = 0; r < nq && reach < count; ++r) {
    int64_t last = count;
    if (allowed[r] != nullptr)
      while (last > reach && !allowed[r][last - 1]) --last;
    reach = std::max(reach, last);
  }
  return reach;
}

// Up to 16 query rows against one KV head's keys [lo, lo + count) (count: block_reach's, no key past it
// visible to any row): out_r = softmax(scale q_r.k_j over the keys row r may see) . v. A row's allowed keys
// are taken in order and numbered from 0, and that number, not the slot, decides which lane of the
// exponentials' sum a key joins: a row then gets the same numbers whether its context sits in consecutive
// slots (one position, a chain) or has a tree's other branches between (masked out), so a tree's accepted
// path scores what plain decoding scores, to the bit. Every number is a function of the row's query, its
// keys and its values alone, so a row scores the same alone or in a block, and the block only shares the
// reads: the rows (of one position's heads that share the KV head, or of many positions) take each chunk
// of ~32 KB of keys in pairs, four keys at a time, then each chunk of values in threes; a hidden key's
// weight is 0, which adds nothing to a sum (x + 0 = x).
template <class C>
SPECDEC_AVX2 void attend_rows(const float* const* qs, const bool* const* allowed, float* const* outs, int nq,
                              const C* keys, const C* values, int64_t count, int64_t hd, float scale,
                              std::vector<QueryWork>& work) {
  if (static_cast<int>(work.size()) < nq) work.resize(nq);
  float* dense[16];
  for (int r = 0; r < nq; ++r) {
    work[r].dense.resize(count + 8);
    dense[r] = work[r].dense.data();
  }
  const int64_t chunk = std::max<int64_t>(16, 8192 / hd) / 4 * 4;  // keys a chunk: 32 KB of float32 (16 of float16)
  for (int64_t c0 = 0; c0 < count; c0 += chunk) {  // every row's score of every key, a chunk at a time
    const int64_t c1 = std::min(count, c0 + chunk), tiles = c0 + (c1 - c0) / 4 * 4;
    int r = 0;
    for (; r + 2 <= nq; r += 2) {
      for (int64_t j = c0; j < tiles; j += 4) {
        float* out[2] = {dense[r] + j, dense[r + 1] + j};
        score_tile<4, 2>(qs + r, keys + j * hd, hd, scale, out);
      }
      for (int64_t j = tiles; j < c1; ++j)
        for (int x = r; x < r + 2; ++x) dense[x][j] = dot(qs[x], keys + j * hd, hd) * scale;
    }
    if (r < nq) {  // an odd row alone, eight keys at a time
      int64_t j = c0;
      for (; j + 8 <= c1; j += 8) {
        float* out[1] = {dense[r] + j};
        score_tile<8, 1>(qs + r, keys + j * hd, hd, scale, out);
      }
      for (; j < c1; ++j) dense[r][j] = dot(qs[r], keys + j * hd, hd) * scale;
    }
  }
  for (int r = 0; r < nq; ++r) {  // softmax's exponentials, unnormalised, over the row's allowed keys
    QueryWork& w = work[r];
    float* s = dense[r];
    int64_t n = count;
    const bool* mask = allowed[r];
    int64_t visible = count;  // keys [0, visible) all allowed: a mask's context, before a chain's or tree's rows
    if (mask != nullptr) {  // the allowed keys' scores moved down in order (numbered 0, 1, ...), in place
      visible = 0;
      for (uint64_t eight; visible + 8 <= count; visible += 8) {
        std::memcpy(&eight, mask + visible, 8);
        if (eight != 0x0101010101010101ull) break;
      }
      while (visible < count && mask[visible]) ++visible;
      w.slots.resize(count - visible);
      int64_t* slot = w.slots.data();
      n = visible;
      for (int64_t j = visible; j < count; ++j) {  // the rest's allowed keys, without a branch
        slot[n - visible] = j;
        n += mask[j];
      }
      for (int64_t j = visible; j < n; ++j) s[j] = s[slot[j - visible]];  // slot >= j: not yet overwritten
    }
    for (int64_t j = n; j < n + 8; ++j) s[j] = -INFINITY;  // padding for the last vector
    __m256 top8 = _mm256_set1_ps(-INFINITY);  // the largest score (exact in any order)
    for (int64_t j = 0; j < n; j += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(s + j));
    float lanes[8], top = -INFINITY;
    _mm256_storeu_ps(lanes, top8);
    for (float x : lanes) top = std::max(top, x);
    const __m256 shift = _mm256_set1_ps(top);
    __m256 total = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), shift));
      _mm256_storeu_ps(s + j, e);
      total = _mm256_add_ps(total, e);
    }
    w.norm = 1.f / hsum(total);
    if (visible < count) {  // the moved weights back in their keys' places, 0 for the hidden keys
      w.moved.assign(s + visible, s + n);
      std::fill(s + visible, s + count, 0.f);
      for (int64_t j = visible; j < n; ++j) s[w.slots[j - visible]] = w.moved[j - visible];
    }
    w.acc.assign(hd, 0.f);
  }
  float* acc[16];
  for (int r = 0; r < nq; ++r) acc[r] = work[r].acc.data();
  const bool wide = hd % 16 == 0 && wide_lanes();
  for (int64_t c0 = 0; c0 < count; c0 += chunk) {  // the values' weighted sums, a chunk at a time
    const int64_t c1 = std::min(count, c0 + chunk);
    if (wide) {
      for (int r = 0; r < nq; ++r) weigh_lanes16(dense[r], values, c0, c1, hd, acc[r]);
      continue;
    }
    int r = 0;
    for (; r + 3 <= nq; r += 3) weigh_rows<3>(dense + r, values, c0, c1, hd, acc + r);
    if (nq - r == 2) weigh_rows<2>(dense + r, values, c0, c1, hd, acc + r);
    if (nq - r == 1) weigh_lanes(dense[r], values, c0, c1, hd, acc[r]);
  }
  for (int r = 0; r < nq; ++r) {
    const __m256 norm = _mm256_set1_ps(work[r].norm);
    for (int64_t i = 0; i < hd; i += 8) _mm256_storeu_ps(outs[r] + i, _mm256_mul_ps(_mm256_loadu_ps(acc[r] + i), norm));
  }
}

bool rowops_supported() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

// x as contiguous rows of width n: x itself where it already is (a layer's rows: no reshape to dispatch,
// ~0.3 us each, ~15 a layer), else a reshaped copy.
inline torch::Tensor as_rows(const torch::Tensor& x, int64_t n) {
  if (x.dim() == 2 && x.size(1) == n && x.is_contiguous()) return x;
  return x.reshape({-1, n}).contiguous();
}

// rows (M, n) in x's shape with its last dimension n: rows itself where x has two dimensions.
inline torch::Tensor shaped_as(const torch::Tensor& rows, const torch::Tensor& x, int64_t n) {
  if (x.dim() == 2) return rows;
  auto shape = x.sizes().vec();
  shape.back() = n;
  return rows.view(shape);
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor weight, double eps) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
  const int64_t n = x.size(-1);
  TORCH_CHECK(weight.numel() == n && n % 8 == 0, "weight must have the rows' width, a multiple of 8");
  torch::Tensor flat = as_rows(x, n), w = weight.contiguous();
  torch::Tensor out = torch::empty({flat.size(0), n}, flat.options());
  const float* xp = flat.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  float* yp = out.data_ptr<float>();
  at::parallel_for(0, flat.size(0), 64, [&](int64_t r0, int64_t r1) {  // rows apart: a prompt's many
    for (int64_t r = r0; r < r1; ++r) norm_row(xp + r * n, wp, yp + r * n, n, static_cast<float>(eps));
  });
  return shaped_as(out, x, n);
}

// qkv (T, (n_heads + 2 n_kv) hd) contiguous; cos, sin (T, hd). q_norm/k_norm: (hd) or empty.
void qk_rope_(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t n_heads, int64_t n_kv, int64_t hd,
              torch::Tensor q_norm, torch::Tensor k_norm, double eps) {
  TORCH_CHECK(qkv.scalar_type() == torch::kFloat32 && qkv.is_contiguous(), "qkv: contiguous float32");
  TORCH_CHECK(hd % 16 == 0, "head_dim must be a multiple of 16");
  const int64_t width = (n_heads + 2 * n_kv) * hd;
  TORCH_CHECK(qkv.size(-1) == width, "qkv rows hold ", qkv.size(-1), " values, expected ", width);
  const int64_t T = qkv.numel() / width;
  torch::Tensor c = as_rows(cos, hd), s = as_rows(sin, hd);
  TORCH_CHECK(c.size(0) == T && s.size(0) == T, "cos and sin need one row per position");
  const bool norms = q_norm.numel() > 0;
  torch::Tensor qn = norms ? q_norm.contiguous() : q_norm, kn = norms ? k_norm.contiguous() : k_norm;
  float* base = qkv.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const float* qw = norms ? qn.data_ptr<float>() : nullptr;
  const float* kw = norms ? kn.data_ptr<float>() : nullptr;
  at::parallel_for(0, T, 64, [&](int64_t t0, int64_t t1) {  // rows apart: a prompt's many
    for (int64_t t = t0; t < t1; ++t) {
      float* row = base + t * width;
      for (int64_t h = 0; h < n_heads + n_kv; ++h) {
        float* head = row + h * hd;
        if (norms) norm_row(head, h < n_heads ? qw : kw, head, hd, static_cast<float>(eps));
        rope_head(head, cp + t * hd, sp + t * hd, hd);
      }
    }
  });
}

// T positions' heads: head h of position t at `at + h * head + t * pos` (a fused QKV block's rows, or a
// (1, heads, T, hd) tensor with contiguous rows).
struct Heads {
  const float* at;
  int64_t head, pos;
  const float* of(int64_t h, int64_t t) const { return at + h * head + t * pos; }
};

// One sequence's part of an attention call: its new keys and values written into its cache, and the
// queries' output (1, T, Hq, hd) that attend_all fills.
struct AttendJob {
  Heads q;
  torch::Tensor mask, out;
  const void* kc;  // the caches' storage: float, or float16 bits (uint16_t) where half
  const void* vc;
  bool half;
  const bool* mp;
  int64_t n_heads, n_kv, T, hd, lo, count, capacity;
};

// The new keys and values of T positions into the caches' slots start.. (rows of C).
template <class C>
void write_rows(C* kc, C* vc, const Heads& k, const Heads& v, int64_t n_kv, int64_t T, int64_t hd, int64_t capacity,
                int64_t start) {
  for (int64_t h = 0; h < n_kv; ++h)
    for (int64_t t = 0; t < T; ++t) {
      store_row(kc + (h * capacity + start + t) * hd, k.of(h, t), hd);
      store_row(vc + (h * capacity + start + t) * hd, v.of(h, t), hd);
    }
}

AttendJob attend_job(Heads q, Heads k, Heads v, int64_t n_heads, int64_t n_kv, int64_t T, int64_t hd,
                     torch::Tensor k_cache, torch::Tensor v_cache, int64_t start, int64_t lo, torch::Tensor visible) {
  const bool half = k_cache.scalar_type() == torch::kHalf;
  TORCH_CHECK((half || k_cache.scalar_type() == torch::kFloat32) && v_cache.scalar_type() == k_cache.scalar_type(),
              "the caches: both float32 or both float16");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the caches must be contiguous");
  const int64_t end = start + T, count = end - lo, capacity = k_cache.size(1);
  TORCH_CHECK(hd % 8 == 0 && n_heads % n_kv == 0 && end <= capacity && lo >= 0 && lo <= start, "bad shapes");
  TORCH_CHECK(visible.numel() == 0 || (visible.scalar_type() == torch::kBool && visible.size(0) == T &&
                                       visible.size(1) == count), "visible: (T, end - lo) bool");
  void* kc = k_cache.data_ptr();
  void* vc = v_cache.data_ptr();
  if (half)
    write_rows(static_cast<uint16_t*>(kc), static_cast<uint16_t*>(vc), k, v, n_kv, T, hd, capacity, start);
  else
    write_rows(static_cast<float*>(kc), static_cast<float*>(vc), k, v, n_kv, T, hd, capacity, start);
  torch::Tensor mask = visible.numel() ? visible.contiguous() : visible;
  return AttendJob{q, mask, torch::empty({1, T, n_heads, hd}, k_cache.options().dtype(torch::kFloat32)), kc, vc, half,
                   visible.numel() ? mask.data_ptr<bool>() : nullptr, n_heads, n_kv, T, hd, lo, count, capacity};
}

AttendJob attend_job(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor k_cache, torch::Tensor v_cache,
                     int64_t start, int64_t lo, torch::Tensor visible) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k.scalar_type() == torch::kFloat32 &&
              v.scalar_type() == torch::kFloat32, "float32 only");
  TORCH_CHECK(q.dim() == 4 && q.size(0) == 1 && q.stride(3) == 1 && k.stride(3) == 1 && v.stride(3) == 1,
              "q, k, v: (1, heads, T, head_dim) with contiguous rows");
  const auto heads = [](const torch::Tensor& x) { return Heads{x.data_ptr<float>(), x.stride(1), x.stride(2)}; };
  return attend_job(heads(q), heads(k), heads(v), q.size(1), k.size(1), q.size(2), q.size(3), k_cache, v_cache, start,
                    lo, visible);
}

// The query rows of one KV head (each position's heads that share it) as blocks of up to 16, each block a
// unit of attend_all's parallel loop; blocks smaller where the units would otherwise be fewer than the
// threads (one position of a model with few KV heads).
constexpr int64_t kQueryBlock = 16;

struct RowBlocks {
  int64_t per_group, size;  // rows a KV head, rows a block
};

RowBlocks row_blocks(const AttendJob& job, int64_t groups_in_all, int64_t threads) {
  const int64_t rows = job.T * (job.n_heads / job.n_kv);
  const int64_t wanted = std::min(rows, (threads + groups_in_all - 1) / groups_in_all);  // blocks a KV head
  const int64_t count = std::max((rows + kQueryBlock - 1) / kQueryBlock, wanted);
  return RowBlocks{rows, (rows + count - 1) / count};
}

// Every (job, KV head, block of query rows) of the jobs as one parallel loop: sequences attended together
// share the threads even when each has a single query (a step of several sequences decoding one token
// each). A unit costs its rows times the keys they reach, and each thread takes a run of consecutive
// units of about equal cost: a prompt chunk's later blocks reach more keys than its earlier ones (halves by
// count left one thread ~30 % idle), and consecutive units share their KV head's keys in the thread's
// caches (units dealt out one by one cost 5-15 % on token trees). Each unit writes its own rows: the
// numbers do not depend on which thread takes it.
struct AttendUnit {
  const AttendJob* job;
  int64_t g, row0, reach;
  int nq;
};

// The mask row of a KV head's query row (position row / heads per KV head), or nullptr: every key visible.
inline const bool* row_mask(const AttendJob& job, int64_t row) {
  return job.mp ? job.mp + row / (job.n_heads / job.n_kv) * job.count : nullptr;
}

void attend_all(std::vector<AttendJob>& jobs, double scale) {
  int64_t groups = 0;
  for (const AttendJob& job : jobs) groups += job.n_kv;
  std::vector<AttendUnit> units;
  std::vector<double> cost{0.0};  // cumulative
  const bool* allowed[kQueryBlock];
  for (const AttendJob& job : jobs) {
    const RowBlocks b = row_blocks(job, groups, at::get_num_threads());
    for (int64_t g = 0; g < job.n_kv; ++g)
      for (int64_t row0 = 0; row0 < b.per_group; row0 += b.size) {
        const int nq = static_cast<int>(std::min(b.size, b.per_group - row0));
        for (int r = 0; r < nq; ++r) allowed[r] = row_mask(job, row0 + r);
        units.push_back(AttendUnit{&job, g, row0, block_reach(allowed, nq, job.count), nq});
        cost.push_back(cost.back() + static_cast<double>(nq) * (units.back().reach + 16));
      }
  }
  const int64_t n = static_cast<int64_t>(units.size());
  const int64_t takers = cost.back() < 512 ? 1 : std::min<int64_t>(n, at::get_num_threads());  // a few keys: one
  at::parallel_for(0, takers, 1, [&](int64_t t0, int64_t t1) {
    std::vector<QueryWork> work;
    const float* qs[kQueryBlock];
    const bool* seen[kQueryBlock];
    float* outs[kQueryBlock];
    const auto first_at = [&](int64_t t) {  // the unit boundary nearest to t / takers of the total cost
      const double target = cost.back() * t / takers;
      const int64_t i = std::lower_bound(cost.begin(), cost.end(), target) - cost.begin();
      return i > 0 && target - cost[i - 1] < cost[i] - target ? i - 1 : i;
    };
    for (int64_t u = first_at(t0), end = t1 == takers ? n : first_at(t1); u < end; ++u) {
      const AttendUnit& unit = units[u];
      const AttendJob& job = *unit.job;
      const int64_t per_group = job.n_heads / job.n_kv;
      for (int r = 0; r < unit.nq; ++r) {  // row = position t, then head h of the group
        const int64_t row = unit.row0 + r, t = row / per_group, h = unit.g * per_group + row % per_group;
        qs[r] = job.q.of(h, t);
        seen[r] = row_mask(job, row);
        outs[r] = job.out.data_ptr<float>() + (t * job.n_heads + h) * job.hd;
      }
      const int64_t from = (unit.g * job.capacity + job.lo) * job.hd;  // the KV head's first visible row
      if (job.half)
        attend_rows(qs, seen, outs, unit.nq, static_cast<const uint16_t*>(job.kc) + from,
                    static_cast<const uint16_t*>(job.vc) + from, unit.reach, job.hd, static_cast<float>(scale), work);
      else
        attend_rows(qs, seen, outs, unit.nq, static_cast<const float*>(job.kc) + from,
                    static_cast<const float*>(job.vc) + from, unit.reach, job.hd, static_cast<float>(scale), work);
    }
  });
}

// q (1, Hq, T, hd), k and v (1, Hkv, T, hd): any strides with a contiguous last dimension (views of
// a fused QKV block). k_cache, v_cache (Hkv, capacity, hd) contiguous, both float32 or both float16. The new keys and values go to
// slots start..start+T-1; query t sees keys lo..start+T-1 where visible[t][j - lo] (all if empty).
// Returns (1, T, Hq, hd).
torch::Tensor attend(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor k_cache, torch::Tensor v_cache,
                     int64_t start, int64_t lo, torch::Tensor visible, double scale) {
  std::vector<AttendJob> jobs{attend_job(q, k, v, k_cache, v_cache, start, lo, visible)};
  attend_all(jobs, scale);
  return jobs[0].out;
}


// silu(g) u (Llama) or gelu_tanh(g) u (Gemma) for rows [g | u] of width 2n (n a multiple of 8), exp8 for
// the exponentials: silu(g) = g / (1 + e^-g); gelu_tanh(g) = g / (1 + e^-2y), y = sqrt(2/pi)(g + 0.044715 g^3)
// (= 0.5 g (1 + tanh y)).
SPECDEC_AVX2 void act_mul_row(const float* gu, float* out, int64_t n, bool gelu) {
  const __m256 one = _mm256_set1_ps(1.f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gu + i), u = _mm256_loadu_ps(gu + n + i);
    __m256 z = _mm256_sub_ps(_mm256_setzero_ps(), g);  // silu: e^-g
    if (gelu) {
      const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(0.044715f), g), _mm256_mul_ps(g, g), g);
      z = _mm256_mul_ps(_mm256_set1_ps(-1.5957691216057308f), inner);  // -2 sqrt(2/pi) (g + 0.044715 g^3)
    }
    const __m256 act = _mm256_div_ps(g, _mm256_add_ps(one, exp8(z)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(act, u));
  }
}

torch::Tensor act_mul(torch::Tensor gu, bool gelu) {
  TORCH_CHECK(gu.scalar_type() == torch::kFloat32, "float32 only");
  const int64_t width = gu.size(-1), n = width / 2;
  TORCH_CHECK(width % 16 == 0, "rows must hold [gate | up], each a multiple of 8 wide");
  torch::Tensor flat = as_rows(gu, width);
  torch::Tensor out = torch::empty({flat.size(0), n}, gu.options());
  const float* in = flat.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, flat.size(0), 8, [&](int64_t r0, int64_t r1) {  // rows apart where there are many
    for (int64_t r = r0; r < r1; ++r) act_mul_row(in + r * width, op + r * n, n, gelu);
  });
  return shaped_as(out, gu, n);
}

}  // namespace
