// Shared by kvfleet's CPU kernels (see kernels.cpp for what they are and why): the bf16
// type and its conversions, and the dtype dispatch of the C entry points.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

typedef uint16_t bf16;

inline float to_f(float x) { return x; }
inline float to_f(bf16 x) {
  uint32_t u = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
template <typename T> inline T from_f(float f);
template <> inline float from_f<float>(float f) { return f; }
template <> inline bf16 from_f<bf16>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even, as torch does
  return static_cast<bf16>(u >> 16);
}

// Work below this many elements runs on one thread: waking the pool costs more.
inline constexpr int64_t kParallelMin = 16384;

// The C entry points take dtype 0 = float32, 1 = bfloat16 and run CALL with T set to match.
#define KVF_DISPATCH(dtype, CALL) \
  if (dtype == 1) {               \
    typedef bf16 T;               \
    CALL;                         \
  } else {                        \
    typedef float T;              \
    CALL;                         \
  }
