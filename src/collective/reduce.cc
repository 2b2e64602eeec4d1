// Reduction kernels.  The shape of every kernel is the same: work through
// the buffers in blocks that fit in L1, combine the sources into a local
// accumulator in the order given, then store the block.  The accumulator
// never aliases the caller's memory, so the compiler vectorizes the loops
// without run-time alias checks, and `dst` may alias any source (a block is
// read completely before it is written).  Every element sees exactly the
// operations of the scalar definition (a + b, b < a ? b : a, ...), so the
// vector code gives the same bits as a scalar loop would.
//
// Each kernel is compiled three times, for AVX-512, AVX2+F16C and the
// baseline, and picked once per process by what the CPU supports.  The
// 16-bit floats are the exception to the block shape on x86: their AVX2 and
// AVX-512 kernels are written with intrinsics and fused (widen, combine,
// narrow in registers; see "fused" below), so they move as many bytes per
// second as float32; the baseline keeps the block kernels, which are also the
// scalar definition.  The float16 conversions are F16C instructions where
// available and an exact software version otherwise (clang 14 has no
// _Float16 on x86).
#if defined(__GNUC__) && !defined(__clang__)
// -O3 for this file only: GCC's -O2 vectorizer gives up on loops of unknown
// trip count, which is most of them here.
#pragma GCC optimize("O3")
// GCC 12 flags the deliberately undefined registers inside its own AVX-512
// conversion intrinsics (_mm512_undefined_*): a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "collective/reduce.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define EMBER_X86 1
#else
#define EMBER_X86 0
#endif

#define EMBER_INLINE inline __attribute__((always_inline))

namespace ember::collective {
namespace {

constexpr size_t kBlockBytes = 8192;  // the accumulator: L1-resident, several vectors per loop

template <typename T>
struct Sum {
  static EMBER_INLINE T Apply(T a, T b) { return a + b; }
};
// Integers wrap around (two's complement) instead of overflowing into
// undefined behaviour; the bits are those of a plain `a + b` on x86.
template <>
struct Sum<int32_t> {
  static EMBER_INLINE int32_t Apply(int32_t a, int32_t b) {
    return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
  }
};
template <>
struct Sum<int64_t> {
  static EMBER_INLINE int64_t Apply(int64_t a, int64_t b) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }
};
template <typename T>
struct Min {
  static EMBER_INLINE T Apply(T a, T b) { return b < a ? b : a; }
};
template <typename T>
struct Max {
  static EMBER_INLINE T Apply(T a, T b) { return a < b ? b : a; }
};

template <typename T>
const T* Src(const void* const* srcs, int k, size_t base) {
  return static_cast<const T*>(srcs[k]) + base;
}

// acc[i] = op(acc[i], s[i]) for i < m (m <= kBlock).
template <typename T, typename Op>
EMBER_INLINE void Combine(T* __restrict acc, const T* __restrict s, size_t m) {
  for (size_t i = 0; i < m; ++i) acc[i] = Op::Apply(acc[i], s[i]);
}

template <typename T, typename Op>
EMBER_INLINE void ReduceTyped(T* dst, const void* const* srcs, int n, size_t count) {
  constexpr size_t kBlock = kBlockBytes / sizeof(T);
  alignas(64) T acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const T* s0 = Src<T>(srcs, 0, base);
    const T* s1 = Src<T>(srcs, 1, base);
    for (size_t i = 0; i < m; ++i) acc[i] = Op::Apply(s0[i], s1[i]);
    for (int k = 2; k < n; ++k) Combine<T, Op>(acc, Src<T>(srcs, k, base), m);
    std::memcpy(dst + base, acc, m * sizeof(T));
  }
}

// --- 16-bit floats: widen a block to float32, reduce, round once. ---

EMBER_INLINE float Bf16Widen(uint16_t v) { return std::bit_cast<float>(static_cast<uint32_t>(v) << 16); }

EMBER_INLINE uint16_t Bf16Narrow(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;  // nearest even
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  // A signed compare of the magnitude (below 2^31 either way): x86 vectors
  // have no unsigned 32-bit compare, and this one vectorizes.
  const int32_t magnitude = static_cast<int32_t>(bits & 0x7fffffffu);
  return static_cast<uint16_t>(magnitude > 0x7f800000 ? quiet_nan : rounded);
}

