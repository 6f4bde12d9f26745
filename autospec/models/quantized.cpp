// Products of a few rows by quantized weights, out (M, N) bfloat16, float32 inside:
//   autospec::int4_mm(x, tiles, n): x (M, K) bfloat16 by a weight (N, K) in 4-bit blocks of 32
//     along K (weight = (q - 8) * scale + zero, models/weights.py Int4Blocks);
//   autospec::int8_mm(x, tiles, n): by a weight (N, K) of 8-bit values and a scale a row.
// models/quantized.py builds them and says why.
//
// A weight is laid out in tiles of 16 outputs (one AVX-512 register of float32), a tile's bytes
// contiguous, so a thread streams its tiles once for up to ROWS rows of x, prefetching AHEAD:
// - 4-bit (quantized.py `pack4`): per block of 32 inputs, 320 bytes: 8 chunks of 32 bytes (byte
//   2j + i of chunk c: output j's value at input 2c + i in the low nibble, at 2c + 16 + i in the
//   high one: one load of a chunk is two rows of the tile unit's B, bit operations apart), then
//   the 16 outputs' scales and zeros in bfloat16. Over a block, x . weight = scale * (x . q) +
//   (zero - 8 scale) * sum(x): the inner loop is q (0..15, exact in float32) times x.
// - 8-bit (`pack8`): per input 16 bytes (output j's value in byte j), then the 16 row scales.
// The inner loops are a fused multiply-add per row and 16 outputs, four chains a row. On a CPU
// with AMX, more rows go through the tile unit (tile4_amx from AMX_FROM rows, tile_wide from
// WIDE_FROM / WIDE8_FROM). Within each path a row's arithmetic is the same whatever M: a row's
// output is the same bits in any batch on that path.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t GROUP = 32, TILE = 16, ROWS = 8;
constexpr int64_t VALUE_BYTES = GROUP / 2 * TILE;
// a block's values in CHUNKS chunks of 32 bytes: byte 2j + i of chunk c holds output j's value
// at input 2c + i (low nibble) and at 2c + 16 + i (high nibble)
constexpr int64_t CHUNK_BYTES = 2 * TILE, CHUNKS = VALUE_BYTES / CHUNK_BYTES;
constexpr int64_t BLOCK_BYTES = VALUE_BYTES + 2 * TILE * 2;
// prefetched this far ahead of the block being read: a layer's weights stream from memory, and
// without it the kernel read them at 13 GB/s against torch's kernel's 17 (SmolLM2's 30 layers,
// 2 threads, ms, 1 / 5 rows: none 5.0 / 8.9, 1 KB 3.1 / 6.4, 4 KB 3.1 / 6.3, 8 KB 2.8 / 6.0)
constexpr int64_t AHEAD = 4096;

inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

inline void prefetch(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + AHEAD, _MM_HINT_T0);
}

inline __m512 bf16_to_f32(const uint16_t* p) {
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// one bfloat16 (its bits) as a float: exact
inline float bf16_at(const uint16_t* p, int64_t i) {
  uint32_t bits = uint32_t(p[i]) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline __m256i f32_to_bf16(__m512 f) {  // round to nearest even, as torch's .to(bfloat16)
  __m512i b = _mm512_castps_si512(f);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  b = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16));
}

