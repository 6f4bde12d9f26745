// Attention of a batch's rows over their caches on AMX, for a decode or verify step:
//   autospec::rows_attention(q, k, v, seen, scale) -> out
//     q (n, H, T, D) bfloat16, contiguous: each row's T query positions;
//     k, v (n, H_kv, span, D) bfloat16, each position's D values contiguous (the cache's view);
//     seen (n, T) int32: query t of row i sees cache positions 0 .. seen[i, t] - 1 (a row's cache
//       is its own prefix and its causal part: models/kv.py);
//     out (n, T, H, D) bfloat16: softmax(q k^T * scale) v.
// models/attention.py calls it for D = 64 (a key/value head's queries 16 a pass), where torch's
// flash attention read the caches at 9-14 GB/s with the batch's mask.
//
// Per row and key/value head, its g x T queries together: the scores of 16 positions a tile
// product (K's rows as they lie against the queries' transpose), a softmax over positions with
// the queries in a register's lanes (no horizontal sums), the probabilities transposed 16 x 16
// in registers into bfloat16 rows, and their product with V (two positions' rows interleaved
// into the tile layout) into the output, four tiles of 16 dimensions. float32 throughout but
// the products' inputs, which are bfloat16 as torch's kernel's are.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

namespace {

// head dims; queries (or positions) a tile's rows or lanes; bfloat16 values a tile row holds
constexpr int64_t D = 64, LANES = 16, PAIRS = 32;

struct alignas(64) Config {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

__attribute__((target("amx-tile"))) inline void configure(const Config& config) {
  asm volatile("" : : "r"(&config) : "memory");  // ldtilecfg reads all 64 bytes
  _tile_loadconfig(&config);
}

// e^x for x <= 0 (a score less the maximum): 2^(x log2 e) as 2^n times a degree-7 polynomial of
// the fraction (relative error ~1e-7)
inline __m512 exp512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p = _mm512_set1_ps(1.525273380405984e-05f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.5403530393381606e-04f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558146428443e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618129107628477e-03f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550410866482158e-02f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.402265069591007e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.931471805599453e-01f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// 16 bfloat16 as float32
inline __m512 widen(const uint16_t* p) {
  __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
}

// rows[0..15] (16 floats each) transposed in place: rows[j][i] = old rows[i][j]
inline void transpose16(__m512* r) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 16; i += 8)
    for (int j = 0; j < 4; ++j) {
      t[i + j] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0x88);
      t[i + j + 4] = _mm512_shuffle_f32x4(r[i + j], r[i + j + 4], 0xDD);
    }
  for (int j = 0; j < 8; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    r[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
  }
}

// one row's key/value head: its nq queries (nq x D at q), its cache (span positions, row stride
// D) into out (query j at out + j's place: `place(j)`), seen[t] positions visible to query t
struct Work {
  std::vector<float> scores;  // (positions rounded up to 32) x 16: a position's, query in lanes
  alignas(64) uint32_t qt[D / PAIRS][LANES][LANES];  // the queries' transpose in B's layout
  alignas(64) uint16_t p[LANES][PAIRS];  // 32 positions' probabilities, a query a row (A)
  alignas(64) uint32_t vt[D / LANES][LANES][LANES];  // 32 positions of V in B's layout, 4 tiles
  alignas(64) float o[D / LANES][LANES][LANES];  // the output tiles
};

__attribute__((target("amx-tile,amx-bf16,avx512bf16"))) void attend(
    Work& w, const uint16_t* q, int64_t nq, const uint16_t* k, const uint16_t* v, int64_t span,
    const int32_t* visible, float scale, uint16_t* out, int64_t out_stride_query) {
  const int64_t padded = (span + PAIRS - 1) / PAIRS * PAIRS;
  if (int64_t(w.scores.size()) < padded * LANES) w.scores.resize(padded * LANES);
  float* s = w.scores.data();
  // the queries' transpose: row r of chunk c holds, per query j, dims 32c + 2r and 2r + 1
  std::memset(w.qt, 0, sizeof(w.qt));
  for (int64_t j = 0; j < nq; ++j)
    for (int64_t c = 0; c < D / PAIRS; ++c)
      for (int64_t r = 0; r < LANES; ++r)
        std::memcpy(&w.qt[c][r][j], q + j * D + c * PAIRS + 2 * r, 4);
  // scores, 16 positions a tile product: tile 0 (16 positions x nq), 1 (K), 2 (the queries)
  Config scores;
  scores.rows[0] = scores.rows[1] = scores.rows[2] = LANES;
  scores.colsb[0] = scores.colsb[2] = nq * 4;
  scores.colsb[1] = 64;
  configure(scores);
  const int64_t full = span / LANES * LANES;
  for (int64_t p0 = 0; p0 < full; p0 += LANES) {
    _tile_zero(0);
    _tile_loadd(1, k + p0 * D, D * 2);
    _tile_loadd(2, w.qt[0], 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_loadd(1, k + p0 * D + PAIRS, D * 2);
    _tile_loadd(2, w.qt[1], 64);
    _tile_dpbf16ps(0, 1, 2);
    _tile_stored(0, s + p0 * LANES, 64);
  }
  for (int64_t p = full; p < span; ++p) {  // the last few positions one by one
    __m512 kv[D / LANES];
    for (int64_t c = 0; c < D / LANES; ++c) kv[c] = widen(k + p * D + c * LANES);
    for (int64_t j = 0; j < nq; ++j) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t c = 0; c < D / LANES; ++c)
        acc = _mm512_fmadd_ps(widen(q + j * D + c * LANES), kv[c], acc);
      s[p * LANES + j] = _mm512_reduce_add_ps(acc);
    }
  }
  // softmax over positions, the queries in lanes: a position a query does not see, and the
  // padding to 32, weigh 0
  alignas(64) int32_t seen_lanes[LANES];
  for (int64_t j = 0; j < LANES; ++j) seen_lanes[j] = j < nq ? visible[j] : 0;
  const __m512i seen = _mm512_load_si512(seen_lanes);
  const __m512 sc = _mm512_set1_ps(scale);
  __m512 top = _mm512_set1_ps(-INFINITY);
  for (int64_t p = 0; p < span; ++p) {
    __mmask16 on = _mm512_cmpgt_epi32_mask(seen, _mm512_set1_epi32(int32_t(p)));
    top = _mm512_mask_max_ps(top, on, top, _mm512_mul_ps(_mm512_loadu_ps(s + p * LANES), sc));
  }
  __m512 sum = _mm512_setzero_ps();
  for (int64_t p = 0; p < padded; ++p) {
    __mmask16 on = _mm512_cmpgt_epi32_mask(seen, _mm512_set1_epi32(int32_t(p)));
    __m512 e = _mm512_setzero_ps();
    if (p < span) e = exp512(_mm512_fmsub_ps(_mm512_loadu_ps(s + p * LANES), sc, top));
    e = _mm512_maskz_mov_ps(on, e);
    sum = _mm512_add_ps(sum, e);
    _mm512_storeu_ps(s + p * LANES, e);
  }
  // the output: per 32 positions, their probabilities (tile 4: nq x 32) by V (tiles 5-7 in
  // turn, 32 positions x 16 dims) into tiles 0-3 (nq x 16 dims each)
  Config values;
  for (int t = 0; t < 4; ++t) values.rows[t] = nq, values.colsb[t] = 64;
  values.rows[4] = nq, values.colsb[4] = 64;
  for (int t = 5; t < 8; ++t) values.rows[t] = LANES, values.colsb[t] = 64;
  configure(values);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  // dwords of unpack{lo,hi}_epi16(row 2r, row 2r + 1) over 32 dims hold dims
  // [0-3, 8-11, 16-19, 24-27] and [4-7, 12-15, 20-23, 28-31]: back to 0-15 and 16-31
  const __m512i first = _mm512_set_epi32(23, 22, 21, 20, 7, 6, 5, 4, 19, 18, 17, 16, 3, 2, 1, 0);
  const __m512i second =
      _mm512_set_epi32(31, 30, 29, 28, 15, 14, 13, 12, 27, 26, 25, 24, 11, 10, 9, 8);
  for (int64_t p0 = 0; p0 < padded; p0 += PAIRS) {
    __m512 lo[LANES], hi[LANES];
    for (int i = 0; i < LANES; ++i) {
      lo[i] = _mm512_loadu_ps(s + (p0 + i) * LANES);
      hi[i] = _mm512_loadu_ps(s + (p0 + LANES + i) * LANES);
    }
    transpose16(lo);
    transpose16(hi);
    for (int64_t j = 0; j < nq; ++j)
      _mm512_store_si512(w.p[j], (__m512i)_mm512_cvtne2ps_pbh(hi[j], lo[j]));
    for (int64_t r = 0; r < LANES; ++r) {
      const int64_t a = p0 + 2 * r, b = a + 1;
      for (int64_t half = 0; half < D / PAIRS; ++half) {
        const __m512i zero = _mm512_setzero_si512();
        __m512i x = a < span ? _mm512_loadu_si512(v + a * D + half * PAIRS) : zero;
        __m512i y = b < span ? _mm512_loadu_si512(v + b * D + half * PAIRS) : zero;
        __m512i l = _mm512_unpacklo_epi16(x, y), h = _mm512_unpackhi_epi16(x, y);
        _mm512_store_si512(w.vt[2 * half][r], _mm512_permutex2var_epi32(l, first, h));
        _mm512_store_si512(w.vt[2 * half + 1][r], _mm512_permutex2var_epi32(l, second, h));
      }
    }
    _tile_loadd(4, w.p, 64);
    _tile_loadd(5, w.vt[0], 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_loadd(6, w.vt[1], 64);
    _tile_dpbf16ps(1, 4, 6);
    _tile_loadd(7, w.vt[2], 64);
    _tile_dpbf16ps(2, 4, 7);
    _tile_loadd(5, w.vt[3], 64);
    _tile_dpbf16ps(3, 4, 5);
  }
  _tile_stored(0, w.o[0], 64);
  _tile_stored(1, w.o[1], 64);
  _tile_stored(2, w.o[2], 64);
  _tile_stored(3, w.o[3], 64);
  alignas(64) float totals[LANES];
  _mm512_store_ps(totals, sum);
  for (int64_t j = 0; j < nq; ++j) {
    const __m512 inverse = _mm512_set1_ps(totals[j] > 0.0f ? 1.0f / totals[j] : 0.0f);
    for (int64_t c = 0; c < D / LANES; ++c) {
      __m512i b = _mm512_castps_si512(_mm512_mul_ps(_mm512_load_ps(w.o[c][j]), inverse));
      // round to nearest even, as torch's .to(bfloat16)
      __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
      b = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j * out_stride_query + c * LANES),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(b, 16)));
    }
  }
}