// IEEE binary16 in software, rounding to nearest even; NaNs come out quiet
// with their payload truncated, as F16C's vcvtps2ph/vcvtph2ps do.
EMBER_INLINE float F16WidenSoft(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(v));
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

EMBER_INLINE uint16_t F16NarrowSoft(float f) {
  uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  bits &= 0x7fffffffu;
  uint32_t h;
  if (bits > 0x7f800000u) {
    h = 0x7e00u | ((bits >> 13) & 0x3ffu);  // quiet NaN
  } else if (bits >= 0x477ff000u) {
    h = 0x7c00u;  // >= 65520 rounds to infinity
  } else if (bits < 0x38800000u) {
    // Below 2^-14: a subnormal (or zero).  Adding 0.5 puts the float's last
    // mantissa bit at 2^-24, the subnormal step, so the FPU rounds for us.
    const float v = std::bit_cast<float>(bits) + 0.5f;
    h = std::bit_cast<uint32_t>(v) - 0x3f000000u;
  } else {
    const uint32_t odd = (bits >> 13) & 1u;
    bits += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;
    h = bits >> 13;
  }
  return static_cast<uint16_t>(sign | h);
}

// A codec turns a block of 16-bit values into floats and back.
struct Bf16Codec {
  static EMBER_INLINE void Widen(float* __restrict out, const uint16_t* __restrict in, size_t m) {
    for (size_t i = 0; i < m; ++i) out[i] = Bf16Widen(in[i]);
  }
  static EMBER_INLINE void Narrow(uint16_t* __restrict out, const float* __restrict in, size_t m) {
    for (size_t i = 0; i < m; ++i) out[i] = Bf16Narrow(in[i]);
  }
};

struct F16SoftCodec {
  static EMBER_INLINE void Widen(float* __restrict out, const uint16_t* __restrict in, size_t m) {
    for (size_t i = 0; i < m; ++i) out[i] = F16WidenSoft(in[i]);
  }
  static EMBER_INLINE void Narrow(uint16_t* __restrict out, const float* __restrict in, size_t m) {
    for (size_t i = 0; i < m; ++i) out[i] = F16NarrowSoft(in[i]);
  }
};

#if EMBER_X86
#define EMBER_TARGET_AVX2 __attribute__((target("avx2,f16c")))
#define EMBER_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))

// --- 16-bit floats, fused: the vector kernels. ---
//
// Each step takes one vector's worth of elements from every source, widens
// it, combines it in registers and narrows it straight into dst: no block of
// floats in L1 between the passes, so a 16-bit element costs about what a
// float32 one does and the reduction moves as many bytes per second.  Every
// element sees the same operations in the same order as the scalar
// definition (Bf16Widen / Bf16Narrow, F16C, Sum/Min/Max::Apply), so the bits
// are those of the baseline kernels (reduce_test checks every ISA).  dst may
// equal a source: a step reads all its sources before it stores.

enum class VOp { kSum, kMin, kMax };
template <typename Op> constexpr VOp kVOp = VOp::kSum;
template <> constexpr VOp kVOp<Min<float>> = VOp::kMin;
template <> constexpr VOp kVOp<Max<float>> = VOp::kMax;

#define EMBER_AVX2_INLINE inline __attribute__((always_inline, target("avx2,f16c")))
#define EMBER_AVX512_INLINE \
  inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx2,f16c")))

// A step is two vectors of floats.  The Min/Max operand order is the scalar
// rule's: minps(x, y) is x < y ? x : y, so b < a ? b : a is minps(b, a).
template <VOp op>
EMBER_AVX2_INLINE __m256 Apply256(__m256 a, __m256 b) {
  if constexpr (op == VOp::kMin) return _mm256_min_ps(b, a);
  if constexpr (op == VOp::kMax) return _mm256_max_ps(b, a);
  return _mm256_add_ps(a, b);
}
template <VOp op>
EMBER_AVX512_INLINE __m512 Apply512(__m512 a, __m512 b) {
  if constexpr (op == VOp::kMin) return _mm512_min_ps(b, a);
  if constexpr (op == VOp::kMax) return _mm512_max_ps(b, a);
  return _mm512_add_ps(a, b);
}

