// Element-wise reduction kernels shared by every backend.  Vectorized for
// the CPU the process runs on (function multiversioning); bfloat16 and
// float16 are widened to float32, reduced, and rounded to nearest even once.
#pragma once

#include <cstddef>

#include "ember/collective.h"

namespace ember::collective {

// dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[n-1][i]) for i < count,
// combined in the order given (so every rank computing it gets the same
// bits).  `op` is kSum, kMin or kMax.  dst may alias srcs[0] (only).
void ReduceN(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int n, size_t count);

// dst[i] = op(dst[i], src[i]).
void ReduceInto(DataType dtype, ReduceOp op, void* dst, const void* src, size_t count);

// data[i] /= divisor (kAverage's second half); integers truncate toward zero.
void DivideBy(DataType dtype, void* data, size_t count, int divisor);

// The instruction sets the kernels are compiled for.  ReduceN and DivideBy
// use the best one the CPU has (picked once per process); tests and
// benchmarks run each through ReduceNWith / DivideByWith.  All of them give
// the same bits.
enum class KernelIsa { kBaseline, kAvx2, kAvx512 };  // AVX2 means AVX2 + F16C

// Whether this CPU runs `isa`'s kernels (kBaseline: always).  Thread-safe.
bool CpuSupports(KernelIsa isa);

// ReduceN and DivideBy with `isa`'s kernels; `isa` must be supported.
void ReduceNWith(KernelIsa isa, DataType dtype, ReduceOp op, void* dst, const void* const* srcs, int n,
                 size_t count);
void DivideByWith(KernelIsa isa, DataType dtype, void* data, size_t count, int divisor);

// Scalar conversions, exposed for tests and the bindings.
float BFloat16ToFloat(uint16_t v);
uint16_t FloatToBFloat16(float f);  // round to nearest even; NaN stays NaN
float Float16ToFloat(uint16_t v);
uint16_t FloatToFloat16(float f);

}  // namespace ember::collective
