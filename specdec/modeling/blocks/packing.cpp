// The packed layout (formats.h): a matrix's blocks rewritten once at load for the int8 products, and the
// activations rounded to int8 per row and group for each call; AVX2, so every path multiplies the same codes.

#include "formats.h"

namespace specdec::blocks {
namespace {

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
SPECDEC_AVX2 void quantize_acts_avx2(PackedActs& out, const float* x, int64_t M, int64_t K, int64_t G, bool zero_padding) {
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

}  // namespace

void pack_blocks(int64_t kind, const uint8_t* w, int64_t blocks, int64_t row_bytes, int64_t K, uint8_t* out,
                 int64_t stride) {
  by_kind(kind, [&](auto k) {
    at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) pack_block<k()>(w, row_bytes, K, b, out + b * stride);
    });
  });
}

void quantize_acts_into(PackedActs& out, const float* x, int64_t M, int64_t K, int64_t G, bool zero_padding) {
  quantize_acts_avx2(out, x, M, K, G, zero_padding);
}

PackedActs quantize_acts(const float* x, int64_t M, int64_t K, int64_t G) {
  PackedActs out{};
  quantize_acts_avx2(out, x, M, K, G, true);
  return out;
}

}  // namespace specdec::blocks