// bfloat16 with AVX2, 16 elements a step.  Widening interleaves each 128-bit
// lane's words with zeros (unpacklo: words 0-3, unpackhi: words 4-7), and
// narrowing packs the same lanes back (packus), so the two permutations
// cancel and no cross-lane shuffle is needed.
struct Bf16Avx2 {
  static constexpr size_t kStep = 16;
  struct W { __m256 lo, hi; };
  static EMBER_AVX2_INLINE W Load(const uint16_t* p) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i z = _mm256_setzero_si256();
    return {_mm256_castsi256_ps(_mm256_unpacklo_epi16(z, x)), _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, x))};
  }
  // Bf16Narrow on 8 floats, the result in the low half of each 32-bit lane.
  static EMBER_AVX2_INLINE __m256i Round(__m256 f) {
    const __m256i b = _mm256_castps_si256(f);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(b, _mm256_set1_epi32(0x7fff)), lsb);
    const __m256i quiet = _mm256_or_si256(b, _mm256_set1_epi32(0x400000));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    return _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
  }
  static EMBER_AVX2_INLINE void Store(uint16_t* p, W w) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_packus_epi32(Round(w.lo), Round(w.hi)));
  }
  template <VOp op>
  static EMBER_AVX2_INLINE W Apply(W a, W b) { return {Apply256<op>(a.lo, b.lo), Apply256<op>(a.hi, b.hi)}; }
  static EMBER_AVX2_INLINE W Div(W a, float d) {
    const __m256 v = _mm256_set1_ps(d);
    return {_mm256_div_ps(a.lo, v), _mm256_div_ps(a.hi, v)};
  }
};

// float16 with F16C, 16 elements a step.
struct F16Avx2 {
  static constexpr size_t kStep = 16;
  using W = Bf16Avx2::W;
  static EMBER_AVX2_INLINE W Load(const uint16_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
  }
  static EMBER_AVX2_INLINE void Store(uint16_t* p, W w) {
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(w.lo, kRound));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 8), _mm256_cvtps_ph(w.hi, kRound));
  }
  template <VOp op>
  static EMBER_AVX2_INLINE W Apply(W a, W b) { return Bf16Avx2::Apply<op>(a, b); }
  static EMBER_AVX2_INLINE W Div(W a, float d) { return Bf16Avx2::Div(a, d); }
};

// bfloat16 with AVX-512, 32 elements a step (the same lane trick as Bf16Avx2).
struct Bf16Avx512 {
  static constexpr size_t kStep = 32;
  struct W { __m512 lo, hi; };
  static EMBER_AVX512_INLINE W Load(const uint16_t* p) {
    const __m512i x = _mm512_loadu_si512(p);
    const __m512i z = _mm512_setzero_si512();
    return {_mm512_castsi512_ps(_mm512_unpacklo_epi16(z, x)), _mm512_castsi512_ps(_mm512_unpackhi_epi16(z, x))};
  }
  static EMBER_AVX512_INLINE __m512i Round(__m512 f) {
    const __m512i b = _mm512_castps_si512(f);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(b, _mm512_set1_epi32(0x7fff)), lsb);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    // rounded where a number, b | 0x400000 (quiet) where NaN.
    return _mm512_srli_epi32(_mm512_mask_or_epi32(rounded, nan, b, _mm512_set1_epi32(0x400000)), 16);
  }
  static EMBER_AVX512_INLINE void Store(uint16_t* p, W w) {
    _mm512_storeu_si512(p, _mm512_packus_epi32(Round(w.lo), Round(w.hi)));
  }
  template <VOp op>
  static EMBER_AVX512_INLINE W Apply(W a, W b) { return {Apply512<op>(a.lo, b.lo), Apply512<op>(a.hi, b.hi)}; }
  static EMBER_AVX512_INLINE W Div(W a, float d) {
    const __m512 v = _mm512_set1_ps(d);
    return {_mm512_div_ps(a.lo, v), _mm512_div_ps(a.hi, v)};
  }
};

// float16 with AVX-512's F16C forms, 32 elements a step.
struct F16Avx512 {
  static constexpr size_t kStep = 32;
  using W = Bf16Avx512::W;
  static EMBER_AVX512_INLINE W Load(const uint16_t* p) {
    return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)))};
  }
  static EMBER_AVX512_INLINE void Store(uint16_t* p, W w) {
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(w.lo, kRound));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + 16), _mm512_cvtps_ph(w.hi, kRound));
  }
  template <VOp op>
  static EMBER_AVX512_INLINE W Apply(W a, W b) { return Bf16Avx512::Apply<op>(a, b); }
  static EMBER_AVX512_INLINE W Div(W a, float d) { return Bf16Avx512::Div(a, d); }
};