// M rows of x (float32, row stride K; `sums` each block's sum, M x blocks) by one tile of a
// 4-bit weight: 16 outputs a row
template <int M>
void tile4(const float* x, const float* sums, const uint8_t* w, int64_t K, uint16_t* out,
           int64_t N) {
  const int64_t blocks = K / GROUP;
  __m512 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  // 0.0 .. 15.0: a value's float by vpermps, which reads only the low 4 bits of each index
  const __m512 table = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  for (int64_t g = 0; g < blocks; ++g) {
    const uint8_t* q = w + g * BLOCK_BYTES;
    const float* xg = x + g * GROUP;
    for (int64_t line = 0; line < BLOCK_BYTES; line += 64) prefetch(q + line);
    __m512 sum[M][4];  // four chains of additions a row, summed at the block's end
    for (int m = 0; m < M; ++m) sum[m][0] = sum[m][1] = sum[m][2] = sum[m][3] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int c = 0; c < CHUNKS; ++c) {
      // dword j: output j's bytes 2j, 2j + 1 (inputs 2c, 2c + 16; 2c + 1, 2c + 17)
      __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(q + c * CHUNK_BYTES)));
      __m512 a = _mm512_permutexvar_ps(v, table);
      __m512 b = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 8), table);
      __m512 h = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
      __m512 i = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 12), table);
      for (int m = 0; m < M; ++m) {
        const float* xm = xg + m * K + 2 * c;
        sum[m][0] = _mm512_fmadd_ps(_mm512_set1_ps(xm[0]), a, sum[m][0]);
        sum[m][1] = _mm512_fmadd_ps(_mm512_set1_ps(xm[1]), b, sum[m][1]);
        sum[m][2] = _mm512_fmadd_ps(_mm512_set1_ps(xm[GROUP / 2]), h, sum[m][2]);
        sum[m][3] = _mm512_fmadd_ps(_mm512_set1_ps(xm[GROUP / 2 + 1]), i, sum[m][3]);
      }
    }
    const uint16_t* scales = reinterpret_cast<const uint16_t*>(q + VALUE_BYTES);
    __m512 scale = bf16_to_f32(scales), zero = bf16_to_f32(scales + TILE);
    __m512 offset = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), scale, zero);
    for (int m = 0; m < M; ++m) {
      __m512 dot = _mm512_add_ps(_mm512_add_ps(sum[m][0], sum[m][1]),
                                 _mm512_add_ps(sum[m][2], sum[m][3]));
      acc[m] = _mm512_fmadd_ps(scale, dot, acc[m]);
      acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(sums[m * blocks + g]), offset, acc[m]);
    }
  }
  for (int m = 0; m < M; ++m)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * N), f32_to_bf16(acc[m]));
}


// M rows of x by one tile of an 8-bit weight: 16 outputs a row, K inputs of 16 bytes each
// (output j's value at input k in byte j), then the tile's 16 row scales in bfloat16
template <int M>
void tile8(const float* x, const float*, const int8_t* w, int64_t K, uint16_t* out, int64_t N) {
  __m512 even[M], odd[M];
  for (int m = 0; m < M; ++m) even[m] = odd[m] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 2) {
    if (k % 4 == 0) prefetch(w + k * TILE);
    __m512 a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(w + k * TILE)));
    __m512 b = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(load16(w + (k + 1) * TILE)));
    for (int m = 0; m < M; ++m) {
      even[m] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * K + k]), a, even[m]);
      odd[m] = _mm512_fmadd_ps(_mm512_set1_ps(x[m * K + k + 1]), b, odd[m]);
    }
  }
  __m512 scale = bf16_to_f32(reinterpret_cast<const uint16_t*>(w + K * TILE));
  for (int m = 0; m < M; ++m)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * N),
                        f32_to_bf16(_mm512_mul_ps(_mm512_add_ps(even[m], odd[m]), scale)));
}


