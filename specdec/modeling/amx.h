// What kernels.cpp (AMX-BF16) and quant.cpp (AMX-INT8) share about AMX tiles: the tile configuration's
// layout, the one-time request for the tile state, and handing the tiles back as they were found.

#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <immintrin.h>

#include <cstdint>

namespace {

// ldtilecfg's 64-byte operand (palette 1): each tile's rows and bytes a row.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Whether cpuid shows AMX tiles with bf16 (int8 = false) or int8 products, and the kernel grants the
// tile state: Linux (>= 5.16) hands it out on request. Both are asked once for the process (callers
// check on every product, and cpuid leaves a virtual machine).
inline bool amx_granted(bool int8) {
  static const unsigned features = [] {
    unsigned a, b, c, d;
    __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!(d >> 24 & 1)) return 0u;  // AMX-TILE
    constexpr long kReqXcompPerm = 0x1023, kXtiledata = 18;
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXtiledata) == 0 ? d : 0u;
  }();
  return features >> (int8 ? 25 : 22) & 1;  // AMX-INT8, AMX-BF16
}

// The tile configuration this thread has now (all zeros: none). Another library on the same thread may
// keep its configuration loaded between its calls — llama.cpp's AMX kernels configure a thread's tiles
// once and then assume them — so every product here saves the configuration it found, loads its own, and
// loads the saved one again before it returns (zeros put the tiles back in their initial state).
__attribute__((target("amx-tile"))) inline TileConfig tiles_in_use() {
  TileConfig config;
  _tile_storeconfig(&config);
  return config;
}

__attribute__((target("amx-tile"))) inline void restore_tiles(const TileConfig& config) {
  asm volatile("" : : "r"(&config) : "memory");  // GCC would drop the stores ldtilecfg reads
  _tile_loadconfig(&config);
}

}  // namespace
