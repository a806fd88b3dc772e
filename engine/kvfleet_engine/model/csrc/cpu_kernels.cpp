// kvfleet's fused CPU kernels for the decoder layer, called through ctypes.
//
// Why: on a 2-core CPU a SmolLM2 decode step spent more time in ~30 small eager ops per
// layer (bf16 elementwise, KV gathers, a padded SDPA per bucket) than in its GEMMs. These
// kernels replace them with one pass each: RMSNorm (+ residual add), SiLU * up, RoPE, and
// paged attention that reads K/V straight from the block tables (no gather, no padding).
//
// Plain C ABI, raw pointers, row strides in elements. dtype 0 = float32, 1 = bfloat16.
// Threads come from OpenMP; the library links the libgomp that torch has already loaded,
// so both share one thread pool.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef uint16_t bf16;

static inline float to_f(float x) { return x; }
static inline float to_f(bf16 x) {
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <typename T> static inline T from_f(float f);
template <> inline float from_f<float>(float f) { return f; }
template <> inline bf16 from_f<bf16>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even, as torch does
  return static_cast<bf16>(u >> 16);
}

// Work below this many elements runs on one thread: waking the pool costs more.
static const int64_t kParallelMin = 16384;

// ---- RMSNorm, optionally fused with the residual add ---------------------------------------
// residual == nullptr: out = norm(x) * w.
// otherwise: residual = x + residual (rounded to T), out = norm(residual) * w.
template <typename T>
static void rms_norm_impl(const T* x, int64_t x_stride, T* residual, const T* w, T* out,
                          int64_t n, int64_t dim, float eps) {
#pragma omp parallel for schedule(static) if (n * dim >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const T* xi = x + i * x_stride;
    T* oi = out + i * dim;
    float buf[8192];
    float* src = dim <= 8192 ? buf : nullptr;
    std::vector<float> big;
    if (!src) {
      big.resize(dim);
      src = big.data();
    }
    if (residual) {
      T* ri = residual + i * dim;
      for (int64_t d = 0; d < dim; ++d) {
        T r = from_f<T>(to_f(xi[d]) + to_f(ri[d]));
        ri[d] = r;
        src[d] = to_f(r);
      }
    } else {
      for (int64_t d = 0; d < dim; ++d) src[d] = to_f(xi[d]);
    }
    float ss = 0.f;
    for (int64_t d = 0; d < dim; ++d) ss += src[d] * src[d];
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t d = 0; d < dim; ++d) oi[d] = from_f<T>(src[d] * inv * to_f(w[d]));
  }
}

// ---- SiLU(gate) * up over a fused [n, 2 * inter] gate_up row --------------------------------
// In float blocks of 256: the convert, exp (glibc's vector expf) and round loops each
// vectorize on their own, which one fused bf16 loop did not.
template <typename T>
static void silu_mul_impl(const T* gate_up, T* out, int64_t n, int64_t inter) {
  const int64_t kBlock = 256;
  const int64_t blocks = (inter + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n * inter >= kParallelMin)
  for (int64_t task = 0; task < n * blocks; ++task) {
    const int64_t i = task / blocks, d0 = (task % blocks) * kBlock;
    const int64_t len = std::min(kBlock, inter - d0);
    const T* g = gate_up + i * 2 * inter + d0;
    const T* u = g + inter;
    T* o = out + i * inter + d0;
    float gf[kBlock], uf[kBlock], e[kBlock];
    for (int64_t d = 0; d < len; ++d) gf[d] = to_f(g[d]);
    for (int64_t d = 0; d < len; ++d) uf[d] = to_f(u[d]);
    for (int64_t d = 0; d < len; ++d) e[d] = std::exp(-gf[d]);
    for (int64_t d = 0; d < len; ++d) o[d] = from_f<T>(gf[d] / (1.f + e[d]) * uf[d]);
  }
}

// ---- RoPE, "rotate half" layout, in place on the first num_heads heads of each row -----------
// cos/sin: float32 tables [max_pos, dim / 2]; positions: int64 [n].
template <typename T>
static void rope_impl(T* x, int64_t row_stride, int64_t n, int64_t num_heads, int64_t dim,
                      const int64_t* positions, const float* cos_t, const float* sin_t) {
  const int64_t half = dim / 2;
#pragma omp parallel for schedule(static) if (n * num_heads * dim >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float* c = cos_t + positions[i] * half;
    const float* s = sin_t + positions[i] * half;
    for (int64_t h = 0; h < num_heads; ++h) {
      T* x1 = x + i * row_stride + h * dim;
      T* x2 = x1 + half;
      for (int64_t d = 0; d < half; ++d) {
        const float a = to_f(x1[d]), b = to_f(x2[d]);
        x1[d] = from_f<T>(a * c[d] - b * s[d]);
        x2[d] = from_f<T>(b * c[d] + a * s[d]);
      }
    }
  }
}

