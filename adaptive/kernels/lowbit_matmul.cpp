// x @ W.T for bf16 activations x [M, K] and int4 weights in groups of 32 (Q4_1's grid: w = (q - 8) * step + offset),
// with AVX512-BF16 dot products: adaptive.lowbit_kernels builds it and says why it exists.
//
// Weights are packed per tile of 16 output columns and group of 32 inputs as 256 bytes: chunk p (0..7) of 32 bytes,
// byte b holds column b / 2 at input 2p + b % 2 in its low nibble and the same column at input 16 + 2p + b % 2 in
// its high nibble. Widened to 16 bits and or-ed with 0x4300, a nibble q becomes the bf16 number 128 + q, so one
// vdpbf16ps multiplies 16 columns by 2 inputs; per group, sum_k x_k w_k = step * sum_k x_k (128 + q_k)
// + (offset - 136 * step) * sum_k x_k. Every row is computed alone, in the same order, whatever the number of rows.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

constexpr int64_t TILE = 16, GROUP = 32, NIBBLE_BYTES = 256, TILE_BYTES = 320, ROWS = 8, AHEAD = 8;

template <int MB>
void tile_rows(const uint16_t* x, int64_t K, const float* sums, int64_t groups, const uint8_t* w, uint16_t* y, int64_t N) {
  __m512 out[MB];
  for (int r = 0; r < MB; ++r) out[r] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi16(0x000F), base = _mm512_set1_epi16(0x4300);
  for (int64_t g = 0; g < groups; ++g) {
    __m512 acc[MB];
    for (int r = 0; r < MB; ++r) acc[r] = _mm512_setzero_ps();
    const uint8_t* wg = w + g * TILE_BYTES;
    for (int line = 0; line < 5; ++line) _mm_prefetch(reinterpret_cast<const char*>(wg + AHEAD * TILE_BYTES + 64 * line), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int p = 0; p < 8; ++p) {
      __m512i wide = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + 32 * p)));
      __m512i low = _mm512_ternarylogic_epi32(wide, nibble, base, 0xEA);  // (wide & nibble) | base
      __m512i high = _mm512_or_si512(_mm512_srli_epi16(wide, 4), base);
      for (int r = 0; r < MB; ++r) {
        const uint16_t* xg = x + r * K + g * GROUP;
        int32_t first, second;
        std::memcpy(&first, xg + 2 * p, 4);
        std::memcpy(&second, xg + 16 + 2 * p, 4);
        acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)low, (__m512bh)_mm512_set1_epi32(first));
        acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)high, (__m512bh)_mm512_set1_epi32(second));
      }
    }
    const __m512 s = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + NIBBLE_BYTES)));
    const __m512 o = _mm512_cvtpbh_ps((__m256bh)_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + NIBBLE_BYTES + 32)));
    const __m512 b = _mm512_fmadd_ps(s, _mm512_set1_ps(-136.0f), o);
    for (int r = 0; r < MB; ++r) out[r] = _mm512_fmadd_ps(b, _mm512_set1_ps(sums[r * groups + g]), _mm512_fmadd_ps(s, acc[r], out[r]));
  }
  for (int r = 0; r < MB; ++r) _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * N), (__m256i)_mm512_cvtneps_pbh(out[r]));
}

using Tile = void (*)(const uint16_t*, int64_t, const float*, int64_t, const uint8_t*, uint16_t*, int64_t);
constexpr Tile TILES[ROWS] = {tile_rows<1>, tile_rows<2>, tile_rows<3>, tile_rows<4>, tile_rows<5>, tile_rows<6>, tile_rows<7>, tile_rows<8>};

at::Tensor int4_matmul(const at::Tensor& x, const at::Tensor& packed) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2, "int4_matmul takes bf16 activations [M, K], got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.size(2) == TILE_BYTES && packed.is_contiguous(), "packed weights must be uint8 [N/16, K/32, 320]");
  const int64_t M = x.size(0), K = x.size(1), tiles = packed.size(0), groups = packed.size(1), N = tiles * TILE;
  TORCH_CHECK(groups * GROUP == K, "weights packed for ", groups * GROUP, " inputs, activations have ", K);
  const at::Tensor xc = x.contiguous();
  const uint16_t* xs = reinterpret_cast<const uint16_t*>(xc.data_ptr());
  std::vector<float> sums(M * groups);  // sum of each row's inputs per group, in float32
  for (int64_t i = 0; i < M * groups; ++i) {
    float total = 0.0f;
    for (int64_t k = 0; k < GROUP; ++k) {
      const uint32_t bits = static_cast<uint32_t>(xs[i * GROUP + k]) << 16;
      float value;
      std::memcpy(&value, &bits, 4);
      total += value;
    }
    sums[i] = total;
  }
  at::Tensor y = at::empty({M, N}, x.options());
  uint16_t* ys = reinterpret_cast<uint16_t*>(y.data_ptr());
  const uint8_t* w = packed.data_ptr<uint8_t>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t m = 0; m < M; m += ROWS)
        TILES[std::min(ROWS, M - m) - 1](xs + m * K, K, sums.data() + m * groups, groups, w + t * groups * TILE_BYTES, ys + m * N + t * TILE, N);
  });
  return y;
}

