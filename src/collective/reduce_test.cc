#include "collective/reduce.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace ember::collective {
namespace {

const DataType kDtypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16,
                            DataType::kFloat16, DataType::kInt32,   DataType::kInt64};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax};
const size_t kCounts[] = {0, 1, 7, 16, 1023, 2048, 4097, 10007};

// Every instruction set this CPU runs: each must give the reference's bits.
std::vector<KernelIsa> Isas() {
  std::vector<KernelIsa> isas;
  for (KernelIsa isa : {KernelIsa::kBaseline, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (CpuSupports(isa)) isas.push_back(isa);
  }
  return isas;
}

const char* IsaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kBaseline: return "baseline";
    case KernelIsa::kAvx2: return "avx2";
    case KernelIsa::kAvx512: return "avx512";
  }
  return "?";
}

// --- A straightforward reference: one element at a time, in source order. ---

template <typename T>
T ApplyRef(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kMin: return b < a ? b : a;
    case ReduceOp::kMax: return a < b ? b : a;
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));  // wraps
  } else {
    return a + b;
  }
}

template <typename T>
void RefTyped(ReduceOp op, void* dst, const std::vector<const void*>& srcs, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    T acc;
    std::memcpy(&acc, static_cast<const char*>(srcs[0]) + i * sizeof(T), sizeof(T));
    for (size_t k = 1; k < srcs.size(); ++k) {
      T v;
      std::memcpy(&v, static_cast<const char*>(srcs[k]) + i * sizeof(T), sizeof(T));
      acc = ApplyRef(op, acc, v);
    }
    std::memcpy(static_cast<char*>(dst) + i * sizeof(T), &acc, sizeof(T));
  }
}

void RefHalf(ReduceOp op, bool bf16, void* dst, const std::vector<const void*>& srcs, size_t count) {
  auto widen = [&](uint16_t v) { return bf16 ? BFloat16ToFloat(v) : Float16ToFloat(v); };
  for (size_t i = 0; i < count; ++i) {
    float acc = widen(static_cast<const uint16_t*>(srcs[0])[i]);
    for (size_t k = 1; k < srcs.size(); ++k) acc = ApplyRef(op, acc, widen(static_cast<const uint16_t*>(srcs[k])[i]));
    static_cast<uint16_t*>(dst)[i] = bf16 ? FloatToBFloat16(acc) : FloatToFloat16(acc);
  }
}

void Reference(DataType dtype, ReduceOp op, void* dst, const std::vector<const void*>& srcs, size_t count) {
  switch (dtype) {
    case DataType::kFloat32: return RefTyped<float>(op, dst, srcs, count);
    case DataType::kFloat64: return RefTyped<double>(op, dst, srcs, count);
    case DataType::kInt32: return RefTyped<int32_t>(op, dst, srcs, count);
    case DataType::kInt64: return RefTyped<int64_t>(op, dst, srcs, count);
    case DataType::kBFloat16: return RefHalf(op, true, dst, srcs, count);
    case DataType::kFloat16: return RefHalf(op, false, dst, srcs, count);
  }
}

bool IsFloat(DataType t) { return t != DataType::kInt32 && t != DataType::kInt64; }

bool IsNan(DataType t, const char* p) {
  switch (t) {
    case DataType::kFloat32: { float v; std::memcpy(&v, p, 4); return std::isnan(v); }
    case DataType::kFloat64: { double v; std::memcpy(&v, p, 8); return std::isnan(v); }
    case DataType::kBFloat16: { uint16_t v; std::memcpy(&v, p, 2); return (v & 0x7fff) > 0x7f80; }
    case DataType::kFloat16: { uint16_t v; std::memcpy(&v, p, 2); return (v & 0x7fff) > 0x7c00; }
    default: return false;
  }
}