namespace avx2 {
#define EMBER_FUSED_INLINE EMBER_AVX2_INLINE
#include "collective/reduce_fused.inc"
#undef EMBER_FUSED_INLINE
}  // namespace avx2

namespace avx512 {
#define EMBER_FUSED_INLINE EMBER_AVX512_INLINE
#include "collective/reduce_fused.inc"
#undef EMBER_FUSED_INLINE
}  // namespace avx512
#endif

template <typename Codec, typename Op>
EMBER_INLINE void ReduceHalf(uint16_t* dst, const void* const* srcs, int n, size_t count) {
  constexpr size_t kBlock = kBlockBytes / sizeof(float);
  alignas(64) float acc[kBlock];
  alignas(64) float wide[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    Codec::Widen(acc, Src<uint16_t>(srcs, 0, base), m);
    for (int k = 1; k < n; ++k) {
      Codec::Widen(wide, Src<uint16_t>(srcs, k, base), m);
      Combine<float, Op>(acc, wide, m);
    }
    Codec::Narrow(dst + base, acc, m);
  }
}

// bfloat16 widens with a shift, so each source is widened as it is
// combined, without a second block of floats in between (ReduceHalf's
// `wide`): one pass less over L1 per source.  The same operations in the same
// order as ReduceHalf, so the same bits.
template <typename Op>
EMBER_INLINE void ReduceBf16(uint16_t* dst, const void* const* srcs, int n, size_t count) {
  constexpr size_t kBlock = kBlockBytes / sizeof(float);
  alignas(64) float acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    const uint16_t* __restrict s0 = Src<uint16_t>(srcs, 0, base);
    const uint16_t* __restrict s1 = Src<uint16_t>(srcs, 1, base);
    for (size_t i = 0; i < m; ++i) acc[i] = Op::Apply(Bf16Widen(s0[i]), Bf16Widen(s1[i]));
    for (int k = 2; k < n; ++k) {
      const uint16_t* __restrict s = Src<uint16_t>(srcs, k, base);
      for (size_t i = 0; i < m; ++i) acc[i] = Op::Apply(acc[i], Bf16Widen(s[i]));
    }
    Bf16Codec::Narrow(dst + base, acc, m);
  }
}

template <typename Half, template <typename> class Op>
EMBER_INLINE void ReduceDtype(DataType dtype, void* dst, const void* const* srcs, int n, size_t count) {
  switch (dtype) {
    case DataType::kFloat32: return ReduceTyped<float, Op<float>>(static_cast<float*>(dst), srcs, n, count);
    case DataType::kFloat64: return ReduceTyped<double, Op<double>>(static_cast<double*>(dst), srcs, n, count);
    case DataType::kInt32: return ReduceTyped<int32_t, Op<int32_t>>(static_cast<int32_t*>(dst), srcs, n, count);
    case DataType::kInt64: return ReduceTyped<int64_t, Op<int64_t>>(static_cast<int64_t*>(dst), srcs, n, count);
    case DataType::kBFloat16: return Half::template Bf16<Op<float>>(static_cast<uint16_t*>(dst), srcs, n, count);
    case DataType::kFloat16: return Half::template F16<Op<float>>(static_cast<uint16_t*>(dst), srcs, n, count);
  }
}

// n >= 2, count > 0.
template <typename Half>
EMBER_INLINE void ReduceBody(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count) {
  switch (op) {
    case ReduceOp::kMin: return ReduceDtype<Half, Min>(dtype, dst, srcs, n, count);
    case ReduceOp::kMax: return ReduceDtype<Half, Max>(dtype, dst, srcs, n, count);
    case ReduceOp::kSum:
    case ReduceOp::kAverage: return ReduceDtype<Half, Sum>(dtype, dst, srcs, n, count);
  }
}

template <typename T>
EMBER_INLINE void DivideTyped(T* p, size_t count, T d) {
  for (size_t i = 0; i < count; ++i) p[i] /= d;
}

