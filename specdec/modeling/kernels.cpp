// CPU kernels for the lean backend's bfloat16 decode step (built on first use by kernels.py).
//
// At batch size one a target step reads every weight once and does almost no arithmetic, so it
// should run at the speed of memory. oneDNN's general GEMM does not for a handful of rows (~14 GB/s
// on the 1-8 row shapes of a small model, 2 cores), and each small elementwise op dispatched from
// Python costs more than its arithmetic. These kernels do one job each:
//
//   linear     x @ w.T for a few rows x, weights in their natural (N, K) bf16 layout, AVX-512 BF16
//              dot products (vdpbf16ps: exact bf16 products summed in fp32), optional residual add;
//              linear_tiles the same on AMX tiles (both in bf16/products.cpp);
//   rms_norm   RMSNorm in fp32 with the rounding points of Llama's and Gemma's modules;
//   attend     split a fused QKV row block, Gemma's q/k norms, RoPE, the KV cache write at the
//              positions, and causal (optionally sliding-window) attention with grouped KV heads;
//   act_mul    act(gate) * up on a fused gate/up block.
//
// Rounding follows the transformers modules (bf16 after each op they do in bf16), so the logits
// agree with transformers' within bf16 tolerance (tests/test_kernels.py and tests/test_lean.py).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "amx.h"
#include "bf16/bf16.h"

namespace {

using namespace specdec::bf16_ops;

// One row of RMSNorm: Gemma (weight_f32 = 1 + w): bf16(x * r * weight); Llama (bf16 weight):
// bf16(weight * bf16(x * r)), with r = 1 / sqrt(mean(x^2) + eps), all in fp32.
SPECDEC_AVX512 void rms_row(const bf16* x, int64_t K, const float* gemma_w, const bf16* llama_w, double eps,
                            bf16* out) {
  __m512 squares = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __m512 v = widen(x + k, mask16(K - k));
    squares = _mm512_fmadd_ps(v, v, squares);
  }
  const float ss = _mm512_reduce_add_ps(squares);
  const __m512 r = _mm512_set1_ps(1.f / std::sqrt(ss / static_cast<float>(K) + static_cast<float>(eps)));
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = mask16(K - k);
    const __m512 normed = _mm512_mul_ps(widen(x + k, mask), r);
    const __m512 y = gemma_w ? _mm512_mul_ps(normed, _mm512_maskz_loadu_ps(mask, gemma_w + k))
                             : _mm512_mul_ps(widen(llama_w + k, mask), rounded(normed));
    _mm256_mask_storeu_epi16(out + k, mask, to_bf16(y));
  }
}

// x (M, K) bf16; weight (K,) fp32 for Gemma's (1 + w) form, bf16 for Llama's.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_bf16(x, "x", 2);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1) && weight.is_contiguous(), "weight must be (K,)");
  const bool gemma = weight.scalar_type() == at::kFloat;
  TORCH_CHECK(gemma || weight.scalar_type() == at::kBFloat16, "weight must be float32 (Gemma) or bfloat16 (Llama)");
  at::Tensor out = at::empty_like(x);
  const int64_t M = x.size(0), K = x.size(1);
  for (int64_t m = 0; m < M; ++m)
    rms_row(x.data_ptr<bf16>() + m * K, K, gemma ? weight.data_ptr<float>() : nullptr,
            gemma ? nullptr : weight.data_ptr<bf16>(), eps, out.data_ptr<bf16>() + m * K);
  return out;
}