// Random elements: floats of mixed sign and magnitude (halves in their
// range), integers over the whole range; `specials` sprinkles NaN, +-inf, -0.
void Fill(DataType t, void* p, size_t count, std::mt19937_64* rng, bool specials) {
  std::uniform_real_distribution<double> real(-1000.0, 1000.0);
  std::uniform_int_distribution<int> pick(0, 15);
  for (size_t i = 0; i < count; ++i) {
    double v = real(*rng);
    if (specials) {
      switch (pick(*rng)) {
        case 0: v = std::numeric_limits<double>::quiet_NaN(); break;
        case 1: v = std::numeric_limits<double>::infinity(); break;
        case 2: v = -std::numeric_limits<double>::infinity(); break;
        case 3: v = -0.0; break;
        default: break;
      }
    }
    char* e = static_cast<char*>(p) + i * SizeOf(t);
    switch (t) {
      case DataType::kFloat32: { float f = static_cast<float>(v); std::memcpy(e, &f, 4); break; }
      case DataType::kFloat64: std::memcpy(e, &v, 8); break;
      case DataType::kBFloat16: { uint16_t h = FloatToBFloat16(static_cast<float>(v)); std::memcpy(e, &h, 2); break; }
      case DataType::kFloat16: { uint16_t h = FloatToFloat16(static_cast<float>(v)); std::memcpy(e, &h, 2); break; }
      case DataType::kInt32: { uint32_t x = static_cast<uint32_t>((*rng)()); std::memcpy(e, &x, 4); break; }
      case DataType::kInt64: { uint64_t x = (*rng)(); std::memcpy(e, &x, 8); break; }
    }
  }
}

// Bitwise equal, except that any NaN matches any NaN (the payload of a NaN
// result depends on operand order inside the FPU, not on our code).
void ExpectSame(DataType t, const std::vector<char>& want, const std::vector<char>& got, size_t count,
                const std::string& what) {
  const size_t es = SizeOf(t);
  for (size_t i = 0; i < count; ++i) {
    const char* w = want.data() + i * es;
    const char* g = got.data() + i * es;
    if (std::memcmp(w, g, es) == 0) continue;
    if (IsFloat(t) && IsNan(t, w) && IsNan(t, g)) continue;
    ADD_FAILURE() << what << ": element " << i << " of " << count << " differs";
    return;
  }
}

struct Case {
  DataType dtype;
  ReduceOp op;
};

class ReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReduceTest, MatchesReferenceForEveryLengthAndSourceCount) {
  const auto [dtype, op] = GetParam();
  const size_t es = SizeOf(dtype);
  std::mt19937_64 rng(static_cast<uint64_t>(dtype) * 31 + static_cast<uint64_t>(op));
  for (KernelIsa isa : Isas()) {
    for (bool specials : {false, true}) {
      if (specials && !IsFloat(dtype)) continue;
      for (int n : {1, 2, 3, 8}) {
        for (size_t count : kCounts) {
          // +1 element so that the sources start misaligned.
          std::vector<std::vector<char>> bufs(n, std::vector<char>((count + 1) * es));
          std::vector<const void*> srcs;
          for (auto& b : bufs) {
            Fill(dtype, b.data() + es, count, &rng, specials);
            srcs.push_back(b.data() + es);
          }
          std::vector<char> want(count * es + 1), got(count * es + 1);
          Reference(dtype, op, want.data(), srcs, count);
          ReduceNWith(isa, dtype, op, got.data(), srcs.data(), n, count);
          const std::string what = std::string(IsaName(isa)) + " " + DataTypeName(dtype) + " " +
                                   ReduceOpName(op) + " n=" +
                                   std::to_string(n) + (specials ? " with NaN/inf" : "");
          ExpectSame(dtype, want, got, count, what);

          // In place: dst aliases the first source.
          std::vector<char> first(bufs[0].begin() + es, bufs[0].end());
          std::vector<const void*> srcs2 = srcs;
          srcs2[0] = first.data();
          ReduceNWith(isa, dtype, op, first.data(), srcs2.data(), n, count);
          ExpectSame(dtype, want, first, count, what + " in place");

          if (n == 2 && isa == Isas().back()) {
            std::vector<char> acc(bufs[0].begin() + es, bufs[0].end());
            ReduceInto(dtype, op, acc.data(), srcs[1], count);
            ExpectSame(dtype, want, acc, count, what + " ReduceInto");
          }
        }
      }
    }
  }
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  return std::string(DataTypeName(info.param.dtype)) + "_" + ReduceOpName(info.param.op);
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (DataType t : kDtypes) {
    for (ReduceOp op : kOps) cases.push_back({t, op});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllDtypesAndOps, ReduceTest, ::testing::ValuesIn(AllCases()), CaseName);

TEST(ReduceTest, AverageIsSum) {
  float a[3] = {1, 2, 3}, b[3] = {4, 5, 6};
  const void* srcs[2] = {a, b};
  float out[3];
  ReduceN(DataType::kFloat32, ReduceOp::kAverage, out, srcs, 2, 3);
  EXPECT_EQ(out[0], 5.0f);
  EXPECT_EQ(out[2], 9.0f);
}

TEST(ReduceTest, IntegerSumWrapsAround) {
  int32_t a = std::numeric_limits<int32_t>::max(), b = 1;
  ReduceInto(DataType::kInt32, ReduceOp::kSum, &a, &b, 1);
  EXPECT_EQ(a, std::numeric_limits<int32_t>::min());
}

TEST(ReduceTest, MinMaxKeepTheScalarNanRule) {
  // b < a ? b : a: a NaN in the accumulator stays, a NaN operand is skipped.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a(33, nan), b(33, 1.0f);
  std::vector<float> out(33);
  const void* ab[2] = {a.data(), b.data()};
  const void* ba[2] = {b.data(), a.data()};
  ReduceN(DataType::kFloat32, ReduceOp::kMin, out.data(), ab, 2, 33);
  for (float v : out) EXPECT_TRUE(std::isnan(v));
  ReduceN(DataType::kFloat32, ReduceOp::kMax, out.data(), ba, 2, 33);
  for (float v : out) EXPECT_EQ(v, 1.0f);
}

TEST(ReduceTest, DivideByMatchesScalarDivision) {
  std::mt19937_64 rng(7);
  for (KernelIsa isa : Isas()) {
    for (DataType t : kDtypes) {
      for (size_t count : kCounts) {
        const size_t es = SizeOf(t);
        std::vector<char> data(count * es + 1);
        Fill(t, data.data(), count, &rng, IsFloat(t));
        std::vector<char> want = data;
        for (size_t i = 0; i < count; ++i) {
          char* e = want.data() + i * es;
          switch (t) {
            case DataType::kFloat32: { float v; std::memcpy(&v, e, 4); v /= 3.0f; std::memcpy(e, &v, 4); break; }
            case DataType::kFloat64: { double v; std::memcpy(&v, e, 8); v /= 3.0; std::memcpy(e, &v, 8); break; }
            case DataType::kInt32: { int32_t v; std::memcpy(&v, e, 4); v /= 3; std::memcpy(e, &v, 4); break; }
            case DataType::kInt64: { int64_t v; std::memcpy(&v, e, 8); v /= 3; std::memcpy(e, &v, 8); break; }
            case DataType::kBFloat16: {
              uint16_t v; std::memcpy(&v, e, 2); v = FloatToBFloat16(BFloat16ToFloat(v) / 3.0f); std::memcpy(e, &v, 2);
              break;
            }
            case DataType::kFloat16: {
              uint16_t v; std::memcpy(&v, e, 2); v = FloatToFloat16(Float16ToFloat(v) / 3.0f); std::memcpy(e, &v, 2);
              break;
            }
          }
        }
        DivideByWith(isa, t, data.data(), count, 3);
        ExpectSame(t, want, data, count, std::string("DivideBy ") + IsaName(isa) + " " + DataTypeName(t));
      }
    }
  }
  int32_t neg[2] = {-7, 7};
  DivideBy(DataType::kInt32, neg, 2, 2);
  EXPECT_EQ(neg[0], -3);  // toward zero
  EXPECT_EQ(neg[1], 3);
}

// --- The 16-bit kernels on the values that test a conversion. ---

struct Half {
  DataType dtype;
  uint16_t inf, qnan, snan;  // +inf, a quiet and a signaling NaN with payloads
  int mant_bits;
  float (*widen)(uint16_t);
  uint16_t (*narrow)(float);
};
const Half kHalves[] = {
    {DataType::kBFloat16, 0x7f80, 0x7fc1, 0x7f81, 7, BFloat16ToFloat, FloatToBFloat16},
    {DataType::kFloat16, 0x7c00, 0x7e01, 0x7d01, 10, Float16ToFloat, FloatToFloat16},
};

// x + -0 is x for every x, NaN payloads included (the FPU returns the NaN
// operand, quieted), so each kernel must give exactly narrow(widen(x)) for
// all 65536 patterns: every NaN, infinity, subnormal and normal through the
// vector widen and narrow, bit for bit, no NaN-matches-NaN allowance.  dst
// starts at every offset in a cache line (the kernels align their stores).
TEST(ReduceHalfKernels, EveryPatternPlusMinusZeroIsExact) {
  for (KernelIsa isa : Isas()) {
    for (const Half& h : kHalves) {
      constexpr size_t kCount = 0x10000 + 37;  // past a whole number of steps
      std::vector<uint16_t> x(kCount), zero(kCount, 0x8000), want(kCount);
      for (size_t i = 0; i < kCount; ++i) {
        x[i] = static_cast<uint16_t>(i * 40503u);  // a permutation of the patterns, then a few again
        want[i] = h.narrow(h.widen(x[i]));
      }
      std::vector<uint16_t> out(kCount + 64);
      uint16_t* line = out.data() + (64 - reinterpret_cast<uintptr_t>(out.data()) % 64) % 64 / 2;
      for (size_t shift = 0; shift < 32; shift += 3) {
        uint16_t* dst = line + shift;
        const void* srcs[2] = {x.data(), zero.data()};
        ReduceNWith(isa, h.dtype, ReduceOp::kSum, dst, srcs, 2, kCount);
        for (size_t i = 0; i < kCount; ++i) {
          ASSERT_EQ(dst[i], want[i]) << IsaName(isa) << " " << DataTypeName(h.dtype) << " pattern " << std::hex
                                     << x[i] << " dst shift " << std::dec << shift;
        }
      }
    }
  }
}

// Sums of two values whose exponents differ by 0..mant_bits+2: the exact
// float sum lands on, just off and exactly between two 16-bit values, so the
// narrowing's round-to-nearest-even is tested on ties both ways; plus
// infinities, NaNs and subnormals mixed in, three sources, min and max, and
// odd lengths at odd offsets.
TEST(ReduceHalfKernels, RoundingTiesAndSpecialsMatchReference) {
  std::mt19937 rng(11);
  for (const Half& h : kHalves) {
    const int exp_shift = h.mant_bits;
    const uint16_t exp_mask = static_cast<uint16_t>(h.inf);
    auto random_pair = [&](uint16_t* a, uint16_t* b) {
      *a = static_cast<uint16_t>(rng());
      const int ea = (*a & exp_mask) >> exp_shift;
      const int eb = std::max(0, ea - static_cast<int>(rng() % static_cast<unsigned>(h.mant_bits + 3)));
      *b = static_cast<uint16_t>((rng() & ~exp_mask & 0xffffu) | (static_cast<unsigned>(eb) << exp_shift));
      switch (rng() % 16) {  // specials now and then
        case 0: *b = h.inf; break;
        case 1: *b = h.qnan; break;
        case 2: *b = h.snan; break;
        case 3: *b = static_cast<uint16_t>(rng() % 4);  // subnormal or zero
        default: break;
      }
    };
    for (size_t count : {size_t{1}, size_t{15}, size_t{31}, size_t{33}, size_t{1001}, size_t{20011}}) {
      std::vector<uint16_t> a(count + 1), b(count + 1), c(count + 1);
      for (size_t i = 1; i <= count; ++i) {
        random_pair(&a[i], &b[i]);
        c[i] = static_cast<uint16_t>(rng() % 4 == 0 ? h.narrow(-h.widen(a[i])) : rng() & 0x8007u);
      }
      for (ReduceOp op : kOps) {
        for (int n : {2, 3}) {
          const void* srcs_arr[3] = {a.data() + 1, b.data() + 1, c.data() + 1};
          std::vector<const void*> srcs(srcs_arr, srcs_arr + n);
          std::vector<char> want(count * 2), got(count * 2);
          Reference(h.dtype, op, want.data(), srcs, count);
          for (KernelIsa isa : Isas()) {
            ReduceNWith(isa, h.dtype, op, got.data(), srcs.data(), n, count);
            ExpectSame(h.dtype, want, got, count,
                       std::string(IsaName(isa)) + " " + DataTypeName(h.dtype) + " " + ReduceOpName(op) +
                           " n=" + std::to_string(n) + " count=" + std::to_string(count));
          }
        }
      }
    }
  }
}

// --- Conversions. ---

TEST(ReduceConversions, BFloat16RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-8f), 0x3f80);                // halfway, even stays
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82);      // halfway, odd rounds up
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);     // above halfway
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBFloat16(3.4e38f), 0x7f80);  // rounds past the largest finite bfloat16
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  const uint16_t nan = FloatToBFloat16(std::bit_cast<float>(0x7f800001u));  // a NaN whose payload is in the low bits
  EXPECT_GT(nan & 0x7fff, 0x7f80);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    if ((v & 0x7fff) > 0x7f80) continue;
    ASSERT_EQ(FloatToBFloat16(BFloat16ToFloat(v)), v) << h;
  }
}