// int8 weights with one scale per output column (x @ W.T * scale): packed per tile of 16 columns and group of 32
// inputs as 512 bytes, chunk p (0..15) of 32 bytes holding, in byte b, column b / 2 at input 2p + b % 2 (widened to
// float and rounded to bf16 exactly, then one vdpbf16ps per chunk). The 16 scales of a tile follow its groups as
// float32. Rows computed alone, in the same order, as int4_matmul's.
constexpr int64_t INT8_GROUP_BYTES = 512;

template <int MB>
void tile_rows_int8(const uint16_t* x, int64_t K, int64_t groups, const int8_t* w, const float* scale, uint16_t* y, int64_t N) {
  __m512 acc[MB];
  for (int r = 0; r < MB; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const int8_t* wg = w + g * INT8_GROUP_BYTES;
    for (int line = 0; line < 8; ++line) _mm_prefetch(reinterpret_cast<const char*>(wg + AHEAD * INT8_GROUP_BYTES + 64 * line), _MM_HINT_T0);
#pragma GCC unroll 16
    for (int p = 0; p < 16; ++p) {
      const __m512 low = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + 32 * p))));
      const __m512 high = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wg + 32 * p + 16))));
      const __m512bh weights = _mm512_cvtne2ps_pbh(high, low);
      for (int r = 0; r < MB; ++r) {
        int32_t pair;
        std::memcpy(&pair, x + r * K + g * GROUP + 2 * p, 4);
        acc[r] = _mm512_dpbf16_ps(acc[r], weights, (__m512bh)_mm512_set1_epi32(pair));
      }
    }
  }
  const __m512 s = _mm512_loadu_ps(scale);
  for (int r = 0; r < MB; ++r) _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + r * N), (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(acc[r], s)));
}

using TileInt8 = void (*)(const uint16_t*, int64_t, int64_t, const int8_t*, const float*, uint16_t*, int64_t);
constexpr TileInt8 TILES_INT8[ROWS] = {tile_rows_int8<1>, tile_rows_int8<2>, tile_rows_int8<3>, tile_rows_int8<4>,
                                       tile_rows_int8<5>, tile_rows_int8<6>, tile_rows_int8<7>, tile_rows_int8<8>};

at::Tensor int8_matmul(const at::Tensor& x, const at::Tensor& packed, const at::Tensor& scale) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2, "int8_matmul takes bf16 activations [M, K], got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.dim() == 3 && packed.size(2) == INT8_GROUP_BYTES && packed.is_contiguous(), "packed weights must be int8 [N/16, K/32, 512]");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() == packed.size(0) * TILE, "scales must be float32 [N]");
  const int64_t M = x.size(0), K = x.size(1), tiles = packed.size(0), groups = packed.size(1), N = tiles * TILE;
  TORCH_CHECK(groups * GROUP == K, "weights packed for ", groups * GROUP, " inputs, activations have ", K);
  const at::Tensor xc = x.contiguous();
  const uint16_t* xs = reinterpret_cast<const uint16_t*>(xc.data_ptr());
  at::Tensor y = at::empty({M, N}, x.options());
  uint16_t* ys = reinterpret_cast<uint16_t*>(y.data_ptr());
  const int8_t* w = packed.data_ptr<int8_t>();
  const float* scales = scale.data_ptr<float>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      for (int64_t m = 0; m < M; m += ROWS)
        TILES_INT8[std::min(ROWS, M - m) - 1](xs + m * K, K, groups, w + t * groups * INT8_GROUP_BYTES, scales + t * TILE, ys + m * N + t * TILE, N);
  });
  return y;
}

}  // namespace

TORCH_LIBRARY(adaptive, m) {
  m.def("int4_matmul(Tensor x, Tensor packed) -> Tensor");
  m.def("int8_matmul(Tensor x, Tensor packed, Tensor scale) -> Tensor");
}
TORCH_LIBRARY_IMPL(adaptive, CPU, m) {
  m.impl("int4_matmul", &int4_matmul);
  m.impl("int8_matmul", &int8_matmul);
}