// RoPE on one head vector, rounding like transformers' bf16 `x * cos + rotate_half(x) * sin`
// (signed_sin carries rotate_half's minus).
SPECDEC_AVX512 void rope_row(const bf16* x, const bf16* cos, const bf16* signed_sin, int64_t hd, bf16* out) {
  const int64_t half = hd / 2;
  if (half % 16 != 0) {
    for (int64_t j = 0; j < hd; ++j) {
      const float partner = static_cast<float>(x[j < half ? j + half : j - half]);
      const float a = round_bf16(static_cast<float>(x[j]) * static_cast<float>(cos[j]));
      const float b = round_bf16(partner * static_cast<float>(signed_sin[j]));
      out[j] = bf16(a + b);
    }
    return;
  }
  for (int64_t j = 0; j < hd; j += 16) {
    const __m512 a = rounded(_mm512_mul_ps(widen(x + j, 0xFFFF), widen(cos + j, 0xFFFF)));
    const __m512 b = rounded(_mm512_mul_ps(widen(x + (j < half ? j + half : j - half), 0xFFFF),
                                           widen(signed_sin + j, 0xFFFF)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), to_bf16(_mm512_add_ps(a, b)));
  }
}

// exp(x) for x <= 0 (softmax after subtracting the maximum): 2^n * 2^f with n = round(x log2 e),
// |f| <= 1/2, 2^f by its degree-7 Taylor polynomial (relative error ~1e-8), scaled by vscalefps.
SPECDEC_AVX512 inline __m512 exp_ps(__m512 x) {
  static constexpr float kCoef[] = {1.f, 0.6931471805599453f, 0.2402265069591007f, 0.05550410866482158f,
                                    0.009618129107628477f, 0.0013333558146428443f, 0.00015403530393381606f,
                                    1.525273380405984e-05f};
  const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-100.f)), _mm512_set1_ps(1.4426950408889634f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(kCoef[7]);
  for (int i = 6; i >= 0; --i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kCoef[i]));
  return _mm512_scalef_ps(p, n);
}

// scores[0..count) <- exp(scores - top) in place, summed in 16 lanes by index; returns 1 / the sum.
// (A key's lane is its number among the keys a query sees: see attend_row.)
SPECDEC_AVX512 inline float exp_in_place(float* scores, int64_t count, float top) {
  __m512 sums = _mm512_setzero_ps();
  for (int64_t j = 0; j < count; j += 16) {
    const __mmask16 mask = mask16(count - j);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, scores + j), _mm512_set1_ps(top)));
    _mm512_mask_storeu_ps(scores + j, mask, e);
    sums = _mm512_add_ps(sums, _mm512_maskz_mov_ps(mask, e));
  }
  return 1.f / _mm512_reduce_add_ps(sums);
}

// q (hd,) against keys [lo, hi] of one KV head; writes bf16 softmax(q k^T * scale) v to out.
// allowed (nullptr: all): allowed[j - lo] says whether key j is visible (a token tree's ancestors).
// The visible keys are numbered from 0 in order, and that number, not the slot, picks the lane of
// the exponentials' sum: a tree's node then gets the numbers the same position gets in a chain.
SPECDEC_AVX512 void attend_row(const bf16* q, const bf16* keys, const bf16* values, int64_t lo, int64_t hi,
                               const bool* allowed, int64_t hd, float scale, std::vector<float>& scores,
                               std::vector<int64_t>& slots, bf16* out) {
  const int64_t span = hi - lo + 1;
  scores.resize(span);
  slots.resize(span);
  float top = -INFINITY;
  int64_t count = 0;
  for (int64_t j = 0; j < span; ++j) {
    if (allowed != nullptr && !allowed[j]) continue;
    const bf16* key = keys + (lo + j) * hd;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < hd; k += 32) {
      const __mmask32 mask = mask32(hd - k);
      acc = _mm512_dpbf16_ps(acc, load_bf16(q + k, mask), load_bf16(key + k, mask));
    }
    slots[count] = lo + j;
    scores[count] = _mm512_reduce_add_ps(acc) * scale;
    top = std::max(top, scores[count++]);
  }
  const float inv = exp_in_place(scores.data(), count, top);
  for (int64_t k = 0; k < hd; k += 16) {
    const __mmask16 mask = mask16(hd - k);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < count; ++j)
      acc = _mm512_fmadd_ps(_mm512_set1_ps(scores[j]), widen(values + slots[j] * hd + k, mask), acc);
    acc = _mm512_mul_ps(acc, _mm512_set1_ps(inv));
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    for (int64_t i = 0; i < 16 && k + i < hd; ++i) out[k + i] = bf16(lanes[i]);
  }
}

