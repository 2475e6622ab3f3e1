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

#include "amx.h"            // amx_granted
#include "blocks/formats.h"  // the block formats, and the products blocks/*.cpp define
#include "rowops.h"         // the row-wise ops layer_step calls

using namespace specdec::blocks;

namespace {



// Whether the packed products take vpdpbusd (where the CPU has AVX-512 VNNI; set_vnni turns it off, for
// tests and benchmarks: the AVX2 products give the same bits).
bool& vnni_on() {
  static bool on = vnni_supported();
  return on;
}

int64_t vnni_max_rows = 24;  // more rows go to AMX where it runs: even with vpdpbusd at 32 rows, 10-15 % faster
                              // at 64 (SmolLM2, Xeon); set_packed_rows changes it (tests, benchmarks)

bool amx_int8() { return amx_granted(true); }

// out (M, N) = x (M, K) @ w.T on pack_int8's layout: the activations rounded to int8 once, then each
// thread's share of the 16-row blocks on AMX-INT8 (many rows), vpdpbusd, or AVX2.
void packed_matmul(int64_t kind, const float* xp, const uint8_t* w, float* out, int64_t M, int64_t K, int64_t N) {
  const Format f = format_of(kind);
  const bool amx = M > vnni_max_rows && vnni_on() && amx_int8();
  static thread_local PackedActs buffer;  // one call at a time on a thread: its buffers serve the next
  quantize_acts_into(buffer, xp, M, K, f.G, amx);
  const PackedActs& x = buffer;
  const int64_t blocks = N / PACKED_COLS, stride = packed_bytes(f, K);
  const bool vnni = vnni_on();
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    if (amx) {
      amx_int8_blocks(kind, x, w, stride, out, N, b0, b1);
    } else if (vnni) {
      vnni_blocks(kind, x, w, stride, out, N, b0, b1);
    } else {
      avx2_blocks(kind, x, w, stride, out, N, b0, b1);
    }
  });
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
  pack_blocks(kind, wp, blocks, row_bytes, K, op, stride);
  return out;
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
  if (M > 0) {
    if (prompt) {
      prompt_matmul(kind, xp, wp, op, M, K, N);
    } else {
      packed_matmul(kind, xp, wp, op, M, K, N);
    }
  }
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
  if (kind == F16 || kind == BF16) {  // unquantised weights: float32 activations whatever int8 says
    TORCH_CHECK(w.size(1) == 2 * in_features && x.size(-1) == in_features, "w's rows hold ", w.size(1),
                " bytes, expected ", 2 * in_features);
    torch::Tensor x2 = as_rows(x, in_features);
    torch::Tensor out = torch::empty({x2.size(0), w.size(0)}, x.options());
    half_matmul(kind, x2.data_ptr<float>(), reinterpret_cast<const uint16_t*>(w.data_ptr<uint8_t>()),
                out.data_ptr<float>(), x2.size(0), in_features, w.size(0));
    return shaped_as(out, x, w.size(0));
  }
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
  file_matmul(kind, xp, wp, op, M, K, N, int8);
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

// A decoder layer's weights as layer_steps takes them.
struct BlockLayer {
  std::vector<std::vector<torch::Tensor>> blocks;  // per projection (qkv, o, gate/up, down): its parts' blocks
  std::vector<std::vector<int64_t>> kinds;         // and each part's block kind
  std::vector<torch::Tensor> norms;                // attn_in, mlp_in, q, k, attn_out, mlp_out; empty where none
  torch::Tensor qkv_bias;                          // the QKV projection's bias (Qwen2), or empty
};

// What every layer of the model shares: its shapes and how it computes.
struct ModelShape {
  int64_t n_heads, n_kv, hd;
  double eps, scale;
  bool gemma, int8;
};

// The sequences of a pass as one layer attends them: per sequence its caches of this layer, the slot its
// rows start at, the first slot they may see (lo) and which of the slots from there (visible, or empty:
// all), how many rows of h are its, and whether they are a prompt chunk.
struct LayerSequences {
  const std::vector<torch::Tensor>& k_caches;
  const std::vector<torch::Tensor>& v_caches;
  const std::vector<int64_t>& starts;
  const std::vector<int64_t>& los;
  const std::vector<torch::Tensor>& visibles;
  const std::vector<int64_t>& rows;
  const std::vector<bool>& prompts;
};