TEST(ReduceConversions, Float16RoundTripsAndRounds) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    const float f = Float16ToFloat(v);
    if ((v & 0x7fff) > 0x7c00) {
      ASSERT_TRUE(std::isnan(f)) << h;
      continue;
    }
    ASSERT_EQ(FloatToFloat16(f), v) << h;
  }
  EXPECT_EQ(Float16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Float16ToFloat(0x0001), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(Float16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(FloatToFloat16(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToFloat16(65520.0f), 0x7c00);  // halfway to 65536: to even, which is infinity
  EXPECT_EQ(FloatToFloat16(1.0f + 0x1p-11f), 0x3c00);                // halfway, even stays
  EXPECT_EQ(FloatToFloat16(1.0f + 0x1p-10f + 0x1p-11f), 0x3c02);     // halfway, odd rounds up
  EXPECT_EQ(FloatToFloat16(0x1p-25f), 0x0000);                       // halfway to the smallest subnormal
  EXPECT_EQ(FloatToFloat16(0x1p-25f + 0x1p-30f), 0x0001);
  EXPECT_EQ(FloatToFloat16(-1e-30f), 0x8000);
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t HardwareToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float HardwareFromHalf(uint16_t h) { return _cvtsh_ss(h); }

// The software conversions agree bit for bit with F16C, which the vector
// kernels use where the CPU has it.
TEST(ReduceConversions, Float16MatchesF16c) {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & bit_F16C)) GTEST_SKIP() << "CPU without F16C";
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    ASSERT_EQ(std::bit_cast<uint32_t>(Float16ToFloat(v)), std::bit_cast<uint32_t>(HardwareFromHalf(v))) << h;
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 200000; ++i) {
    // Random bit patterns hit every exponent, NaN payloads and subnormals;
    // the narrow band around the half range is sampled densely too.
    uint32_t bits = static_cast<uint32_t>(rng());
    if (i % 2) bits = (bits & 0x807fffffu) | ((100u + rng() % 46u) << 23);  // exponents near half's range
    const float f = std::bit_cast<float>(bits);
    ASSERT_EQ(FloatToFloat16(f), HardwareToHalf(f)) << std::hex << bits;
  }
}
#endif

}  // namespace
}  // namespace ember::collective