// Lane i of the result = the sum of v[i]'s 16 lanes: 16 horizontal sums in 15 shuffle-add pairs
// (instead of 16 separate reductions of ~8 instructions each).
SPECDEC_AVX512 inline __m512 sum16(const __m512* v) {
  __m512 t[8], u[4], w[2];
  for (int k = 0; k < 8; ++k)  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
    t[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
  for (int k = 0; k < 4; ++k)  // per 128-bit lane: one partial sum of each of v[4k .. 4k+3]
    u[k] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * k], t[2 * k + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * k], t[2 * k + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  for (int k = 0; k < 2; ++k)  // add the 128-bit lanes pairwise
    w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2 * k], u[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

constexpr int kRowBlock = 6;  // query rows sharing one pass over the keys (24 accumulators for hd 64)

// Scores of up to kRowBlock query rows against the keys of one KV head on AMX tiles (configure_tiles
// first): scores[r * width + j - first] = (q_r . k_j) * scale for j in [lo[r], hi[r]]. Per 16 keys one
// product S^T = K Q^T (the keys read in place from the cache, Q^T in the B operand's pairs), so every
// (row, key) goes through the same tile instructions whatever else shares the block.
SPECDEC_AMX void score_rows_tiles(const bf16* const* q, int rows, const int64_t* lo, const int64_t* hi, int64_t first,
                                  int64_t last, const bf16* keys, int64_t hd, float scale, float* scores,
                                  int64_t width) {
  const int64_t chunks = hd / 32;
  alignas(64) uint32_t qt[8][16][16] = {};  // [chunk][pair kk][row m] = (q_m[32c + 2kk], q_m[32c + 2kk + 1])
  for (int m = 0; m < rows; ++m) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(q[m]);
    for (int64_t c = 0; c < chunks; ++c)
      for (int kk = 0; kk < 16; ++kk) qt[c][kk][m] = src[c * 16 + kk];
  }
  alignas(64) float st[16][16];
  alignas(64) bf16 tail[16 * 256];
  for (int64_t j0 = first; j0 <= last; j0 += 16) {
    const int64_t count = std::min<int64_t>(16, last - j0 + 1);
    const bf16* block = keys + j0 * hd;
    if (count < 16) {  // the last keys: a zero-padded copy, so the tile reads nothing past them
      std::memset(static_cast<void*>(tail), 0, sizeof(tail));
      std::memcpy(static_cast<void*>(tail), block, count * hd * sizeof(bf16));
      block = tail;
    }
    _tile_zero(0);
    for (int64_t c = 0; c < chunks; ++c) {
      _tile_loadd(1, block + c * 32, hd * 2);
      _tile_loadd(2, qt[c], 64);
      _tile_dpbf16ps(0, 1, 2);
    }
    _tile_stored(0, st, 64);
    for (int m = 0; m < rows; ++m)
      for (int64_t jj = std::max<int64_t>(0, lo[m] - j0); jj < count && j0 + jj <= hi[m]; ++jj)
        scores[m * width + j0 + jj - first] = st[jj][m] * scale;
  }
}

// The same scores on AVX-512 BF16 dot products: each block of 16 keys scored for a row with one
// 16-way reduction.
SPECDEC_AVX512 void score_rows_dots(const bf16* const* q, int rows, const int64_t* lo, const int64_t* hi,
                                    int64_t first, const bf16* keys, int64_t hd, float scale, float* scores,
                                    int64_t width) {
  const int64_t chunks = hd / 32;
  for (int r = 0; r < rows; ++r) {
    __m512bh qv[8];
    for (int64_t c = 0; c < chunks; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(q[r] + c * 32);
    float* row = scores + r * width;
    for (int64_t j0 = lo[r]; j0 <= hi[r]; j0 += 16) {
      const int64_t count = std::min<int64_t>(16, hi[r] - j0 + 1);
      __m512 acc[16];
      for (int jj = 0; jj < 16; ++jj) {
        acc[jj] = _mm512_setzero_ps();
        if (jj < count)
          for (int64_t c = 0; c < chunks; ++c)
            acc[jj] = _mm512_dpbf16_ps(acc[jj], qv[c], (__m512bh)_mm512_loadu_si512(keys + (j0 + jj) * hd + c * 32));
      }
      _mm512_mask_storeu_ps(row + (j0 - first), mask16(count), _mm512_mul_ps(sum16(acc), _mm512_set1_ps(scale)));
    }
  }
}

// Attention for up to kRowBlock query rows of one KV head (head_dim a multiple of 64, at most 256):
// row r attends to keys [lo[r], hi[r]] (those where allowed[r][j - lo[r]], if allowed[r] is given).
// Scored on tiles or dot products (score_rows_tiles, score_rows_dots); each value row is widened to
// fp32 once for all the rows. A masked row's visible keys are numbered among themselves
// for the exponentials' sum, as attend_row does (its hidden keys weigh 0 in the values' sum).
SPECDEC_AVX512 void attend_rows(const bf16* const* q, int rows, const int64_t* lo, const int64_t* hi,
                                const bool* const* allowed, const bf16* keys, const bf16* values, int64_t hd,
                                float scale, bool tiles, std::vector<float>& scores, std::vector<float>& compact,
                                bf16* const* out) {
  const int64_t first = *std::min_element(lo, lo + rows), last = *std::max_element(hi, hi + rows);
  const int64_t width = (last - first + 16) / 16 * 16;
  scores.assign(static_cast<size_t>(rows) * width, 0.f);
  float inv[kRowBlock];  // 1 / the softmax denominator of each row, applied to its output
  if (tiles)
    score_rows_tiles(q, rows, lo, hi, first, last, keys, hd, scale, scores.data(), width);
  else
    score_rows_dots(q, rows, lo, hi, first, keys, hd, scale, scores.data(), width);
  for (int r = 0; r < rows; ++r) {
    float* row = scores.data() + r * width;
    if (allowed[r] != nullptr) {  // a tree's row: the visible keys' scores in order, then as below
      const int64_t span = hi[r] - lo[r] + 1;
      compact.resize(span + 16);
      int64_t count = 0;
      float top = -INFINITY;
      for (int64_t j = 0; j < span; ++j)
        if (allowed[r][j]) {
          compact[count] = row[lo[r] + j - first];
          top = std::max(top, compact[count++]);
        }
      inv[r] = exp_in_place(compact.data(), count, top);
      for (int64_t j = 0, n = 0; j < span; ++j) row[lo[r] + j - first] = allowed[r][j] ? compact[n++] : 0.f;
      continue;
    }
    __m512 tops = _mm512_set1_ps(-INFINITY);
    for (int64_t j = lo[r]; j <= hi[r]; j += 16) {  // masked load: the row's last block may end the buffer
      const __mmask16 mask = mask16(hi[r] - j + 1);
      tops = _mm512_mask_max_ps(tops, mask, tops, _mm512_maskz_loadu_ps(mask, row + (j - first)));
    }
    // keys outside [lo, hi] keep probability 0
    inv[r] = exp_in_place(row + (lo[r] - first), hi[r] - lo[r] + 1, _mm512_reduce_max_ps(tops));
  }
  for (int64_t d0 = 0; d0 < hd; d0 += 64) {
    __m512 acc[kRowBlock][4];
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_setzero_ps();
    for (int64_t j = first; j <= last; ++j) {
      __m512 v[4];
      for (int c = 0; c < 4; ++c) v[c] = widen(values + j * hd + d0 + c * 16, 0xFFFF);
      for (int r = 0; r < rows; ++r) {
        const __m512 p = _mm512_set1_ps(scores[r * width + (j - first)]);
        for (int c = 0; c < 4; ++c) acc[r][c] = _mm512_fmadd_ps(p, v[c], acc[r][c]);
      }
    }
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 4; ++c) {
        alignas(64) float lanes[16];
        _mm512_store_ps(lanes, _mm512_mul_ps(acc[r][c], _mm512_set1_ps(inv[r])));
        for (int i = 0; i < 16; ++i) out[r][d0 + c * 16 + i] = bf16(lanes[i]);
      }
  }
}

// qkv (n, (Hq + 2 Hkv) hd) -> attention output (n, Hq hd). Writes the rotated keys and the values
// of positions start..start+n-1 into the caches (Hkv, capacity, hd). window = 0: full attention.
// One sequence's rows of an attention call: rows row0..row0+n-1 of qkv, at cache slots start..start+n-1.
// A token tree (pos_of given): row i is RoPE'd at pos_of[i], still written to slot start + i, and sees
// the slots lo_visible..start+i where vis[i][slot - lo_visible] (the window already applied).
struct AttendSeq {
  bf16* kc;
  bf16* vc;
  int64_t capacity, start, n, row0, lo_visible = 0;
  const int64_t* pos_of = nullptr;
  const bool* vis = nullptr;
  at::Tensor pos_t, vis_t;  // keep pos_of and vis alive

  // Keys [lo, hi] of row i, and its mask over them (nullptr: all of them).
  void key_range(int64_t i, int64_t window, int64_t* lo, int64_t* hi, const bool** allowed) const {
    const int64_t slot = start + i;
    if (vis) {  // a tree: its parents come before it, so no row sees a slot past its own
      *lo = lo_visible;
      *allowed = vis + i * (start + n - lo_visible);
    } else {
      *lo = window > 0 ? std::max<int64_t>(0, slot - window + 1) : 0;
      *allowed = nullptr;
    }
    *hi = slot;
  }
};

// qkv (R, (Hq + 2 Hkv) hd) holding each sequence's rows in turn -> attention output (R, Hq hd). Writes
// each sequence's rotated keys and values into its caches (Hkv, capacity, hd); window = 0: full
// attention. positions[j] / visible[j] empty: sequence j is a chain; else a tree, as AttendSeq says.
// All sequences' (KV head, row block) units run in one parallel loop.
at::Tensor attend_many(const at::Tensor& qkv, int64_t n_heads, int64_t n_kv, const at::Tensor& cos,
                       const at::Tensor& signed_sin, const std::vector<at::Tensor>& k_caches,
                       const std::vector<at::Tensor>& v_caches, const std::vector<int64_t>& starts,
                       const std::vector<int64_t>& rows, int64_t window, double scale,
                       const c10::optional<at::Tensor>& q_norm, const c10::optional<at::Tensor>& k_norm, double eps,
                       const std::vector<at::Tensor>& positions, const std::vector<int64_t>& los,
                       const std::vector<at::Tensor>& visibles, bool tiles) {
  check_bf16(qkv, "qkv", 2);
  check_bf16(cos, "cos", 2);
  check_bf16(signed_sin, "signed_sin", 2);
  const size_t count = k_caches.size();
  TORCH_CHECK(count >= 1 && v_caches.size() == count && starts.size() == count && rows.size() == count &&
              positions.size() == count && los.size() == count && visibles.size() == count,
              "one cache pair, start, row count, positions, lo and visible per sequence");
  const int64_t total = qkv.size(0), hd = k_caches[0].size(2);
  TORCH_CHECK(qkv.size(1) == (n_heads + 2 * n_kv) * hd, "qkv width does not match the heads");
  TORCH_CHECK(n_heads % n_kv == 0 && hd % 2 == 0, "heads must group evenly, head_dim must be even");
  TORCH_CHECK(cos.size(1) == hd, "the RoPE table's width is not head_dim");
  std::vector<AttendSeq> seqs(count);
  int64_t row0 = 0;
  for (size_t j = 0; j < count; ++j) {
    check_bf16(k_caches[j], "k_cache", 3);
    check_bf16(v_caches[j], "v_cache", 3);
    AttendSeq& s = seqs[j];
    s.kc = k_caches[j].data_ptr<bf16>();
    s.vc = v_caches[j].data_ptr<bf16>();
    s.capacity = k_caches[j].size(1);
    s.start = starts[j];
    s.n = rows[j];
    s.row0 = row0;
    row0 += s.n;
    TORCH_CHECK(k_caches[j].size(0) == n_kv && k_caches[j].size(2) == hd && v_caches[j].sizes() == k_caches[j].sizes(),
                "caches must be (n_kv, capacity, head_dim)");
    TORCH_CHECK(s.start >= 0 && s.start + s.n <= s.capacity && cos.size(0) >= s.start + s.n,
                "cache or RoPE table too short");
    TORCH_CHECK(positions[j].numel() == 0 || positions[j].numel() == s.n, "positions: one per row");
    TORCH_CHECK((positions[j].numel() == 0) == (visibles[j].numel() == 0), "a tree needs both positions and visible");
    if (positions[j].numel()) {
      s.pos_t = positions[j].to(at::kLong).contiguous();
      s.vis_t = visibles[j].contiguous();
      s.lo_visible = los[j];
      TORCH_CHECK(s.vis_t.scalar_type() == at::kBool && s.vis_t.dim() == 2 && s.vis_t.size(0) == s.n &&
                  s.vis_t.size(1) == s.start + s.n - s.lo_visible && s.lo_visible >= 0 && s.lo_visible <= s.start,
                  "visible: (rows, start + rows - lo) bool");
      s.pos_of = s.pos_t.data_ptr<int64_t>();
      s.vis = s.vis_t.data_ptr<bool>();
      for (int64_t i = 0; i < s.n; ++i)
        TORCH_CHECK(s.pos_of[i] >= 0 && s.pos_of[i] < cos.size(0), "a position is outside the RoPE table");
    }
  }
  TORCH_CHECK(row0 == total, "the sequences hold ", row0, " rows, qkv has ", total);
  const float* qn = q_norm.has_value() ? q_norm->data_ptr<float>() : nullptr;
  const float* kn = k_norm.has_value() ? k_norm->data_ptr<float>() : nullptr;
  const bf16* src = qkv.data_ptr<bf16>();
  const bf16* cp = cos.data_ptr<bf16>();
  const bf16* sp = signed_sin.data_ptr<bf16>();
  const int64_t width = qkv.size(1);
  at::Tensor q = at::empty({total, n_heads * hd}, qkv.options());
  bf16* qp = q.data_ptr<bf16>();
  std::vector<bf16> normed(hd);
  for (const AttendSeq& s : seqs)
    for (int64_t i = 0; i < s.n; ++i) {
      const int64_t pos = s.pos_of ? s.pos_of[i] : s.start + i, slot = s.start + i, r = s.row0 + i;
      const bf16* row = src + r * width;
      for (int64_t h = 0; h < n_heads + n_kv; ++h) {
        const bool is_q = h < n_heads;
        const bf16* head = row + h * hd;
        const float* norm = is_q ? qn : kn;
        if (norm) {
          rms_row(head, hd, norm, nullptr, eps, normed.data());
          head = normed.data();
        }
        bf16* dst = is_q ? qp + r * n_heads * hd + h * hd : s.kc + ((h - n_heads) * s.capacity + slot) * hd;
        rope_row(head, cp + pos * hd, sp + pos * hd, hd, dst);
      }
      for (int64_t h = 0; h < n_kv; ++h)
        std::copy(row + (n_heads + n_kv + h) * hd, row + (n_heads + n_kv + h + 1) * hd,
                  s.vc + (h * s.capacity + slot) * hd);
    }
  at::Tensor out = at::empty({total, n_heads * hd}, qkv.options());
  bf16* o = out.data_ptr<bf16>();
  const int64_t group = n_heads / n_kv;
  const float scalef = static_cast<float>(scale);
  const bool blocked = hd % 64 == 0 && hd <= 256;
  TORCH_CHECK(!tiles || (blocked && amx_permitted()), "scores on tiles need AMX and a head_dim of 64, 128 or 256");
  // Work units, numbered across the sequences: blocked, up to kRowBlock (head, position) rows of one KV
  // head; else one (head, position) row.
  std::vector<int64_t> first_unit(count + 1, 0);
  int64_t keys = 0;
  for (size_t j = 0; j < count; ++j) {
    const int64_t per_kv = (group * seqs[j].n + kRowBlock - 1) / kRowBlock;
    first_unit[j + 1] = first_unit[j] + (blocked ? n_kv * per_kv : n_heads * seqs[j].n);
    keys += seqs[j].start + seqs[j].n;
  }
  const int64_t units = first_unit[count];
  const int64_t mean_keys = std::max<int64_t>(1, keys / static_cast<int64_t>(count));
  const int64_t grain = std::max<int64_t>(1, 4096 / ((blocked ? kRowBlock : 1) * mean_keys));  // a few thousand keys
  at::parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
    TileConfig outer;
    if (tiles) {
      outer = tiles_in_use();
      configure_tiles();
    }
    std::vector<float> scores, compact;
    std::vector<int64_t> slots;
    size_t j = std::upper_bound(first_unit.begin(), first_unit.end(), u0) - first_unit.begin() - 1;
    for (int64_t u = u0; u < u1; ++u) {
      while (u >= first_unit[j + 1]) ++j;
      const AttendSeq& s = seqs[j];
      const int64_t local = u - first_unit[j];
      if (blocked) {
        const int64_t rows_per_kv = group * s.n, blocks_per_kv = (rows_per_kv + kRowBlock - 1) / kRowBlock;
        const int64_t kv = local / blocks_per_kv, r0 = (local % blocks_per_kv) * kRowBlock;
        const int block = static_cast<int>(std::min<int64_t>(kRowBlock, rows_per_kv - r0));
        const bf16* q_rows[kRowBlock];
        bf16* out_rows[kRowBlock];
        int64_t lo[kRowBlock], hi[kRowBlock];
        const bool* allowed[kRowBlock];
        for (int r = 0; r < block; ++r) {
          const int64_t h = kv * group + (r0 + r) / s.n, i = (r0 + r) % s.n;
          q_rows[r] = qp + (s.row0 + i) * n_heads * hd + h * hd;
          out_rows[r] = o + (s.row0 + i) * n_heads * hd + h * hd;
          s.key_range(i, window, &lo[r], &hi[r], &allowed[r]);
        }
        attend_rows(q_rows, block, lo, hi, allowed, s.kc + kv * s.capacity * hd, s.vc + kv * s.capacity * hd, hd,
                    scalef, tiles, scores, compact, out_rows);
      } else {
        const int64_t h = local / s.n, i = local % s.n, kv = h / group;
        int64_t lo, hi;
        const bool* allowed;
        s.key_range(i, window, &lo, &hi, &allowed);
        attend_row(qp + (s.row0 + i) * n_heads * hd + h * hd, s.kc + kv * s.capacity * hd,
                   s.vc + kv * s.capacity * hd, lo, hi, allowed, hd, scalef, scores, slots,
                   o + (s.row0 + i) * n_heads * hd + h * hd);
      }
    }
    if (tiles) restore_tiles(outer);
  });
  return out;
}