__attribute__((target("amx-tile"))) void release() { _tile_release(); }

at::Tensor rows_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& seen, double scale) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && seen.dim() == 2,
              "autospec::rows_attention: q, k, v 4-D, seen 2-D");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && k.scalar_type() == at::kBFloat16 &&
                  v.scalar_type() == at::kBFloat16 && seen.scalar_type() == at::kInt,
              "autospec::rows_attention: q, k, v bfloat16, seen int32");
  const int64_t n = q.size(0), heads = q.size(1), T = q.size(2), kv_heads = k.size(1),
                span = k.size(2);
  TORCH_CHECK(q.size(3) == D && k.size(3) == D && v.size(3) == D && q.is_contiguous() &&
                  seen.is_contiguous() && k.stride(3) == 1 && v.stride(3) == 1 &&
                  k.stride(2) == D && v.stride(2) == D && k.sizes() == v.sizes() &&
                  k.size(0) == n && heads % kv_heads == 0 && seen.size(0) == n &&
                  seen.size(1) == T,
              "autospec::rows_attention: shapes q (n, H, T, 64), k and v (n, H_kv, span, 64) with "
              "rows of 64 contiguous, seen (n, T)");
  const int64_t group = heads / kv_heads, nq = group * T;
  at::Tensor out = at::empty({n, T, heads, D}, q.options());
  const uint16_t* qs = reinterpret_cast<const uint16_t*>(q.data_ptr());
  const uint16_t* ks = reinterpret_cast<const uint16_t*>(k.data_ptr());
  const uint16_t* vs = reinterpret_cast<const uint16_t*>(v.data_ptr());
  const int32_t* seen_ = seen.data_ptr<int32_t>();
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
    Work work;
    std::vector<int32_t> visible(nq);
    std::vector<uint16_t> result(nq * D);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / kv_heads, h = item % kv_heads;
      for (int64_t j = 0; j < nq; ++j)
        visible[j] = std::min<int64_t>(seen_[i * T + j % T], span);
      // 16 queries a pass (a tile's lanes): the row's K and V come from memory for the first
      // and from the cache for the others
      for (int64_t j0 = 0; j0 < nq; j0 += LANES)
        attend(work, qs + ((i * heads + h * group) * T + j0) * D, std::min(LANES, nq - j0),
               ks + i * k.stride(0) + h * k.stride(1), vs + i * v.stride(0) + h * v.stride(1),
               span, visible.data() + j0, float(scale), result.data() + j0 * D, D);
      // query j is head h * group + j / T at position j % T: out (n, T, H, D)
      for (int64_t j = 0; j < nq; ++j)
        std::memcpy(o + ((i * T + j % T) * heads + h * group + j / T) * D, result.data() + j * D,
                    D * 2);
    }
    release();
  });
  return out;
}

}  // namespace

// the op as a library AOTInductor compiled calls it (models/compiled.py's one-row forward,
// quantized.py `C_SHIMS`): directly, not boxed through the dispatcher
extern "C" AOTITorchError aoti_torch_cpu_rows_attention(AtenTensorHandle q, AtenTensorHandle k,
                                                        AtenTensorHandle v, AtenTensorHandle seen,
                                                        double scale, AtenTensorHandle* out) {
  using torch::aot_inductor::tensor_handle_to_tensor_pointer;
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    *out = torch::aot_inductor::new_tensor_handle(rows_attention(
        *tensor_handle_to_tensor_pointer(q), *tensor_handle_to_tensor_pointer(k),
        *tensor_handle_to_tensor_pointer(v), *tensor_handle_to_tensor_pointer(seen), scale));
  });
}

TORCH_LIBRARY_FRAGMENT(autospec, m) {
  m.def("rows_attention(Tensor q, Tensor k, Tensor v, Tensor seen, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(autospec, CPU, m) { m.impl("rows_attention", &rows_attention); }
