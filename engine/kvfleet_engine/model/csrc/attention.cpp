// Paged attention over a step's flat batch (see kernels.cpp).

#include "kernels.h"

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

extern "C" {

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
  KVF_DISPATCH(dtype, switch (dim) {
    case 32: ATTENTION(32); break;
    case 64: ATTENTION(64); break;
    case 128: ATTENTION(128); break;
    default: ATTENTION(0);
  })
}

}  // extern "C"