// attend_many for one sequence (positions and visible: a token tree, see AttendSeq).
at::Tensor attend(const at::Tensor& qkv, int64_t n_heads, int64_t n_kv, const at::Tensor& cos,
                  const at::Tensor& signed_sin, at::Tensor& k_cache, at::Tensor& v_cache, int64_t start,
                  int64_t window, double scale, const c10::optional<at::Tensor>& q_norm,
                  const c10::optional<at::Tensor>& k_norm, double eps, const c10::optional<at::Tensor>& positions,
                  int64_t lo_visible, const c10::optional<at::Tensor>& visible) {
  const at::Tensor none = at::empty({0}, qkv.options().dtype(at::kLong));
  return attend_many(qkv, n_heads, n_kv, cos, signed_sin, {k_cache}, {v_cache}, {start}, {qkv.size(0)}, window, scale,
                     q_norm, k_norm, eps, {positions.value_or(none)}, {lo_visible},
                     {visible.value_or(none.to(at::kBool))}, false);
}

// gate_up (n, 2F) -> act(gate) * up (n, F), rounding each op to bf16 as the modules do.
at::Tensor act_mul(const at::Tensor& gate_up, bool gelu_tanh) {
  check_bf16(gate_up, "gate_up", 2);
  const int64_t F = gate_up.size(1) / 2;
  at::Tensor gate = gate_up.narrow(1, 0, F), up = gate_up.narrow(1, F, F);
  return (gelu_tanh ? at::gelu(gate, "tanh") : at::silu(gate)).mul_(up);
}