static const int64_t kQueryTile = 16;  // query tokens per attention task
static const int kChunk = 16;          // KV tokens per online-softmax step

// ---- 16 attention scores of one query row against a chunk of K rows ------------------------
#if defined(__AVX512F__)
// Lane j of the result is the sum of v[j]'s 16 lanes: 16 horizontal sums for the price of
// about three (a transpose-and-add tree instead of one reduction per dot product).
static inline __m512 sum_lanes_16(const __m512* v) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit block: [a0+a2, b0+b2, a1+a3, b1+b3]
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  for (int i = 0; i < 4; ++i)  // per block: one partial sum of each of 4 vectors
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 y01 = _mm512_add_ps(_mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(u[0], u[1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 y23 = _mm512_add_ps(_mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                   _mm512_shuffle_f32x4(u[2], u[3], _MM_SHUFFLE(3, 2, 3, 2)));
  return _mm512_add_ps(_mm512_shuffle_f32x4(y01, y23, _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(y01, y23, _MM_SHUFFLE(3, 1, 3, 1)));
}
#endif

// s[j] = q . k_j for j < n (s[j] = 0 beyond). q_raw: the query row in the cache dtype,
// unscaled; qf: the same row as floats, already scaled; krows[j] + off: K row of token j.
template <typename T, int D>
static inline void chunk_scores(const T* q_raw, const float* qf, const T* const* krows,
                                int64_t off, int64_t n, int64_t dim, float scale, float* s) {
#if defined(__AVX512BF16__)
  if constexpr (sizeof(T) == 2 && D > 0 && D % 32 == 0) {  // bf16: pair dot products
    __m512bh qv[D / 32];
    for (int c = 0; c < D / 32; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(q_raw + c * 32);
    __m512 acc[kChunk];
    for (int j = 0; j < kChunk; ++j) {
      acc[j] = _mm512_setzero_ps();
      if (j < n)
        for (int c = 0; c < D / 32; ++c)
          acc[j] = _mm512_dpbf16_ps(acc[j], qv[c],
                                    (__m512bh)_mm512_loadu_si512(krows[j] + off + c * 32));
    }
    _mm512_storeu_ps(s, _mm512_mul_ps(sum_lanes_16(acc), _mm512_set1_ps(scale)));
    return;
  }
#endif
#if defined(__AVX512F__)
  if constexpr (sizeof(T) == 4 && D > 0 && D % 16 == 0) {  // float32: plain FMAs
    __m512 acc[kChunk];
    for (int j = 0; j < kChunk; ++j) {
      acc[j] = _mm512_setzero_ps();
      if (j < n)
        for (int c = 0; c < D / 16; ++c)
          acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(qf + c * 16),
                                   _mm512_loadu_ps(reinterpret_cast<const float*>(
                                       krows[j] + off + c * 16)), acc[j]);
    }
    _mm512_storeu_ps(s, sum_lanes_16(acc));
    return;
  }
#endif
  (void)q_raw, (void)scale;
  for (int64_t j = 0; j < kChunk; ++j) {
    float dot = 0.f;
    if (j < n)
      for (int64_t d = 0; d < dim; ++d) dot += qf[d] * to_f(krows[j][off + d]);
    s[j] = dot;
  }
}

// ---- paged attention over a flat batch of mixed prefill chunks and decodes -----------------
// Sequence b owns q rows [q_start[b], q_start[b] + q_len[b]); its KV holds ctx_len[b] tokens
// (the new ones included, already written), and query j of it sees the first
// ctx_len[b] - q_len[b] + 1 + j of them. K/V caches: [blocks, block_size, kv_heads, dim].
//
// One task is (sequence, tile of query tokens) with all heads, so each cached token's K and
// V rows (all KV heads, contiguous) stream in once per task. KV is read in chunks of 16
// tokens with an online softmax: K is transposed into [kv_head][dim][16] floats, so a
// query row's 16 scores are 16-wide FMAs with no horizontal sums.

// D: head dim as a compile-time constant, so a query row's accumulator lives in registers
// (D = 0: read at run time, for unusual head dims).
template <typename T, int D>
static void attention_impl(const T* q, int64_t q_stride, T* out, int64_t out_stride,
                           const T* k_cache, const T* v_cache, const int32_t* block_tables,
                           int64_t bt_stride, const int32_t* q_start, const int32_t* q_len,
                           const int32_t* ctx_len, int64_t num_seqs, int64_t num_heads,
                           int64_t num_kv_heads, int64_t run_dim, int64_t block_size,
                           float scale) {
  const int64_t dim = D ? D : run_dim;
  const int64_t group = num_heads / num_kv_heads;
  const int64_t kv_row = num_kv_heads * dim;  // elements per cached token
  std::vector<int64_t> task_seq, task_tile;
  int64_t work = 0;
  for (int64_t b = 0; b < num_seqs; ++b) {
    for (int64_t t0 = 0; t0 < q_len[b]; t0 += kQueryTile) {
      task_seq.push_back(b);
      task_tile.push_back(t0);
    }
    work += static_cast<int64_t>(q_len[b]) * ctx_len[b];
  }
  const int64_t num_tasks = static_cast<int64_t>(task_seq.size());
  const int64_t rows_max = kQueryTile * num_heads;

#pragma omp parallel if (work * num_heads * dim >= kParallelMin)
  {
    std::vector<float> qf(rows_max * dim), acc(rows_max * dim);
    std::vector<float> vf(kChunk * kv_row);
    std::vector<float> row_max(rows_max), row_sum(rows_max);
    std::vector<int64_t> limit(rows_max);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < num_tasks; ++task) {
      const int64_t b = task_seq[task], t0 = task_tile[task];
      const int64_t n_tok = std::min<int64_t>(kQueryTile, q_len[b] - t0);
      const int64_t rows = n_tok * num_heads;  // row r: query token r / heads, head r % heads
      const int64_t first_limit = ctx_len[b] - q_len[b] + 1 + t0;
      const int32_t* table = block_tables + b * bt_stride;
      for (int64_t j = 0; j < n_tok; ++j) {
        const T* src = q + (q_start[b] + t0 + j) * q_stride;
        for (int64_t i = 0; i < num_heads * dim; ++i)
          qf[j * num_heads * dim + i] = to_f(src[i]) * scale;
        for (int64_t h = 0; h < num_heads; ++h) {
          limit[j * num_heads + h] = first_limit + j;
          row_max[j * num_heads + h] = -1.0e30f;
          row_sum[j * num_heads + h] = 0.f;
        }
      }
      std::fill(acc.begin(), acc.begin() + rows * dim, 0.f);
      const int64_t span = first_limit + n_tok - 1;  // tokens the last query sees
      for (int64_t c0 = 0; c0 < span; c0 += kChunk) {
        const int64_t n = std::min<int64_t>(kChunk, span - c0);
        const T* krows[kChunk];
        for (int64_t j = 0; j < n; ++j) {  // this chunk's K rows, and V rows as floats
          const int64_t t = c0 + j;
          const int64_t slot = static_cast<int64_t>(table[t / block_size]) * block_size
                               + t % block_size;
          krows[j] = k_cache + slot * kv_row;
          const T* vrow = v_cache + slot * kv_row;
          float* vj = &vf[j * kv_row];
          for (int64_t i = 0; i < kv_row; ++i) vj[i] = to_f(vrow[i]);
          // Prefetch the next chunk's rows into L2 (not L1: 192 lines at once overflow L1's
          // miss queue and get dropped), so DRAM latency hides behind this chunk's math.
          const int64_t ahead = t + kChunk;
          if (ahead < span) {
            const int64_t next = static_cast<int64_t>(table[ahead / block_size]) * block_size
                                 + ahead % block_size;
            const char* kn = reinterpret_cast<const char*>(k_cache + next * kv_row);
            const char* vn = reinterpret_cast<const char*>(v_cache + next * kv_row);
            for (int64_t off = 0; off < kv_row * static_cast<int64_t>(sizeof(T)); off += 64) {
              __builtin_prefetch(kn + off, 0, 1);
              __builtin_prefetch(vn + off, 0, 1);
            }
          }
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t seen = std::min<int64_t>(limit[r] - c0, n);  // valid tokens here
          if (seen <= 0) continue;
          const int64_t h = (r % num_heads) / group;
          const float* qr = &qf[r * dim];
          const T* q_raw = q + (q_start[b] + t0 + r / num_heads) * q_stride
                           + (r % num_heads) * dim;
          alignas(64) float p[kChunk];
          chunk_scores<T, D>(q_raw, qr, krows, h * dim, seen, dim, scale, p);
          float m = row_max[r];
          for (int64_t j = 0; j < seen; ++j) m = std::max(m, p[j]);
          const float rescale = std::exp(row_max[r] - m);
          float sum = 0.f;
          for (int64_t j = 0; j < seen; ++j) {
            p[j] = std::exp(p[j] - m);
            sum += p[j];
          }
          row_sum[r] = row_sum[r] * rescale + sum;
          row_max[r] = m;
          float* ar = &acc[r * dim];
          if (D) {  // accumulate in registers across the chunk, store once
            float a[D ? D : 1];
            for (int d = 0; d < D; ++d) a[d] = ar[d] * rescale;
            for (int64_t j = 0; j < seen; ++j) {
              const float pj = p[j];
              const float* vj = &vf[j * kv_row + h * D];
              for (int d = 0; d < D; ++d) a[d] += pj * vj[d];
            }
            for (int d = 0; d < D; ++d) ar[d] = a[d];
          } else {
            for (int64_t d = 0; d < dim; ++d) ar[d] *= rescale;
            for (int64_t j = 0; j < seen; ++j) {
              const float pj = p[j];
              const float* vj = &vf[j * kv_row + h * dim];
              for (int64_t d = 0; d < dim; ++d) ar[d] += pj * vj[d];
            }
          }
        }
      }
      for (int64_t j = 0; j < n_tok; ++j) {
        T* dst = out + (q_start[b] + t0 + j) * out_stride;
        for (int64_t h = 0; h < num_heads; ++h) {
          const int64_t r = j * num_heads + h;
          const float inv = 1.f / row_sum[r];
          for (int64_t d = 0; d < dim; ++d) dst[h * dim + d] = from_f<T>(acc[r * dim + d] * inv);
        }
      }
    }
  }
}

// ---- KV-cache write: row i of k/v goes to flat slot slots[i] ----------------------------------
template <typename T>
static void cache_write_impl(const T* k, const T* v, int64_t row_stride, T* k_cache, T* v_cache,
                             const int64_t* slots, int64_t n, int64_t kv_row) {
#pragma omp parallel for schedule(static) if (n * kv_row >= kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(k_cache + slots[i] * kv_row, k + i * row_stride, kv_row * sizeof(T));
    std::memcpy(v_cache + slots[i] * kv_row, v + i * row_stride, kv_row * sizeof(T));
  }
}

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

#define DISPATCH(dtype, CALL)            \
  if (dtype == 1) {                      \
    typedef bf16 T;                      \
    CALL;                                \
  } else {                               \
    typedef float T;                     \
    CALL;                                \
  }

extern "C" {

int kvf_abi_version() { return 2; }

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


void kvf_rms_norm(int dtype, const void* x, int64_t x_stride, void* residual, const void* w,
                  void* out, int64_t n, int64_t dim, float eps) {
  DISPATCH(dtype, rms_norm_impl<T>(static_cast<const T*>(x), x_stride,
                                   static_cast<T*>(residual), static_cast<const T*>(w),
                                   static_cast<T*>(out), n, dim, eps))
}

void kvf_silu_mul(int dtype, const void* gate_up, void* out, int64_t n, int64_t inter) {
  DISPATCH(dtype, silu_mul_impl<T>(static_cast<const T*>(gate_up), static_cast<T*>(out), n,
                                   inter))
}

void kvf_rope(int dtype, void* x, int64_t row_stride, int64_t n, int64_t num_heads,
              int64_t dim, const int64_t* positions, const float* cos_t, const float* sin_t) {
  DISPATCH(dtype, rope_impl<T>(static_cast<T*>(x), row_stride, n, num_heads, dim, positions,
                               cos_t, sin_t))
}

void kvf_cache_write(int dtype, const void* k, const void* v, int64_t row_stride,
                     void* k_cache, void* v_cache, const int64_t* slots, int64_t n,
                     int64_t kv_row) {
  DISPATCH(dtype, cache_write_impl<T>(static_cast<const T*>(k), static_cast<const T*>(v),
                                      row_stride, static_cast<T*>(k_cache),
                                      static_cast<T*>(v_cache), slots, n, kv_row))
}

void kvf_paged_attention(int dtype, const void* q, int64_t q_stride, void* out,
                         int64_t out_stride, const void* k_cache, const void* v_cache,
                         const int32_t* block_tables, int64_t bt_stride,
                         const int32_t* q_start, const int32_t* q_len, const int32_t* ctx_len,
                         int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                         int64_t dim, int64_t block_size, float scale) {
#define ATTENTION(D)                                                                          \
  attention_impl<T, D>(static_cast<const T*>(q), q_stride, static_cast<T*>(out), out_stride,  \
                       static_cast<const T*>(k_cache), static_cast<const T*>(v_cache),        \
                       block_tables, bt_stride, q_start, q_len, ctx_len, num_seqs, num_heads, \
                       num_kv_heads, dim, block_size, scale)
  DISPATCH(dtype, switch (dim) {
    case 32: ATTENTION(32); break;
    case 64: ATTENTION(64); break;
    case 128: ATTENTION(128); break;
    default: ATTENTION(0);
  })
}

}  // extern "C"