// AMX (Intel's tile unit; `use_amx`), from AMX_FROM rows: a block's 4-bit values as bfloat16
// (0..15, exact) in the tile layout, x . q for up to 16 rows in one tile product, the scale and
// zero applied in float32 as in tile4 (the same arithmetic but for the order of a block's sum).
// The values' conversion is per weight, not per row: a verify's or a batch's rows cost little
// more than one.
bool use_amx = false;
// from this many rows AMX is faster than tile4 (SmolLM2's 30 layers, streamed, 2 threads, ms,
// AMX / tile4: 1 row 3.0-3.3 / 2.5-2.7, 2 rows 3.4-3.6 / 3.4-3.6, 3 rows 3.45-3.55 / 4.2-4.5,
// 5 rows 3.7-3.9 / 5.6-6.3, 9 rows 4.75-5.0 / 11.6)
constexpr int64_t AMX_FROM = 3;

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// one block's 4-bit values (`q`) in B's layout (a row a pair of inputs, output j's two values
// side by side) as the bfloat16 numbers 128 + q: 0x4300 (128.0) with q in the mantissa's low bits,
// exact, two bit operations a chunk's row (`amx_scale` takes the 128 off with the zero's term)
__attribute__((target("amx-tile,amx-bf16"))) inline void amx_values(const uint8_t* q,
                                                                     uint16_t (*values)[2 * TILE]) {
  const __m512i low = _mm512_set1_epi16(0x000F), base = _mm512_set1_epi16(0x4300);
#pragma GCC unroll 4
  for (int c = 0; c < CHUNKS; ++c) {
    __m512i v = _mm512_cvtepu8_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + c * CHUNK_BYTES)));
    // (v & low) | base: inputs 2c, 2c + 1 to B's row c; the high nibbles' to row c + 8
    _mm512_store_si512(values[c], _mm512_ternarylogic_epi32(v, low, base, 0xEA));
    _mm512_store_si512(values[c + CHUNKS],
                       _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), low, base, 0xEA));
  }
}

// the block's scale and zero applied to its tile product `dots` (M x 16), into acc
template <int M>
inline void amx_scale(const uint8_t* q, const float (*dots)[TILE], const float* sums,
                      int64_t blocks, int64_t g, __m512* acc) {
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(q + VALUE_BYTES);
  __m512 scale = bf16_to_f32(scales), zero = bf16_to_f32(scales + TILE);
  // x . q = x . (128 + q) - 128 sum(x)
  __m512 offset = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f + 128.0f), scale, zero);
  for (int m = 0; m < M; ++m) {
    acc[m] = _mm512_fmadd_ps(scale, _mm512_load_ps(dots[m]), acc[m]);
    acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(sums[m * blocks + g]), offset, acc[m]);
  }
}

// M rows of x (bfloat16, row stride K) by one tile, two blocks at a time on two sets of tile
// registers (0-2, 3-5: product, x, values; tile registers are not renamed), software-pipelined:
// the next block's values are made while this one's tile product runs, and a block's product
// is scaled LAG blocks after it was stored, so that neither the vector work nor the tile unit
// waits on the other (in sequence they cost their sum: SmolLM2's layers, 3 rows, 4.6 ms where
// the values alone take 2.1 and the tile work 2.5)
constexpr int64_t LAG = 2;
template <int M>
__attribute__((target("amx-tile,amx-bf16"))) void tile4_amx(
    const uint16_t* x16, const float* sums, const uint8_t* w, int64_t K, uint16_t* out,
    int64_t N) {
  const int64_t blocks = K / GROUP;
  alignas(64) uint16_t values[2][GROUP / 2][2 * TILE];
  alignas(64) float dots[2 * LAG][M][TILE];
  __m512 acc[M];
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  auto scale = [&](int64_t b) {
    amx_scale<M>(w + b * BLOCK_BYTES, dots[b % (2 * LAG)], sums, blocks, b, acc);
  };
  amx_values(w, values[0]);
  for (int64_t g = 0; g < blocks; g += 2) {
    const uint8_t* q = w + g * BLOCK_BYTES;
    const bool pair = g + 1 < blocks;
    for (int64_t line = 0; line < 2 * BLOCK_BYTES; line += 64) prefetch(q + line);
    if (pair) amx_values(q + BLOCK_BYTES, values[1]);
    _tile_zero(0);
    _tile_loadd(1, x16 + g * GROUP, K * 2);
    _tile_loadd(2, values[0], 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, dots[g % (2 * LAG)], 64);
    if (g >= LAG) scale(g - LAG);
    if (pair) {
      if (g + 2 < blocks) amx_values(q + 2 * BLOCK_BYTES, values[0]);
      _tile_zero(3);
      _tile_loadd(4, x16 + (g + 1) * GROUP, K * 2);
      _tile_loadd(5, values[1], 64);
      _tile_dpbf16ps(3, 4, 5);
      _tile_stored(3, dots[(g + 1) % (2 * LAG)], 64);
      if (g + 1 >= LAG) scale(g + 1 - LAG);
    }
  }
  for (int64_t b = std::max<int64_t>(0, blocks - LAG); b < blocks; ++b) scale(b);
  for (int m = 0; m < M; ++m)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + m * N), f32_to_bf16(acc[m]));
}

