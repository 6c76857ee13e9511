// readiness_emu.cpp: the CUDA kernels of format readiness (readiness_kernels.cuh), compiled by the host compiler
// with cuda_emu.h in front and run on the CPU, each CUDA thread a host thread. Tests only
// (torch.ops.amp_inspect._format_readiness_emulated, tests/test_readiness_emu.py): it proves the kernels' tiling,
// butterflies, block reductions and atomics on every CI run, without a GPU. The host side is the CUDA op's own
// (prepare_readiness_call, plan_readiness_kernels, readiness_kernels::run_readiness); only the backend differs
// (common/emulated_op.h): host memory, a chosen work chunk and number of blocks, emulated launches. Built into the
// test-only library amp_inspect._C_emu.
#include <torch/csrc/stable/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "readiness/readiness_call.h"
// The emulation and the kernels come last: the emulation shim's macros must not meet the torch headers.
#include "common/emulated_op.h"
#include "readiness/readiness_kernels.cuh"

namespace amp_inspect {
namespace {

constexpr const char* kEmulatedOp = "amp_inspect._format_readiness_emulated: ";

std::tuple<Tensor, Tensor, Tensor> format_readiness_emulated(std::vector<Tensor> tensors, std::vector<int64_t> recipes,
                                                             std::optional<Tensor> tensor_amax, int64_t chunk_tasks,
                                                             int64_t blocks) {
  check_emulated_on_cpu(kEmulatedOp, tensors, "tensor ");
  AMPI_CHECK(chunk_tasks > 0, kEmulatedOp, "chunk_tasks must be positive, got ", chunk_tasks);
  ReadinessKernelCall k;
  k.call = prepare_readiness_call(tensors, recipes, tensor_amax);
  plan_readiness_kernels(k, Device(DeviceType::CPU), chunk_tasks);
  run_emulated(blocks, [&](cuda_emu::Backend& backend) { readiness_kernels::run_readiness(k.plan, backend); });
  return k.out.returned();
}

// How many (q, s) cases readiness.h's grid_quotient gets other than the float64 division q / s, over all of them
// for an element grid of `mbits` mantissa bits (grid_quotient's comment says why these are all): q every integer
// of 1 + mbits bits, s every float32 in [1, 2) (2^23 mantissas), with r = fl64(1 / s). Negative q mirror these.
int64_t readiness_quotient_mismatches(int64_t mbits) {
  AMPI_CHECK(mbits >= 1 && mbits <= 3, kEmulatedOp, "mbits must be 1, 2 or 3 (E2M1, E5M2, E4M3), got ", mbits);
  int64_t mismatches = 0;
  for (uint32_t mantissa = 0; mantissa <= kMantissaMask32; ++mantissa) {
    const double s = float32_bits_to_double(kFloatOneBits | mantissa);
    const double r = 1.0 / s;
    for (int64_t m = int64_t{1} << mbits; m < int64_t{2} << mbits; ++m) {
      const double q = static_cast<double>(m);
      mismatches += grid_quotient(q, s, r) != q / s;
    }
  }
  return mismatches;
}

// How many (a, b) pairs readiness.h's divide_by_reciprocal, fl32(a * fl64(1 / b)), gets other than the float32
// division a / b (the CPU's, IEEE's: both normal, and every quotient here normal). Its proof is written in
// readiness.h; this checks it where it is tightest, near the midpoints fl32 rounds at: for every b in [1, 2) (2^23
// mantissas) and `midpoints_per_b` midpoints M in [1, 2) (odd multiples of 2^-24, drawn by a hash of b), the float32
// a nearest M * b and its two neighbours (a / b within an ulp or so of M). Then `random_pairs` pairs of random
// float32 mantissas and exponents (quotients from 2^-100 to 2^100; `seed` chooses them). `float32_reciprocal`
// plants a bug (fl32(a * fl32(1 / b)), a rounding too many) that the check must find.
uint64_t next_random(uint64_t& state) {  // splitmix64
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int64_t readiness_divide_mismatches(int64_t midpoints_per_b, int64_t random_pairs, int64_t seed,
                                    bool float32_reciprocal) {
  AMPI_CHECK(midpoints_per_b >= 0 && random_pairs >= 0, kEmulatedOp, "counts must be nonnegative");
  const auto mismatch = [&](float a, float b) -> int64_t {
    const double r = 1.0 / static_cast<double>(b);
    const float got = float32_reciprocal ? a * static_cast<float>(r) : divide_by_reciprocal(a, r);
    return float32_as_bits(got) != float32_as_bits(a / b);
  };
  int64_t mismatches = 0;
  uint64_t state = static_cast<uint64_t>(seed);
  for (uint32_t mantissa = 0; mantissa <= kMantissaMask32 && midpoints_per_b > 0; ++mantissa) {
    const float b = bits_as_float32(kFloatOneBits | mantissa);
    for (int64_t t = 0; t < midpoints_per_b; ++t) {
      // M = (2k + 1) 2^-24, k in [2^23, 2^24): a midpoint of float32's binade [1, 2).
      const uint64_t k = kImplicitBit32 | (next_random(state) & kMantissaMask32);
      const double midpoint = static_cast<double>(2 * k + 1) * 0x1p-24;
      const float a = static_cast<float>(midpoint * static_cast<double>(b));  // M b exact in float64, rounded once
      const uint32_t a_bits = float32_as_bits(a);
      for (uint32_t near = a_bits - 1; near <= a_bits + 1; ++near) mismatches += mismatch(bits_as_float32(near), b);
    }
  }
  constexpr int kExponentSpread = 100;  // |log2| of a random pair's operands: quotients stay far inside the normal range
  for (int64_t i = 0; i < random_pairs; ++i) {
    const uint64_t word = next_random(state);
    const auto operand = [](uint64_t bits) {
      const int32_t exponent = static_cast<int32_t>((bits >> kMantissaBits32) % (kExponentSpread + 1)) - kExponentSpread / 2;
      return bits_as_float32((static_cast<uint32_t>(exponent + kExponentBias32) << kMantissaBits32) |
                             (static_cast<uint32_t>(bits) & kMantissaMask32));
    };
    mismatches += mismatch(operand(word), operand(word >> 32));
  }
  return mismatches;
}

// How many blocks readiness.h's nvfp4_block_scale_bits (with total = fl32(d * s_b) a normal float32, where the
// kernels take it) gives another scale than nvfp4_scale, for the decode scale `decode_bits` (a normal float32) and
// every amax_b with biased float32 exponent field in [first_field, last_field] (each 2^23 mantissas), from 6 * 2^-126
// up. Also returns, second, how many of those blocks took the lane path (a total that is a normal float32).
std::tuple<int64_t, int64_t> readiness_nvfp4_scale_mismatches(int64_t decode_bits, int64_t first_field,
                                                              int64_t last_field) {
  AMPI_CHECK(decode_bits >= kImplicitBit32 && decode_bits < kInfBits32, kEmulatedOp,
             "decode_bits must be a normal float32's, got ", decode_bits);
  AMPI_CHECK(first_field >= 1 && last_field <= 254 && first_field <= last_field, kEmulatedOp,
             "exponent fields must lie in [1, 254]");
  const uint32_t decode = static_cast<uint32_t>(decode_bits);
  const double decode_reciprocal = 1.0 / static_cast<double>(bits_as_float32(decode));
  int64_t mismatches = 0;
  int64_t lane_path = 0;
  const uint32_t first = static_cast<uint32_t>(first_field) << kMantissaBits32;
  const uint32_t end = static_cast<uint32_t>(last_field + 1) << kMantissaBits32;
  for (uint32_t amax = first < kNvfp4ExactAmaxBits ? kNvfp4ExactAmaxBits : first; amax < end; ++amax) {
    const uint32_t s_b = nvfp4_block_scale_bits(amax, decode_reciprocal);
    const uint32_t total = float32_as_bits(
        static_cast<float>(static_cast<double>(bits_as_float32(decode)) * static_cast<double>(bits_as_float32(s_b))));
    if (total < kImplicitBit32 || total >= kInfBits32) continue;  // the kernels take nvfp4_scale's path
    ++lane_path;
    const BlockScale want = nvfp4_scale(amax, decode);
    mismatches += want.all_zero || want.scale != static_cast<double>(bits_as_float32(total)) ||
                  want.scale_flushed != (s_b < kE4M3MinNormalBits);
  }
  return {mismatches, lane_path};
}

}  // namespace
}  // namespace amp_inspect

// Tests only: the CUDA kernels' source run on the CPU, with the work chunk (warp tasks per chunk; the GPU uses
// kReadinessChunkTasks) and the number of blocks chosen by the caller (blocks <= 0: as many as chunks, at most
// 4). And the checks of readiness.h's grid_quotient, divide_by_reciprocal and nvfp4_block_scale_bits. A fragment: _C defines the library.
STABLE_TORCH_LIBRARY_FRAGMENT(amp_inspect, m) {
  m.def(
      "_format_readiness_emulated(Tensor[] tensors, int[] recipes, Tensor? tensor_amax, int chunk_tasks, "
      "int blocks) -> (Tensor counts, Tensor sums, Tensor amax)");
  m.def("_readiness_quotient_mismatches(int mbits) -> int");
  m.def("_readiness_divide_mismatches(int midpoints_per_b, int random_pairs, int seed, bool float32_reciprocal) -> int");
  m.def("_readiness_nvfp4_scale_mismatches(int decode_bits, int first_field, int last_field) -> (int, int)");
}

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CPU, m) {
  m.impl("_format_readiness_emulated", TORCH_BOX(&amp_inspect::format_readiness_emulated));
}

// An op without tensor arguments is served by the CompositeExplicitAutograd kernel.
STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CompositeExplicitAutograd, m) {
  m.impl("_readiness_quotient_mismatches", TORCH_BOX(&amp_inspect::readiness_quotient_mismatches));
  m.impl("_readiness_divide_mismatches", TORCH_BOX(&amp_inspect::readiness_divide_mismatches));
  m.impl("_readiness_nvfp4_scale_mismatches", TORCH_BOX(&amp_inspect::readiness_nvfp4_scale_mismatches));
}
