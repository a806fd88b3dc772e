// bf16 GEMM over pair-packed weights (see kernels.cpp).

#include "kernels.h"

#if defined(__AVX512BF16__)
// ---- GEMM over a pair-packed bf16 weight ----------------------------------------------------
// Packed layout: for each block of 16 output columns and each pair of input features
// (2p, 2p+1), 16 x 2 bf16 = one 64-byte vector: wp[(nb * (k/2) + p) * 32 + 2 * c + e] =
// w[16 nb + c][2p + e]. One broadcast pair of x times one such vector is a pair dot product
// into 16 output columns: no horizontal sums, and every weight byte is read once per tile
// of rows.
static const int kGemmRows = 6;   // rows of x per register tile
static const int kGemmCols = 4;   // 16-column vectors per register tile (64 columns)

template <int R>
static inline void gemm_tile(const bf16* x, int64_t ldx, const bf16* wp, int64_t pairs,
                             int ncols, const bf16* bias, bf16* y, int64_t ldy) {
  __m512 acc[R][kGemmCols];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < kGemmCols; ++c) acc[r][c] = _mm512_setzero_ps();
  const int32_t* xp = reinterpret_cast<const int32_t*>(x);  // x rows as bf16 pairs
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh w[kGemmCols];
    for (int c = 0; c < kGemmCols; ++c)
      w[c] = (__m512bh)_mm512_loadu_si512(wp + (c * pairs + p) * 32);
    for (int r = 0; r < R; ++r) {
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(xp[r * (ldx / 2) + p]);
      for (int c = 0; c < kGemmCols; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xb, w[c]);
    }
  }
  for (int c = 0; c < kGemmCols && c * 16 < ncols; ++c) {
    const int valid = std::min(16, ncols - c * 16);
    const __mmask16 mask = valid == 16 ? 0xFFFF : static_cast<__mmask16>((1u << valid) - 1u);
    __m512 b = _mm512_setzero_ps();
    if (bias) {
      const __m256i braw = _mm256_maskz_loadu_epi16(mask, bias + c * 16);
      b = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(braw), 16));
    }
    for (int r = 0; r < R; ++r)
      _mm256_mask_storeu_epi16(y + r * ldy + c * 16, mask,
                               (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(acc[r][c], b)));
  }
}

// y[m, n] = x[m, k] . w^T (+ bias); k even, x rows contiguous; wp packed as above.
static void packed_gemm(const bf16* x, const bf16* wp, const bf16* bias, bf16* y, int64_t m,
                        int64_t n, int64_t k) {
  const int64_t pairs = k / 2;
  const int64_t panels = (n + 16 * kGemmCols - 1) / (16 * kGemmCols);
  const int64_t row_tiles = (m + kGemmRows - 1) / kGemmRows;
#pragma omp parallel for schedule(static) if (m * n * k >= 64 * kParallelMin)
  for (int64_t task = 0; task < panels * row_tiles; ++task) {
    const int64_t panel = task / row_tiles, rt = task % row_tiles;
    const int64_t col = panel * 16 * kGemmCols, row = rt * kGemmRows;
    const int ncols = static_cast<int>(std::min<int64_t>(16 * kGemmCols, n - col));
    const bf16* w = wp + (col / 16) * pairs * 32;
    const bf16* b = bias ? bias + col : nullptr;
    const bf16* xr = x + row * k;
    bf16* yr = y + row * n + col;
    switch (std::min<int64_t>(kGemmRows, m - row)) {
      case 6: gemm_tile<6>(xr, k, w, pairs, ncols, b, yr, n); break;
      case 5: gemm_tile<5>(xr, k, w, pairs, ncols, b, yr, n); break;
      case 4: gemm_tile<4>(xr, k, w, pairs, ncols, b, yr, n); break;
      case 3: gemm_tile<3>(xr, k, w, pairs, ncols, b, yr, n); break;
      case 2: gemm_tile<2>(xr, k, w, pairs, ncols, b, yr, n); break;
      default: gemm_tile<1>(xr, k, w, pairs, ncols, b, yr, n); break;
    }
  }
}
#endif

extern "C" {

// 1 when this build has the bf16 GEMM (the CPU has AVX512-BF16), else 0.
int kvf_has_bf16_gemm() {
#if defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}

// Packs w [n, k] (bf16, k even) for kvf_packed_gemm: out holds ceil(n / 16) * 16 * k values.
void kvf_pack_weight(const void* w, void* out, int64_t n, int64_t k) {
  const bf16* src = static_cast<const bf16*>(w);
  bf16* dst = static_cast<bf16*>(out);
  const int64_t pairs = k / 2, blocks = (n + 15) / 16;
  for (int64_t nb = 0; nb < blocks; ++nb)
    for (int64_t p = 0; p < pairs; ++p)
      for (int64_t c = 0; c < 16; ++c)
        for (int64_t e = 0; e < 2; ++e) {
          const int64_t row = nb * 16 + c;
          dst[((nb * pairs + p) * 16 + c) * 2 + e] = row < n ? src[row * k + 2 * p + e] : 0;
        }
}

void kvf_packed_gemm(const void* x, const void* wp, const void* bias, void* y, int64_t m,
                     int64_t n, int64_t k) {
#if defined(__AVX512BF16__)
  packed_gemm(static_cast<const bf16*>(x), static_cast<const bf16*>(wp),
              static_cast<const bf16*>(bias), static_cast<bf16*>(y), m, n, k);
#else
  (void)x, (void)wp, (void)bias, (void)y, (void)m, (void)n, (void)k;
#endif
}

}  // extern "C"