template <typename Codec>
EMBER_INLINE void DivideHalf(uint16_t* p, size_t count, int divisor) {
  constexpr size_t kBlock = kBlockBytes / sizeof(float);
  alignas(64) float acc[kBlock];
  const float d = static_cast<float>(divisor);
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t m = std::min(kBlock, count - base);
    Codec::Widen(acc, p + base, m);
    for (size_t i = 0; i < m; ++i) acc[i] /= d;
    Codec::Narrow(p + base, acc, m);
  }
}

template <typename Half>
EMBER_INLINE void DivideBody(DataType dtype, void* data, size_t count, int divisor) {
  switch (dtype) {
    case DataType::kFloat32: return DivideTyped(static_cast<float*>(data), count, static_cast<float>(divisor));
    case DataType::kFloat64: return DivideTyped(static_cast<double*>(data), count, static_cast<double>(divisor));
    case DataType::kInt32: return DivideTyped(static_cast<int32_t*>(data), count, static_cast<int32_t>(divisor));
    case DataType::kInt64: return DivideTyped(static_cast<int64_t*>(data), count, static_cast<int64_t>(divisor));
    case DataType::kBFloat16: return Half::DivideBf16(static_cast<uint16_t*>(data), count, divisor);
    case DataType::kFloat16: return Half::DivideF16(static_cast<uint16_t*>(data), count, divisor);
  }
}

// The 16-bit kernels of each instruction set: the block kernels (scalar
// code the compiler vectorizes) as the baseline, the fused ones above it.
struct HalfBaseline {
  template <typename Op>
  static EMBER_INLINE void Bf16(uint16_t* dst, const void* const* srcs, int n, size_t count) {
    ReduceBf16<Op>(dst, srcs, n, count);
  }
  template <typename Op>
  static EMBER_INLINE void F16(uint16_t* dst, const void* const* srcs, int n, size_t count) {
    ReduceHalf<F16SoftCodec, Op>(dst, srcs, n, count);
  }
  static EMBER_INLINE void DivideBf16(uint16_t* p, size_t count, int d) { DivideHalf<Bf16Codec>(p, count, d); }
  static EMBER_INLINE void DivideF16(uint16_t* p, size_t count, int d) { DivideHalf<F16SoftCodec>(p, count, d); }
};
#if EMBER_X86
// Out of line (one call per ReduceN): the generic ReduceBody that calls
// these has no target, so it cannot always-inline them.
struct HalfAvx2 {
  template <typename Op>
  static EMBER_TARGET_AVX2 void Bf16(uint16_t* dst, const void* const* srcs, int n, size_t count) {
    avx2::FusedReduceN<Bf16Avx2, Op>(dst, srcs, n, count);
  }
  template <typename Op>
  static EMBER_TARGET_AVX2 void F16(uint16_t* dst, const void* const* srcs, int n, size_t count) {
    avx2::FusedReduceN<F16Avx2, Op>(dst, srcs, n, count);
  }
  static EMBER_TARGET_AVX2 void DivideBf16(uint16_t* p, size_t count, int d) {
    avx2::FusedDivide<Bf16Avx2>(p, count, d);
  }
  static EMBER_TARGET_AVX2 void DivideF16(uint16_t* p, size_t count, int d) {
    avx2::FusedDivide<F16Avx2>(p, count, d);
  }
};
struct HalfAvx512 {
  template <typename Op>
  static EMBER_TARGET_AVX512 void Bf16(uint16_t* dst, const void* const* srcs, int n, size_t count) {
    avx512::FusedReduceN<Bf16Avx512, Op>(dst, srcs, n, count);
  }
  template <typename Op>
  static EMBER_TARGET_AVX512 void F16(uint16_t* dst, const void* const* srcs, int n, size_t count) {
    avx512::FusedReduceN<F16Avx512, Op>(dst, srcs, n, count);
  }
  static EMBER_TARGET_AVX512 void DivideBf16(uint16_t* p, size_t count, int d) {
    avx512::FusedDivide<Bf16Avx512>(p, count, d);
  }
  static EMBER_TARGET_AVX512 void DivideF16(uint16_t* p, size_t count, int d) {
    avx512::FusedDivide<F16Avx512>(p, count, d);
  }
};
#endif