using TileAmx = void (*)(const uint16_t*, const float*, const uint8_t*, int64_t, uint16_t*,
                        int64_t);
constexpr int AMX_ROWS = 16;
constexpr TileAmx TILES_AMX[AMX_ROWS] = {
    tile4_amx<1>, tile4_amx<2>, tile4_amx<3>, tile4_amx<4>, tile4_amx<5>, tile4_amx<6>,
    tile4_amx<7>, tile4_amx<8>, tile4_amx<9>, tile4_amx<10>, tile4_amx<11>, tile4_amx<12>,
    tile4_amx<13>, tile4_amx<14>, tile4_amx<15>, tile4_amx<16>};

__attribute__((target("amx-tile,amx-bf16"))) void amx_config(int rows) {
  TileConfig config;
  for (int t = 0; t < 6; ++t) config.colsb[t] = 64;
  config.rows[0] = config.rows[1] = config.rows[3] = config.rows[4] = rows;
  config.rows[2] = config.rows[5] = GROUP / 2;
  // ldtilecfg reads all 64 bytes; without this barrier gcc 12 dropped the stores above
  asm volatile("" : : "r"(&config) : "memory");
  _tile_loadconfig(&config);
}

__attribute__((target("amx-tile"))) void amx_release() { _tile_release(); }

// From WIDE_FROM rows (up to WIDE_ROWS a pass): each block's values dequantized to bfloat16
// once, its scale and zero folded in ((q - 8) scale + zero in float32, rounded to nearest even:
// the values products.py's oneDNN path reads, but for the scales' bfloat16), so the tile
// products accumulate over every block and are stored once a tile — no per-block store and
// scale for every 16 rows, which made two passes of 16 cost 1.5x one
constexpr int64_t WIDE_ROWS = 64;
// from this many rows the wide kernel is as fast (SmolLM2's 30 layers, streamed, 2 threads, ms,
// wide / tile4_amx: 12 rows 5.5-5.6 / 5.2, 13 5.6 / 5.25, 14 5.8 / 5.5, 16 5.8 / 5.8; 24 5.5, 32
// 6.8, 64 9.6, where two passes of tile4_amx took 12.8 at 17 and oneDNN in bfloat16 13.1 at
// 16, 17.0 at 64)
constexpr int64_t WIDE_FROM = 16;
// and for an 8-bit weight (its values exact in bfloat16; SmolLM2's head streamed, 2 threads, ms,
// wide / tile8: 2 rows 0.90 / 0.76, 4 0.95-0.99 / 1.05, 8 1.17-1.21 / 1.80; 16 1.4-1.5, 64 2.3-2.5,
// where oneDNN in bfloat16 took 2.8 at 16)
constexpr int64_t WIDE8_FROM = 4;

__attribute__((target("avx512bf16"))) inline void amx_dequant(const uint8_t* q,
                                                             uint16_t (*values)[2 * TILE]) {
  const uint16_t* scales = reinterpret_cast<const uint16_t*>(q + VALUE_BYTES);
  const __m512 scale = bf16_to_f32(scales), zero = bf16_to_f32(scales + TILE);
  const __m512 offset = _mm512_fnmadd_ps(_mm512_set1_ps(8.0f), scale, zero);
  // a chunk's bytes 0-15 are outputs 0-7's (two bytes an output), 16-31 outputs 8-15's
  const __m512i first = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(8));
  const __m512 scale0 = _mm512_permutexvar_ps(first, scale);
  const __m512 scale1 = _mm512_permutexvar_ps(second, scale);
  const __m512 offset0 = _mm512_permutexvar_ps(first, offset);
  const __m512 offset1 = _mm512_permutexvar_ps(second, offset);
  const __m512i nibble = _mm512_set1_epi32(0xF);