bool supported() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("supported", &supported, "whether this CPU has the AVX-512 BF16 instructions the kernels use");
  m.def("linear", &linear, "x @ w.T (+ residual) for a few bf16 rows", py::arg("x"), py::arg("w"),
        py::arg("residual") = py::none());
  m.def("tiles_supported", &amx_permitted, "whether this CPU and kernel run AMX bf16 tiles");
  m.def("pack_tiles", &pack_tiles, "w (N, K) bf16 packed for linear_tiles", py::arg("w"));
  m.def("linear_tiles", &linear_tiles, "x @ w.T (+ residual) on AMX tiles, w from pack_tiles", py::arg("x"),
        py::arg("packed"), py::arg("n"), py::arg("residual") = py::none());
  m.def("rms_norm", &rms_norm, "RMSNorm with Llama's or Gemma's rounding", py::arg("x"), py::arg("weight"),
        py::arg("eps"));
  m.def("attend", &attend, "QKV split, q/k norm, RoPE, KV cache write and causal (or tree) attention",
        py::arg("qkv"), py::arg("n_heads"), py::arg("n_kv"), py::arg("cos"), py::arg("signed_sin"), py::arg("k_cache"),
        py::arg("v_cache"), py::arg("start"), py::arg("window"), py::arg("scale"), py::arg("q_norm"), py::arg("k_norm"),
        py::arg("eps"), py::arg("positions") = py::none(), py::arg("lo") = 0, py::arg("visible") = py::none());
  m.def("attend_many", &attend_many, "attend for several sequences' rows in one call (chains or trees)",
        py::arg("qkv"), py::arg("n_heads"), py::arg("n_kv"), py::arg("cos"), py::arg("signed_sin"), py::arg("k_caches"),
        py::arg("v_caches"), py::arg("starts"), py::arg("rows"), py::arg("window"), py::arg("scale"), py::arg("q_norm"),
        py::arg("k_norm"), py::arg("eps"), py::arg("positions"), py::arg("los"), py::arg("visibles"),
        py::arg("tiles") = false);
  m.def("act_mul", &act_mul, "act(gate) * up", py::arg("gate_up"), py::arg("gelu_tanh"));
}