// One instance of each entry point per instruction set.
using ReduceFn = void (*)(DataType, ReduceOp, void*, const void* const*, int, size_t);
using DivideFn = void (*)(DataType, void*, size_t, int);

void ReduceBaseline(DataType t, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count) {
  ReduceBody<HalfBaseline>(t, op, dst, srcs, n, count);
}
void DivideBaseline(DataType t, void* data, size_t count, int divisor) {
  DivideBody<HalfBaseline>(t, data, count, divisor);
}
#if EMBER_X86
EMBER_TARGET_AVX2 void ReduceAvx2(DataType t, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count) {
  ReduceBody<HalfAvx2>(t, op, dst, srcs, n, count);
}
EMBER_TARGET_AVX2 void DivideAvx2(DataType t, void* data, size_t count, int divisor) {
  DivideBody<HalfAvx2>(t, data, count, divisor);
}
EMBER_TARGET_AVX512 void ReduceAvx512(DataType t, ReduceOp op, void* dst, const void* const* srcs, int n,
                                      size_t count) {
  ReduceBody<HalfAvx512>(t, op, dst, srcs, n, count);
}
EMBER_TARGET_AVX512 void DivideAvx512(DataType t, void* data, size_t count, int divisor) {
  DivideBody<HalfAvx512>(t, data, count, divisor);
}
#endif

struct Kernels {
  ReduceFn reduce;
  DivideFn divide;
};

Kernels KernelsFor(KernelIsa isa) {
  switch (isa) {
#if EMBER_X86
    case KernelIsa::kAvx512: return Kernels{ReduceAvx512, DivideAvx512};
    case KernelIsa::kAvx2: return Kernels{ReduceAvx2, DivideAvx2};
#endif
    default: return Kernels{ReduceBaseline, DivideBaseline};
  }
}

KernelIsa BestIsa() {
  for (KernelIsa isa : {KernelIsa::kAvx512, KernelIsa::kAvx2}) {
    if (CpuSupports(isa)) return isa;
  }
  return KernelIsa::kBaseline;
}

const Kernels& Pick() {
  static const Kernels kernels = KernelsFor(BestIsa());
  return kernels;
}

}  // namespace

bool CpuSupports(KernelIsa isa) {
  if (isa == KernelIsa::kBaseline) return true;
#if EMBER_X86
  __builtin_cpu_init();
  // F16C from CPUID leaf 1 (clang 14's __builtin_cpu_supports does not know it).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  const bool avx2 = f16c && __builtin_cpu_supports("avx2");
  if (isa == KernelIsa::kAvx2) return avx2;
  return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

float BFloat16ToFloat(uint16_t v) { return Bf16Widen(v); }
uint16_t FloatToBFloat16(float f) { return Bf16Narrow(f); }
float Float16ToFloat(uint16_t v) { return F16WidenSoft(v); }
uint16_t FloatToFloat16(float f) { return F16NarrowSoft(f); }

namespace {

void ReduceWith(const Kernels& k, DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int n,
                size_t count) {
  if (n <= 0 || count == 0) return;
  if (n == 1) {
    if (dst != srcs[0]) std::memcpy(dst, srcs[0], count * SizeOf(dtype));
    return;
  }
  k.reduce(dtype, op, dst, srcs, n, count);
}

void DivideWith(const Kernels& k, DataType dtype, void* data, size_t count, int divisor) {
  if (divisor == 1 || count == 0) return;
  k.divide(dtype, data, count, divisor);
}

}  // namespace

void ReduceN(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count) {
  ReduceWith(Pick(), dtype, op, dst, srcs, n, count);
}

void ReduceInto(DataType dtype, ReduceOp op, void* dst, const void* src, size_t count) {
  const void* srcs[2] = {dst, src};
  ReduceN(dtype, op, dst, srcs, 2, count);
}

void DivideBy(DataType dtype, void* data, size_t count, int divisor) {
  DivideWith(Pick(), dtype, data, count, divisor);
}

void ReduceNWith(KernelIsa isa, DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int n,
                 size_t count) {
  ReduceWith(KernelsFor(isa), dtype, op, dst, srcs, n, count);
}

void DivideByWith(KernelIsa isa, DataType dtype, void* data, size_t count, int divisor) {
  DivideWith(KernelsFor(isa), dtype, data, count, divisor);
}

}  // namespace ember::collective