#pragma GCC unroll 2
  for (int c = 0; c < CHUNKS; ++c) {
    const uint8_t* chunk = q + c * CHUNK_BYTES;
    __m512i v0 = _mm512_cvtepu8_epi32(load16(chunk)), v1 = _mm512_cvtepu8_epi32(load16(chunk + 16));
    // words 0-15 from the chunk's first 16 bytes, 16-31 from the rest: B's row as it lies
    __m512 lo0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v0, nibble)), scale0, offset0);
    __m512 lo1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(v1, nibble)), scale1, offset1);
    _mm512_store_si512(values[c], (__m512i)_mm512_cvtne2ps_pbh(lo1, lo0));
    __m512 hi0 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v0, 4)), scale0, offset0);
    __m512 hi1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v1, 4)), scale1, offset1);
    _mm512_store_si512(values[c + CHUNKS], (__m512i)_mm512_cvtne2ps_pbh(hi1, hi0));
  }
}

// one block of 32 inputs of an 8-bit tile (16 bytes an input) as bfloat16 in B's layout, exact
// (|value| <= 127); the row scales are applied to the sum, as tile8 does
__attribute__((target("avx512bf16"))) inline void amx_int8_values(const int8_t* w,
                                                                 uint16_t (*values)[2 * TILE]) {
#pragma GCC unroll 4
  for (int p = 0; p < GROUP / 2; ++p) {
    __m128i a = load16(w + 2 * p * TILE), b = load16(w + (2 * p + 1) * TILE);
    __m512 even = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpacklo_epi8(a, b)));
    __m512 odd = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_unpackhi_epi8(a, b)));
    _mm512_store_si512(values[p], (__m512i)_mm512_cvtne2ps_pbh(odd, even));
  }
}

// one chunk of 16 rows (the last: `last` rows, tile 7) of x against the block's values (tile 4)
// into product tile c; tile numbers are literals to the intrinsics, hence the macro
#define WIDE_CHUNK(c)                                                  \
  if (C > c) {                                                         \
    const uint16_t* xc = x16 + c * AMX_ROWS * K + g * GROUP;           \
    if (c == C - 1) {                                                  \
      _tile_loadd(7, xc, K * 2);                                       \
      _tile_dpbf16ps(c, 7, 4);                                         \
    } else if (c % 2 == 0) {                                           \
      _tile_loadd(5, xc, K * 2);                                       \
      _tile_dpbf16ps(c, 5, 4);                                         \
    } else {                                                           \
      _tile_loadd(6, xc, K * 2);                                       \
      _tile_dpbf16ps(c, 6, 4);                                         \
    }                                                                  \
  }
#define WIDE_STORE(c) \
  if (C > c) _tile_stored(c, dots[c], 64);

// C chunks of rows of x (bfloat16, row stride K; the last chunk `last` rows) by one tile of a
// `Bits`-bit weight
template <int C, int Bits>
__attribute__((target("amx-tile,amx-bf16,avx512bf16"))) void tile_wide(
    const uint16_t* x16, const uint8_t* w, int64_t K, int64_t last, uint16_t* out, int64_t N) {
  constexpr int64_t block_bytes = Bits == 4 ? BLOCK_BYTES : GROUP * TILE;
  const int64_t blocks = K / GROUP;
  alignas(64) uint16_t values[2][GROUP / 2][2 * TILE];
  alignas(64) float dots[C][AMX_ROWS][TILE];
  _tile_zero(0);
  if (C > 1) _tile_zero(1);
  if (C > 2) _tile_zero(2);
  if (C > 3) _tile_zero(3);
  for (int64_t g = 0; g < blocks; ++g) {
    const uint8_t* q = w + g * block_bytes;
    for (int64_t line = 0; line < block_bytes; line += 64) prefetch(q + line);
    if constexpr (Bits == 4)
      amx_dequant(q, values[g & 1]);
    else
      amx_int8_values(reinterpret_cast<const int8_t*>(q), values[g & 1]);
    _tile_loadd(4, values[g & 1], 64);
    WIDE_CHUNK(0)
    WIDE_CHUNK(1)
    WIDE_CHUNK(2)
    WIDE_CHUNK(3)
  }
  WIDE_STORE(0)
  WIDE_STORE(1)
  WIDE_STORE(2)
  WIDE_STORE(3)
  // an 8-bit weight's row scales after its values
  const __m512 scale = Bits == 4 ? _mm512_set1_ps(1.0f)
                                 : bf16_to_f32(reinterpret_cast<const uint16_t*>(w + K * TILE));
  for (int c = 0; c < C; ++c)
    for (int64_t m = 0; m < (c == C - 1 ? last : AMX_ROWS); ++m)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + (c * AMX_ROWS + m) * N),
                          f32_to_bf16(_mm512_mul_ps(_mm512_load_ps(dots[c][m]), scale)));
}
#undef WIDE_CHUNK
#undef WIDE_STORE

