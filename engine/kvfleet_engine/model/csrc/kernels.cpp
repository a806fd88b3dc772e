// kvfleet's fused CPU kernels for the decoder layer, called through ctypes.
//
// Why: on a 2-core CPU a SmolLM2 decode step spent more time in ~30 small eager ops per
// layer (bf16 elementwise, KV gathers, a padded SDPA per bucket) than in its GEMMs. These
// kernels replace them with one pass each: RMSNorm (+ residual add), SiLU * up, RoPE, the
// KV-cache write, paged attention that reads K/V straight through the block tables (no
// gather, no padding), and a bf16 GEMM that beats oneDNN at decode batch sizes.
//
// Plain C ABI, raw pointers, row strides in elements. dtype 0 = float32, 1 = bfloat16.
// Threads come from OpenMP; the library links the libgomp that torch has already loaded,
// so both share one thread pool. This file: the elementwise kernels and the cache write;
// attention.cpp: paged attention; gemm.cpp: the bf16 GEMM over pair-packed weights.

#include "kernels.h"

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

extern "C" {

int kvf_abi_version() { return 2; }

void kvf_rms_norm(int dtype, const void* x, int64_t x_stride, void* residual, const void* w,
                  void* out, int64_t n, int64_t dim, float eps) {
  KVF_DISPATCH(dtype, rms_norm_impl<T>(static_cast<const T*>(x), x_stride,
                                   static_cast<T*>(residual), static_cast<const T*>(w),
                                   static_cast<T*>(out), n, dim, eps))
}

void kvf_silu_mul(int dtype, const void* gate_up, void* out, int64_t n, int64_t inter) {
  KVF_DISPATCH(dtype, silu_mul_impl<T>(static_cast<const T*>(gate_up), static_cast<T*>(out), n,
                                   inter))
}

void kvf_rope(int dtype, void* x, int64_t row_stride, int64_t n, int64_t num_heads,
              int64_t dim, const int64_t* positions, const float* cos_t, const float* sin_t) {
  KVF_DISPATCH(dtype, rope_impl<T>(static_cast<T*>(x), row_stride, n, num_heads, dim, positions,
                               cos_t, sin_t))
}

void kvf_cache_write(int dtype, const void* k, const void* v, int64_t row_stride,
                     void* k_cache, void* v_cache, const int64_t* slots, int64_t n,
                     int64_t kv_row) {
  KVF_DISPATCH(dtype, cache_write_impl<T>(static_cast<const T*>(k), static_cast<const T*>(v),
                                      row_stride, static_cast<T*>(k_cache),
                                      static_cast<T*>(v_cache), slots, n, kv_row))
}

}  // extern "C"