// One decoder layer of one or more sequences on GGUF blocks, in one call: what the lean backend's
// layer_aten does with rowops.cpp and these kernels (RMSNorm, fused QKV, Gemma's q/k norms + RoPE,
// attention over each sequence's cache, output projection, Gemma's norm, residual, RMSNorm, fused
// gate/up, act(gate) up, down, Gemma's norm, residual), with the same functions in the same order, so the
// same numbers to the bit; it saves the ~15 Python-level ops a layer and their dispatch. h (T, d) float32,
// the sequences' rows one after another (seq.rows[s] of them for sequence s), cos and sin (T, hd) at each
// row's position; the QKV bias added to its product as layer_aten adds it. The products take every row at once (rows do not depend on
// how many are multiplied together), attention each sequence alone.
torch::Tensor layer_steps(torch::Tensor h, const BlockLayer& layer, const ModelShape& model, const torch::Tensor& cos,
                          const torch::Tensor& sin, const LayerSequences& seq) {
  const auto& [blocks, kinds, norms, qkv_bias] = layer;
  const auto [n_heads, n_kv, hd, eps, scale, gemma, int8] = model;
  const std::vector<int64_t>& rows = seq.rows;
  TORCH_CHECK(h.dim() == 2 && h.scalar_type() == torch::kFloat32, "h: (T, d) float32");
  TORCH_CHECK(blocks.size() == 4 && kinds.size() == 4 && norms.size() == 6, "4 projections and 6 norms");
  const size_t n = rows.size();
  TORCH_CHECK(n >= 1 && seq.k_caches.size() == n && seq.v_caches.size() == n && seq.starts.size() == n &&
                  seq.los.size() == n && seq.visibles.size() == n && seq.prompts.size() == n,
              "one cache, start, lo, visible mask and prompt flag per sequence");
  const int64_t T = h.size(0), d = h.size(1), hq = n_heads * hd, hkv = n_kv * hd;
  TORCH_CHECK(std::accumulate(rows.begin(), rows.end(), int64_t{0}) == T, "the sequences' rows must add up to h's");
  const PromptRows prompt_rows(rows, seq.prompts);
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
                              n_heads, n_kv, rows[s], hd, seq.k_caches[s], seq.v_caches[s], seq.starts[s], seq.los[s],
                              seq.visibles[s]));
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
  std::vector<BlockLayer> layers;
  ModelShape model;
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
  const size_t layers = stack.layers.size(), n = rows.size();
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
    h = layer_steps(h, stack.layers[i], stack.model, cos[rope_of[i]], sin[rope_of[i]],
                    LayerSequences{ks, vs, starts, los[window_of[i]], visibles[window_of[i]], rows, prompts});
  }
  for (size_t t = 0; t < taps.size(); ++t) TORCH_CHECK(tapped[t].defined(), "taps names layer ", taps[t], " of ", layers);
  std::vector<torch::Tensor> out{h};
  out.insert(out.end(), tapped.begin(), tapped.end());
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("supported", &supported, "whether this CPU has AVX2 and FMA");
  m.def("linear", &linear, "x @ w.T on GGUF Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K blocks; float32 activations, or int8; "
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
        std::vector<BlockLayer> layers;
        for (size_t i = 0; i < blocks.size(); ++i)
          layers.push_back(BlockLayer{std::move(blocks[i]), std::move(kinds[i]), std::move(norms[i]), std::move(qkv_biases[i])});
        return LayerStack{std::move(layers), ModelShape{n_heads, n_kv, hd, eps, scale, gemma, int8}, {}, {}};
      }))
      .def("set_layout", [](LayerStack& stack, std::vector<int64_t> rope_of, std::vector<int64_t> window_of) {
        TORCH_CHECK(rope_of.size() == stack.layers.size() && window_of.size() == stack.layers.size(),
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