using TileWide = void (*)(const uint16_t*, const uint8_t*, int64_t, int64_t, uint16_t*, int64_t);
constexpr TileWide TILES4_WIDE[WIDE_ROWS / AMX_ROWS] = {tile_wide<1, 4>, tile_wide<2, 4>,
                                                       tile_wide<3, 4>, tile_wide<4, 4>};
constexpr TileWide TILES8_WIDE[WIDE_ROWS / AMX_ROWS] = {tile_wide<1, 8>, tile_wide<2, 8>,
                                                       tile_wide<3, 8>, tile_wide<4, 8>};

__attribute__((target("amx-tile,amx-bf16"))) void wide_config(int chunks, int last) {
  TileConfig config;
  for (int t = 4; t < 8; ++t) config.colsb[t] = 64;
  for (int c = 0; c < chunks; ++c) {  // a tile not used: rows and colsb 0, or ldtilecfg faults
    config.colsb[c] = 64;
    config.rows[c] = c == chunks - 1 ? last : AMX_ROWS;
  }
  config.rows[4] = GROUP / 2;
  config.rows[5] = config.rows[6] = AMX_ROWS;
  config.rows[7] = last;
  asm volatile("" : : "r"(&config) : "memory");  // as amx_config's
  _tile_loadconfig(&config);
}

at::Tensor mm_wide(const at::Tensor& x16, const at::Tensor& tiles, int64_t M, int64_t K,
                   int64_t N, at::Tensor out, const TileWide* table) {
  const uint16_t* xs = reinterpret_cast<const uint16_t*>(x16.data_ptr());
  const uint8_t* w = static_cast<const uint8_t*>(tiles.data_ptr());
  const int64_t stride = tiles.size(1);
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, N / TILE, 4, [&](int64_t begin, int64_t end) {
    for (int64_t m0 = 0; m0 < M; m0 += WIDE_ROWS) {
      const int64_t rows = std::min<int64_t>(WIDE_ROWS, M - m0);
      const int64_t chunks = (rows + AMX_ROWS - 1) / AMX_ROWS;
      const int64_t last = rows - (chunks - 1) * AMX_ROWS;
      wide_config(chunks, last);
      for (int64_t t = begin; t < end; ++t)
        table[chunks - 1](xs + m0 * K, w + t * stride, K, last, o + m0 * N + t * TILE, N);
    }
    amx_release();
  });
  return out;
}

at::Tensor int4_mm_amx(const at::Tensor& x16, const std::vector<float>& sums,
                       const at::Tensor& tiles, int64_t M, int64_t K, int64_t N, at::Tensor out) {
  const uint16_t* xs = reinterpret_cast<const uint16_t*>(x16.data_ptr());
  const uint8_t* w = tiles.data_ptr<uint8_t>();
  const int64_t stride = tiles.size(1), blocks = K / GROUP;
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, N / TILE, 4, [&](int64_t begin, int64_t end) {
    for (int64_t m0 = 0; m0 < M; m0 += AMX_ROWS) {
      const int64_t rows = std::min<int64_t>(AMX_ROWS, M - m0);
      amx_config(rows);
      for (int64_t t = begin; t < end; ++t)
        TILES_AMX[rows - 1](xs + m0 * K, sums.data() + m0 * blocks, w + t * stride, K,
                            o + m0 * N + t * TILE, N);
    }
    amx_release();
  });
  return out;
}

template <typename T>
using Tile = void (*)(const float*, const float*, const T*, int64_t, uint16_t*, int64_t);
// x by a weight in tiles (`tile`: ROWS rows a call, one per row count), the tiles split between
// the threads; `value` the tiles' dtype, `tile_bytes` a tile's bytes at K inputs
template <typename T>
at::Tensor product(const char* op, const at::Tensor& x_in, const at::Tensor& tiles, int64_t n,
                   at::ScalarType value, int64_t (*tile_bytes)(int64_t), const Tile<T>* tile,
                   bool sums_needed) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kBFloat16 && x_in.device().is_cpu(),
              op, ": x must be (M, K) bfloat16 on the CPU");
  TORCH_CHECK(tiles.scalar_type() == value && tiles.is_contiguous() && tiles.dim() == 2, op,
              ": the weight must be quantized.py's contiguous ", at::toString(value), " tiles");
  const int64_t M = x_in.size(0), K = x_in.size(1), N = n;
  TORCH_CHECK(K % GROUP == 0 && N % TILE == 0 && tiles.size(0) == N / TILE &&
                  tiles.size(1) == tile_bytes(K),
              op, ": a weight of ", tiles.size(0), " x ", tiles.size(1),
              " bytes is not one of (", N, ", ", K, ")");
  at::Tensor x16 = x_in.contiguous();
  at::Tensor out = at::empty({M, N}, x_in.options());
  if (M == 0) return out;
  // the wide path reads x as it is (bfloat16): nothing below is its
  if (use_amx && M >= (sums_needed ? WIDE_FROM : WIDE8_FROM))
    return mm_wide(x16, tiles, M, K, N, out, sums_needed ? TILES4_WIDE : TILES8_WIDE);
  // x's sum over each block of GROUP inputs (a 4-bit weight's zeros' term), in float32
  const int64_t blocks = K / GROUP;
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(x16.data_ptr());
  std::vector<float> sums(sums_needed ? M * blocks : 0);
  for (int64_t i = 0; i < int64_t(sums.size()); ++i) {  // row i / blocks, block i % blocks
    float s = 0;
    for (int64_t k = 0; k < GROUP; ++k) s += bf16_at(bits, i * GROUP + k);
    sums[i] = s;
  }
  if (sums_needed && use_amx && M >= AMX_FROM) return int4_mm_amx(x16, sums, tiles, M, K, N, out);
  // the AVX-512 path reads x in float32 (the AMX one as it is)
  std::vector<float> x(M * K);
  for (int64_t i = 0; i < M * K; ++i) x[i] = bf16_at(bits, i);
  const T* w = static_cast<const T*>(tiles.data_ptr());
  const int64_t stride = tiles.size(1);
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, N / TILE, 4, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t m0 = 0; m0 < M; m0 += ROWS)  // over ROWS rows: the tile read again
        tile[std::min(ROWS, M - m0) - 1](x.data() + m0 * K,
                                         sums_needed ? sums.data() + m0 * blocks : nullptr,
                                         w + t * stride, K, o + m0 * N + t * TILE, N);
  });
  return out;
}

constexpr Tile<uint8_t> TILES4[ROWS] = {tile4<1>, tile4<2>, tile4<3>, tile4<4>,
                                        tile4<5>, tile4<6>, tile4<7>, tile4<8>};
constexpr Tile<int8_t> TILES8[ROWS] = {tile8<1>, tile8<2>, tile8<3>, tile8<4>,
                                       tile8<5>, tile8<6>, tile8<7>, tile8<8>};

int64_t bytes4(int64_t K) { return K / GROUP * BLOCK_BYTES; }
int64_t bytes8(int64_t K) { return K * TILE + 2 * TILE; }

at::Tensor int4_mm(const at::Tensor& x, const at::Tensor& tiles, int64_t n) {
  return product<uint8_t>("autospec::int4_mm", x, tiles, n, at::kByte, bytes4, TILES4, true);
}

at::Tensor int8_mm(const at::Tensor& x, const at::Tensor& tiles, int64_t n) {
  return product<int8_t>("autospec::int8_mm", x, tiles, n, at::kChar, bytes8, TILES8, false);
}

// One row's argmax over v bfloat16 values: the first maximal value's index, a NaN counted the
// largest (its first), as torch's argmax. Two passes over the row, which the head's product has
// just written (in cache): the maximum, then its first index.
int64_t row_argmax16(const uint16_t* x, int64_t v) {
  const int64_t body = v / 16 * 16;
  __m512 best = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  for (int64_t i = 0; i < body; i += 16) {
    __m512 f = bf16_to_f32(x + i);
    nan |= _mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q);
    best = _mm512_max_ps(best, f);
  }
  auto at = [x](int64_t i) { return bf16_at(x, i); };
  float top = body ? _mm512_reduce_max_ps(best) : -INFINITY;
  bool any_nan = nan != 0;
  for (int64_t i = body; i < v; ++i) {
    float f = at(i);
    any_nan |= f != f;
    top = f > top ? f : top;
  }
  if (any_nan) {
    for (int64_t i = 0; i < v; ++i)
      if (at(i) != at(i)) return i;
  }
  const __m512 wanted = _mm512_set1_ps(top);
  for (int64_t i = 0; i < body; i += 16) {
    __mmask16 hit = _mm512_cmp_ps_mask(bf16_to_f32(x + i), wanted, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  for (int64_t i = body; i < v; ++i)
    if (at(i) == top) return i;
  return 0;  // every value -inf: the first
}

// Each row's argmax of x (n, v) bfloat16: (n,) int64 (torch's argmax(-1), 4-20x sooner)
at::Tensor rows_argmax(const at::Tensor& x_in) {
  TORCH_CHECK(x_in.dim() == 2 && x_in.scalar_type() == at::kBFloat16,
              "autospec::rows_argmax takes (n, v) bfloat16");
  const at::Tensor x = x_in.contiguous();
  const int64_t n = x.size(0), v = x.size(1);
  at::Tensor out = at::empty({n}, x.options().dtype(at::kLong));
  const auto* base = reinterpret_cast<const uint16_t*>(x.data_ptr());
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, n, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = row_argmax16(base + r * v, v);
  });
  return out;
}

}  // namespace

// whether int4 products of AMX_FROM rows or more run on AMX (quantized.py, where the CPU has it
// and the process was granted the tile registers)
extern "C" void autospec_use_amx(int on) { use_amx = on != 0; }

// The ops as a library AOTInductor compiled calls them (compiled.py, quantized.py `C_SHIMS`):
// directly, not boxed through the dispatcher
#define C_SHIM(op)                                                                         \
  extern "C" AOTITorchError aoti_torch_cpu_##op(AtenTensorHandle x, AtenTensorHandle tiles, \
                                                int64_t n, AtenTensorHandle* out) {         \
    AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({                                            \
      *out = torch::aot_inductor::new_tensor_handle(                                        \
          op(*torch::aot_inductor::tensor_handle_to_tensor_pointer(x),                      \
             *torch::aot_inductor::tensor_handle_to_tensor_pointer(tiles), n));             \
    });                                                                                     \
  }
C_SHIM(int4_mm)
C_SHIM(int8_mm)

TORCH_LIBRARY(autospec, m) {
  m.def("int4_mm(Tensor x, Tensor tiles, int n) -> Tensor");
  m.def("int8_mm(Tensor x, Tensor tiles, int n) -> Tensor");
  m.def("rows_argmax(Tensor x) -> Tensor");
}

TORCH_LIBRARY_IMPL(autospec, CPU, m) {
  m.impl("int4_mm", &int4_mm);
  m.impl("int8_mm", &int8_mm);
  m.impl("rows_argmax", &rows_argmax);
}
