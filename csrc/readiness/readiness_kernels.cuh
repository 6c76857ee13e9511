// readiness_kernels.cuh: the CUDA kernels of amp_inspect::format_readiness and the host logic that launches
// them, written once for two compilers (as tensor_stats_kernels.cuh is):
//   - nvcc, through readiness_cuda.cu: the kernels that run on the GPU;
//   - the host C++ compiler, through readiness_emu.cpp with cuda_emu.h in front: the same source run on the
//     CPU, each CUDA thread a real host thread (tests only: tests/test_readiness_emu.py).
// The recipes' rules (block scales, element casts) are csrc/readiness.h's, the code the CPU kernel runs.
//
// One read of the data. Each lane loads 8 contiguous elements of a row (readiness.h: the geometry) and
// keeps them in registers. Their finite amax, maxed over 2, 4 and 16 neighbouring lanes (a butterfly of
// __shfl_xor_sync), is the amax of the lane's 16-, 32- and 128-element block; then every recipe asked runs its
// what-if quantization on the elements still in registers: ALU work, no second read. Counts and sums stay in
// registers per thread (uint32 counts, float64 sums) until the block leaves a tensor, then one block
// reduction (warp shuffles, one shared exchange) adds them to the outputs with one global atomic per column
// (int64 counts, float64 sums): no workspace and no finalize kernel.
//
// The tensor amax. Tensor-scaled recipes (fp8_*_tensor, nvfp4) need it before the pass: the given tensor_amax
// (delayed scaling), copied to the amax output, or, without one, a first small kernel that measures the finite
// amax into the amax output (the only second read, and only when such a recipe is asked). Without a
// tensor-scaled recipe the main pass measures the amax itself, from the amaxes it computes anyway.
//
// One kernel per input dtype (fp32, fp16, bf16) and recipe set, each register-allocated for both: every recipe
// (unrolled in table order with compile-time block sizes and rules, each skipped by a branch uniform over the grid
// when not asked), each recipe alone (a one-recipe call runs only its code, and only the amax levels it needs),
// and none.
#pragma once

#include <cstdint>

#include "common/dtype_load.cuh"  // also the namespace that keeps the GPU build's symbols apart from the emulation's
#include "common/numerics.h"
#include "common/warp_reduce.cuh"
#include "readiness/readiness.h"

namespace amp_inspect {
namespace readiness_kernels {
inline namespace AMPI_KERNELS_NAMESPACE {

constexpr int kThreads = 256;
static_assert(kReadinessWarpLanes == kWarpSize, "readiness.h tiles rows by a warp's lanes (common/warp_reduce.cuh)");
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kGroup = kReadinessGroupElems;
// 2 blocks of 256 threads per SM: up to 128 registers per thread (the per-recipe counters alone are ~50).
constexpr int kMinBlocksPerSm = 2;
constexpr int kVectorBytes = 16;
constexpr int kRecipeCount = kReadinessMaxRecipes;
// A block flushes a tensor's counts at least every this many tasks, so that per-thread counts never wrap: a
// warp then does at most 8191 tasks per flush, so each lane counts at most 8 * 8191 = 65528 elements of any kind
// (numel, nonzero, flushed, saturated) and 8191 blocks: two counts share a uint32, 16 bits each (the every-recipe
// kernel's counters are 18 registers, not 35, which is what keeps it from spilling).
constexpr int64_t kMaxWarpTasksPerFlush = 8191;
static_assert(kReadinessGroupElems * kMaxWarpTasksPerFlush < (1 << 16), "a lane's count per flush fits 16 bits");
constexpr int64_t kMaxFlushTasks = int64_t{kThreads / kReadinessWarpLanes} * kMaxWarpTasksPerFlush;
// Lane offsets of the amax butterfly: after offset 1 a lane holds its 16-element block's amax, after 2 its
// 32-element block's, after 4 and 8 its 128-element block's.
constexpr int kLanesPerBlock16 = 16 / kGroup;
constexpr int kLanesPerBlock32 = 32 / kGroup;
constexpr int kLanesPerBlock128 = 128 / kGroup;

// The merged counts. Word order: numel, nonzero, nonfinite, then per table recipe r flushed, saturated, blocks,
// scale_flushed (the op's counts columns, but in table order; flush maps them onto the asked slots).
constexpr int kFixedWords = kReadinessFixedCounts;
constexpr int kWordsPerRecipe = kReadinessCountsPerRecipe;
constexpr int kWords = kFixedWords + kWordsPerRecipe * kRecipeCount;
constexpr int kNumel = 0, kNonzero = 1, kNonfinite = 2;
constexpr int kFlushed = 0, kSaturated = 1, kBlocks = 2, kScaleFlushed = 3;  // within a recipe's words
constexpr int kSums = 1 + kRecipeCount;  // sq_signal, then sq_error per table recipe
// The per-thread counters pack two counts per word (kMaxWarpTasksPerFlush): numel + 2^16 * nonzero, then per recipe
// flushed + 2^16 * saturated and blocks + 2^16 * scale_flushed. Nonfinite elements are rare: a lane holding some adds
// them to the output at once (one global atomic), keeping a register free for the common path.
constexpr int kCounterFixedWords = 1;
constexpr int kNumelAndNonzero = 0;
constexpr int kCounterWordsPerRecipe = 2;
constexpr int kCounterWords = kCounterFixedWords + kCounterWordsPerRecipe * kRecipeCount;
constexpr int kFlushedAndSaturated = 0, kBlocksAndScaleFlushed = 1;
constexpr uint32_t kHighUnit = 1u << 16;  // the second count of a word

struct Counters {
  uint32_t n[kCounterWords];
  double sums[kSums];
  uint32_t amax_bits;  // float32 bits of the largest finite |x| seen

  __device__ __forceinline__ void clear() {
#pragma unroll
    for (int k = 0; k < kCounterWords; ++k) n[k] = 0;
#pragma unroll
    for (int k = 0; k < kSums; ++k) sums[k] = 0.0;
    amax_bits = 0;
  }
};

// What a tensor's amax is, for a launch.
enum AmaxMode : int32_t {
  kAmaxRead = 0,     // the amax output already holds it (given, or measured by amax_kernel): read it
  kAmaxMeasure = 1,  // no tensor-scaled recipe asked and none given: the main pass writes it
};

// Everything a launch reads, passed by value (the driver copies it into the constant bank).
struct ReadinessParams {
  int64_t num_views;
  int64_t first_chunk;  // this launch's chunks [first_chunk, first_chunk + num_chunks), of its views
  int64_t num_chunks;
  int64_t chunk_tasks;
  int32_t slot_of_recipe[kRecipeCount];  // output slot of each table recipe, -1 where not asked
  int32_t count_columns;
  int32_t sum_columns;
  int32_t amax_mode;
  int64_t* counts;
  double* sums;
  float* amax;
  ReadinessKernelView views[kReadinessInlineViews];
};

// ---- loading ----

// The storage word of each dtype (Storage) and its float32 bits (stored_as_f32_bits): common/dtype_load.cuh.

// The float32 bits of elements [at, at + count) of a row, count <= kGroup; the rest +0. A full, 16-byte
// aligned group is read with 16-byte loads through the read-only path (one for fp16/bf16, two for fp32);
// anything else (a row's short last group, rows whose length breaks the alignment) element by element.
template <int kDtype>
__device__ __forceinline__ void load_group(const void* data, int64_t at, int count, uint32_t (&bits)[kGroup]) {
  using W = typename Storage<kDtype>::type;
  const W* p = static_cast<const W*>(data) + at;
  constexpr int kPerVector = kVectorBytes / static_cast<int>(sizeof(W));
  if (count == kGroup && reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0) {
    const uint4* v = reinterpret_cast<const uint4*>(p);
#pragma unroll
    for (int l = 0; l < kGroup / kPerVector; ++l) {
      const uint4 words = __ldg(v + l);
      const uint32_t w[4] = {words.x, words.y, words.z, words.w};
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if constexpr (sizeof(W) == 4) {
          bits[l * kPerVector + c] = stored_as_f32_bits<kDtype>(w[c]);
        } else {
          bits[l * kPerVector + 2 * c] = stored_as_f32_bits<kDtype>(static_cast<W>(w[c] & 0xFFFFu));
          bits[l * kPerVector + 2 * c + 1] = stored_as_f32_bits<kDtype>(static_cast<W>(w[c] >> 16));
        }
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < kGroup; ++k) bits[k] = k < count ? stored_as_f32_bits<kDtype>(__ldg(p + k)) : 0u;
  }
}

// ---- warp reductions ----

// max_u32, warp_sum and warp_max: common/warp_reduce.cuh.

// ---- one task: a warp's 256 elements (or fewer, of packed short rows) ----

// The recipe set a kernel is compiled for, one bit per table recipe: the library instantiates every recipe (kAllRecipes,
// each recipe then skipped at run time where not asked), each recipe alone and none (run_readiness picks one by the
// call's recipes), so that a one-recipe call runs a kernel holding only that recipe's code, registers and amaxes.
constexpr int kAllRecipes = (1 << kRecipeCount) - 1;
AMPI_HD constexpr bool recipe_in(int mask, int r) { return ((mask >> r) & 1) != 0; }
// Whether a recipe of `mask` has blocks of at least `block` elements (the butterfly levels it needs), or the rule.
AMPI_HD constexpr bool mask_needs_block(int mask, int block) {
  for (int r = 0; r < kRecipeCount; ++r) {
    if (recipe_in(mask, r) && kRecipes[r].block >= block) return true;
  }
  return false;
}
AMPI_HD constexpr bool mask_has_rule(int mask, int rule) {
  for (int r = 0; r < kRecipeCount; ++r) {
    if (recipe_in(mask, r) && kRecipes[r].scale == rule) return true;
  }
  return false;
}
// The kernel a call runs: its one recipe alone, none, or every recipe.
inline int kernel_recipe_mask(const ReadinessLaunchPlan& plan) {
  if (plan.num_recipes == 0) return 0;
  if (plan.num_recipes > 1) return kAllRecipes;
  for (int r = 0; r < kRecipeCount; ++r) {
    if (plan.slot_of_recipe[r] >= 0) return 1 << r;
  }
  return kAllRecipes;
}

// Calls fn(RecipeIndex<r>{}) for every recipe r of kMask, in table order: r is a compile-time constant in fn,
// so each recipe's block size, rule and element grid are constants of its own code and its counters are
// registers (a runtime loop over recipes would index the counters, sending them to local memory).
template <int R>
struct RecipeIndex {
  static constexpr int value = R;
};
// Bench-only (bench/sass_per_element.py --readiness): 1 compiles the common path alone (judge_element_fast; no
// NaN/Inf or float32 subnormal in the lane), whose length it counts. The library's builds compile both paths.
#if !defined(AMPI_READINESS_FAST_PATH_ONLY)
#define AMPI_READINESS_FAST_PATH_ONLY 0
#endif
template <int kMask, int R = 0, class Fn>
__device__ __forceinline__ void for_each_recipe(Fn&& fn) {
  if constexpr (R < kRecipeCount) {
    if constexpr (recipe_in(kMask, R)) fn(RecipeIndex<R>{});
    for_each_recipe<kMask, R + 1>(fn);
  }
}

// Whether a recipe of `mask` casts to an 8-bit element format (E4M3, E5M2): those take the in-range lane path.
AMPI_HD constexpr bool mask_has_8bit_element(int mask) {
  for (int r = 0; r < kRecipeCount; ++r) {
    if (recipe_in(mask, r) && kElementGrids[kRecipes[r].element].mbits >= 2) return true;
  }
  return false;
}

// cast_abs_bits's rounding of a float32 v (bits, either sign) whose |v| lies in [2^emin, clip_bits(g)): to g's
// mantissa on the bits, ties to even (a carry moves into the exponent; |v| below the clip rounds to at most max_E).
template <int kMbits>
__device__ __forceinline__ uint32_t round_in_range(uint32_t v) {
  constexpr int kShift = kMantissaBits32 - kMbits;
  return (v + ((1u << (kShift - 1)) - 1u) + ((v >> kShift) & 1u)) & ~((1u << kShift) - 1u);
}

// The max of `value` over the aligned group of `lanes` lanes this lane is in, from groups of `from` lanes
// (powers of two): every lane shuffles at every offset (the warp stays converged, no loop), and a lane keeps
// only its own row's partners (offsets < lanes; a row shorter than a block is its one block).
template <int kFrom, int kTo>
__device__ __forceinline__ uint32_t group_max_to(uint32_t value, int lanes) {
#pragma unroll
  for (int offset = kFrom; offset < kTo; offset *= 2) {
    const uint32_t other = __shfl_xor_sync(0xFFFFFFFFu, value, offset);
    value = offset < lanes ? max_u32(value, other) : value;
  }
  return value;
}

// 1 / d for d a power of two 2^-X (|X| <= 1022), exactly, on the bits: 2^X.
__device__ __forceinline__ double power_of_two_reciprocal(double d) {
  return bits_as_float64((uint64_t{2 * kExponentBias64} << kMantissaBits64) - float64_as_bits(d));
}

// Where a warp's task lies: its row group (a row of long rows, a pack of short ones) and its tile within the row.
// measure_piece advances it by the warp count without a division per task.
struct TaskPlace {
  int64_t row_group;
  int64_t tile;
};

// A tensor-scaled recipe's scale, the same for every block of a piece (one tensor): computed once per piece, not per
// lane and task (a float32 division and a float64 reciprocal each), and read from shared memory.
struct PieceScale {
  BlockScale scale;
  double dequant;  // what cast_element_fast multiplies or corrects by: 1 / s for the fp32 rules
};

// Shared scratch of a block: per warp, every counter word, every sum and the amax (the block reduction), and the
// tensor-scaled recipes' scales of the piece (indexed by table recipe; only those are written).
struct FlushScratch {
  uint32_t words[kWarps][kWords];
  double sums[kWarps][kSums];
  uint32_t amax[kWarps];
  PieceScale tensor_scales[kRecipeCount];
  // NVFP4's decode scale of the piece and its reciprocal fl64(1 / d) (0 where d is no normal float32), read per lane
  // by the every-recipe kernel (no register held through the task loop: that register is what keeps its fp16 build
  // from spilling); the nvfp4 kernel keeps them in registers.
  uint32_t nvfp4_decode_bits;
  double nvfp4_decode_reciprocal;
};

// NVFP4's decode scale's reciprocal for nvfp4_block_scale_bits: fl64(1 / d) where d is a normal float32, else 0
// (such a piece takes nvfp4_scale's path).
__device__ __forceinline__ double nvfp4_decode_reciprocal(uint32_t decode_bits) {
  return decode_bits >= kImplicitBit32 ? 1.0 / static_cast<double>(bits_as_float32(decode_bits)) : 0.0;
}

template <int kDtype, int kMask>
__device__ __forceinline__ void measure_task(const ReadinessParams& p, const ReadinessKernelView& view,
                                             const TaskPlace& place, int lane_shift,
                                             uint32_t nvfp4_decode_bits, double nvfp4_decode_reciprocal,
                                             const FlushScratch& scratch, Counters& c) {
  const int lane = threadIdx.x % kWarpSize;
  const int lanes = view.lanes_per_row;
  const int64_t row = place.row_group * view.rows_per_task + (lane >> lane_shift);
  const int64_t group = place.tile * kReadinessTileGroups + (lane & (lanes - 1));  // this lane's group in its row
  const int64_t first = group * kGroup;                                            // its first element in the row
  int count = 0;
  if (row < view.rows && first < view.row_length) {
    const int64_t left = view.row_length - first;
    count = left < kGroup ? static_cast<int>(left) : kGroup;
  }
  uint32_t bits[kGroup];
  load_group<kDtype>(view.data, row * view.row_length + first, count, bits);

  // Per lane, not per element where it can be: the finite amax, the nonzero count ((a + 2^31 - 1) >> 31 is 1 for
  // a > 0) and whether a float32 subnormal is present (min of a - 1: 0 wraps to the top). A lane holding NaN or Inf
  // (max >= Inf's bits; rare) counts them and replaces them by +0 in the registers: they take no part in any amax
  // or sum, and a zero adds nothing to any recipe's counts or error, so the recipes below need no test per element.
  uint32_t lane_amax = 0;
  uint32_t nonzero = 0;
  uint32_t below_normal = ~0u;
#pragma unroll
  for (int k = 0; k < kGroup; ++k) {
    const uint32_t a = bits[k] & kAbsMask32;
    lane_amax = max_u32(lane_amax, a);
    nonzero += (a + kAbsMask32) >> 31;
    if constexpr (kDtype != kFloat16 || mask_has_8bit_element(kMask)) {
      below_normal = below_normal < a - 1u ? below_normal : a - 1u;
    }
  }
  if (!AMPI_READINESS_FAST_PATH_ONLY && lane_amax >= kInfBits32) {
    lane_amax = 0;
    nonzero = 0;
    uint32_t nonfinite = 0;
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      const uint32_t a = bits[k] & kAbsMask32;
      const bool finite = is_finite32(a);
      nonfinite += !finite;
      nonzero += finite && a != 0u;
      bits[k] = finite ? bits[k] : 0u;
      lane_amax = max_u32(lane_amax, finite ? a : 0u);
    }
    atomicAdd(reinterpret_cast<unsigned long long*>(p.counts + view.out_row * p.count_columns + kNonfinite),
              static_cast<unsigned long long>(nonfinite));
  }
  c.n[kNumelAndNonzero] += static_cast<uint32_t>(count) + nonzero * kHighUnit;
  c.amax_bits = max_u32(c.amax_bits, lane_amax);
  // A float32 subnormal x (a in [1, 2^23 - 1]; never a float16 value): the recipes take readiness.h's exact
  // judge_element and the squares the exact widening on the bits.
  const bool has_subnormal = kDtype != kFloat16 && below_normal < kImplicitBit32 - 1u;
  if (AMPI_READINESS_FAST_PATH_ONLY || !has_subnormal) {
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      const double x = static_cast<double>(bits_as_float32(bits[k]));  // exact: x is 0 or a normal float32
      c.sums[0] += x * x;
    }
  } else {
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      const double x = float32_bits_to_double(bits[k]);
      c.sums[0] += x * x;
    }
  }
  if constexpr (kMask == 0) return;
  // Block amaxes, only the levels the kernel's recipes use: a row of `lanes` lanes is never left (offsets <
  // lanes), and a row shorter than a block is its one block, so capping at `lanes` is exactly "the short last
  // block is its own block".
  uint32_t amax16 = 0, amax32 = 0, amax128 = 0;
  if constexpr (mask_needs_block(kMask, 16)) amax16 = group_max_to<1, kLanesPerBlock16>(lane_amax, lanes);
  if constexpr (mask_needs_block(kMask, 32)) amax32 = group_max_to<kLanesPerBlock16, kLanesPerBlock32>(amax16, lanes);
  if constexpr (mask_needs_block(kMask, 128)) {
    amax128 = group_max_to<kLanesPerBlock32, kLanesPerBlock128>(amax32, lanes);
  }

  const bool tensor_first = count > 0 && row == 0 && group == 0;  // counts the tensor-scaled recipes' block
  for_each_recipe<kMask>([&](auto recipe) {
    constexpr int r = decltype(recipe)::value;
    constexpr RecipeSpec spec = kRecipes[r];
    constexpr ElementGrid grid = kElementGrids[spec.element];
    static_assert(spec.block == 0 || spec.block == 16 || spec.block == 32 || spec.block == 128,
                  "the butterfly measures 16-, 32- and 128-element blocks");
    if constexpr (kMask != (1 << r)) {
      if (p.slot_of_recipe[r] < 0) return;  // uniform over the grid
    }
    uint32_t* w = c.n + kCounterFixedWords + kCounterWordsPerRecipe * r;
    if constexpr (spec.scale == kScaleNvfp4) {
      // NVFP4's lane path, without a float32 division: where the lane holds no float32 subnormal, its block's amax is
      // at least 6 * 2^-126 and the decode scale d a normal float32, s_b comes from nvfp4_block_scale_bits (d's
      // reciprocal taken once per piece) and, where total = fl32(d * s_b) is a normal float32, every v = fl32(x /
      // total) is divide_by_reciprocal's fl32(x * fl64(1 / total)), one reciprocal per lane (readiness.h proves
      // both equal to the divisions). Anything else (zero or tiny blocks, a subnormal or zero total) takes the
      // general path below, nvfp4_scale's.
      const uint32_t decode = kMask == kAllRecipes ? scratch.nvfp4_decode_bits : nvfp4_decode_bits;
      const double decode_reciprocal = kMask == kAllRecipes ? scratch.nvfp4_decode_reciprocal : nvfp4_decode_reciprocal;
      if (AMPI_READINESS_FAST_PATH_ONLY || (!has_subnormal && amax16 >= kNvfp4ExactAmaxBits && decode >= kImplicitBit32)) {
        const uint32_t s_b = nvfp4_block_scale_bits(amax16, decode_reciprocal);
        // Exact in float64 (24 bits times 4), then one rounding: fl32(d * s_b).
        const float total = static_cast<float>(static_cast<double>(bits_as_float32(decode)) *
                                               static_cast<double>(bits_as_float32(s_b)));
        const uint32_t total_bits = float32_as_bits(total);
        if (AMPI_READINESS_FAST_PATH_ONLY || (total_bits >= kImplicitBit32 && total_bits < kInfBits32)) {
          const bool block_first = count > 0 && group % (spec.block / kGroup) == 0;
          w[kBlocksAndScaleFlushed] += block_first ? 1u + (s_b < kE4M3MinNormalBits ? kHighUnit : 0u) : 0u;
          const double dequant = static_cast<double>(total);
          const double reciprocal = 1.0 / dequant;
          constexpr uint32_t kClip = clip_bits(grid);
          uint32_t nonzero_casts = 0;
          uint32_t unsaturated = 0;
#pragma unroll
          for (int k = 0; k < kGroup; ++k) {
            const float x = bits_as_float32(bits[k]);
            const uint32_t v_abs = float32_as_bits(divide_by_reciprocal(x, reciprocal)) & kAbsMask32;
            const uint32_t q_abs = cast_abs_bits(v_abs, grid);
            const double q = static_cast<double>(bits_as_float32(q_abs | (bits[k] & kSignMask32)));
            const double error = static_cast<double>(x) - q * dequant;  // q * total: exact (2 bits times 24)
            nonzero_casts += (q_abs + kAbsMask32) >> 31;
            unsaturated += (v_abs - kClip) >> 31;
            c.sums[1 + r] += error * error;
          }
          w[kFlushedAndSaturated] += (nonzero - nonzero_casts) + (kGroup - unsaturated) * kHighUnit;
          return;
        }
      }
    }
    BlockScale scale;
    bool block_first;  // this lane starts its block (a block exists where its first group does)
    if constexpr (spec.block == 0) {
      scale = scratch.tensor_scales[r].scale;
      block_first = tensor_first;
    } else {
      const uint32_t block_amax = spec.block == 16 ? amax16 : (spec.block == 32 ? amax32 : amax128);
      scale = block_scale(spec.scale, grid, block_amax, spec.scale != kScaleNvfp4  ? 0u
                                                          : kMask == kAllRecipes ? scratch.nvfp4_decode_bits
                                                                                 : nvfp4_decode_bits);
      block_first = count > 0 && group % (spec.block / kGroup) == 0;
    }
    w[kBlocksAndScaleFlushed] += block_first ? 1u + (scale.scale_flushed ? kHighUnit : 0u) : 0u;
    // readiness.h's cast_element_fast (judge_element_fast's float32 where the rule says fl32 and integer cast;
    // dequantized by a multiplication where the scale is a power of two or NVFP4's total, the fp32 rules' q / s by
    // grid_quotient from one reciprocal per lane) gives judge_element's verdict where no x is a float32 subnormal
    // and the scale is a normal float32: almost every lane. The others take judge_element. The choice is per lane
    // (8 elements), as the CPU kernel's is per unit; both are exact. Counted per lane, not per element: the
    // flushed are the lane's nonzero elements less its nonzero casts (a nonzero cast has a nonzero x), the
    // saturated its 8 elements less those with |v| < clip (the padding's zeros among them).
    if (AMPI_READINESS_FAST_PATH_ONLY || (!has_subnormal && scale_is_normal_float(scale))) {
      constexpr bool kDivide = spec.scale == kScaleNvfp4;  // v = x / total
      constexpr bool kPowerOfTwo = spec.scale == kScaleE8M0Floor || spec.scale == kScaleE8M0Rceil;
      constexpr bool kFp32Rule = !kDivide && !kPowerOfTwo;
      constexpr uint32_t kClip = clip_bits(grid);
      double dequant;
      if constexpr (spec.block == 0) {
        dequant = scratch.tensor_scales[r].dequant;
      } else {
        dequant = kPowerOfTwo ? power_of_two_reciprocal(scale.scale)  // 2^X for 2^-X
                              : (kFp32Rule ? 1.0 / scale.scale : scale.scale);
      }
      const float scale32 = static_cast<float>(scale.scale);  // exact: a float32 value
      // 8-bit formats: a lane whose |v| all lie in [2^emin, clip) or are 0 (its least nonzero |x| and its amax
      // scaled: fl32(|x| s) is monotonic in |x|) has nothing flushed or saturated and every cast is the rounding on
      // the bits (round_in_range): almost every lane of E4M3 and E5M2, whose normal ranges reach 2^14 and 2^29 below
      // max_E. E2M1's [1, 6] holds a whole lane rarely: the FP4 recipes keep the path below alone. An all-zero lane
      // (least nonzero taken as 0) and a product flushed to 0 take the path below as well.
      constexpr bool kInRangePath = grid.mbits >= 2 && !kDivide;
      bool in_range = false;
      if constexpr (kInRangePath) {
        constexpr uint32_t kLowestNormal = static_cast<uint32_t>(grid.emin + kExponentBias32) << kMantissaBits32;
        const uint32_t lo = float32_as_bits(bits_as_float32(below_normal + 1u) * scale32);
        const uint32_t hi = float32_as_bits(bits_as_float32(lane_amax) * scale32);
        in_range = AMPI_READINESS_FAST_PATH_ONLY || (lo >= kLowestNormal && hi < kClip);
      }
      if (kInRangePath && in_range) {
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
          const float x = bits_as_float32(bits[k]);
          const double q = static_cast<double>(bits_as_float32(round_in_range<grid.mbits>(float32_as_bits(x * scale32))));
          const double dequantized = kFp32Rule ? grid_quotient(q, scale.scale, dequant) : q * dequant;
          const double error = static_cast<double>(x) - dequantized;
          c.sums[1 + r] += error * error;
        }
        return;
      }
      uint32_t nonzero_casts = 0;
      uint32_t unsaturated = 0;
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        const ElementCast e = cast_element_fast(bits[k], grid, kDivide, scale32, kFp32Rule, scale.scale, dequant);
        nonzero_casts += (e.q_abs + kAbsMask32) >> 31;
        unsaturated += (e.v_abs - kClip) >> 31;  // both below 2^31: the difference's sign is v_abs < clip
        c.sums[1 + r] += e.sq_error;
      }
      w[kFlushedAndSaturated] += (nonzero - nonzero_casts) + (kGroup - unsaturated) * kHighUnit;
    } else {
#pragma unroll
      for (int k = 0; k < kGroup; ++k) {
        const ElementVerdict verdict = judge_element(bits[k], grid, scale);
        w[kFlushedAndSaturated] += static_cast<uint32_t>(verdict.flushed) + (verdict.saturated ? kHighUnit : 0u);
        c.sums[1 + r] += verdict.sq_error;
      }
    }
  });
}

// ---- block-level merge ----

__device__ __forceinline__ bool recipe_word_asked(const ReadinessParams& p, int word) {
  return word < kFixedWords || p.slot_of_recipe[(word - kFixedWords) / kWordsPerRecipe] >= 0;
}

// The output column of counter word `word` (asked recipes only).
__device__ __forceinline__ int count_column(const ReadinessParams& p, int word) {
  if (word < kFixedWords) return word;
  const int r = (word - kFixedWords) / kWordsPerRecipe;
  return kFixedWords + kWordsPerRecipe * p.slot_of_recipe[r] + (word - kFixedWords) % kWordsPerRecipe;
}

// Counter word k of the merged order (kWords), from the per-thread counters.
__device__ __forceinline__ uint32_t merged_word(const Counters& c, int k) {
  if (k == kNumel) return c.n[kNumelAndNonzero] % kHighUnit;
  if (k == kNonzero) return c.n[kNumelAndNonzero] / kHighUnit;
  if (k == kNonfinite) return 0u;  // added by the lanes that hold them (measure_task)
  const int r = (k - kFixedWords) / kWordsPerRecipe;
  const int field = (k - kFixedWords) % kWordsPerRecipe;
  const uint32_t word = c.n[kCounterFixedWords + kCounterWordsPerRecipe * r +
                            (field == kBlocks || field == kScaleFlushed ? kBlocksAndScaleFlushed : kFlushedAndSaturated)];
  return field == kFlushed || field == kBlocks ? word % kHighUnit : word / kHighUnit;
}

// Adds the block's counters to output row `out_row` (warp shuffles, one shared exchange, then one thread per
// column does the global atomic). Every thread of the block must call it.
template <int kMask>
__device__ __forceinline__ void flush(const Counters& c, const ReadinessParams& p, int64_t out_row,
                                      FlushScratch& scratch) {
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
#pragma unroll
  for (int k = 0; k < kWords; ++k) {
    if (k >= kFixedWords && !recipe_in(kMask, (k - kFixedWords) / kWordsPerRecipe)) continue;  // not compiled
    if (!recipe_word_asked(p, k)) continue;  // uniform: an unasked recipe's words are all zero
    const uint32_t total = warp_sum(merged_word(c, k));
    if (lane == 0) scratch.words[warp][k] = total;
  }
#pragma unroll
  for (int k = 0; k < kSums; ++k) {
    if (k > 0 && (!recipe_in(kMask, k - 1) || p.slot_of_recipe[k - 1] < 0)) continue;
    const double total = warp_sum(c.sums[k]);
    if (lane == 0) scratch.sums[warp][k] = total;
  }
  const uint32_t amax = warp_max(c.amax_bits);
  if (lane == 0) scratch.amax[warp] = amax;
  __syncthreads();  // scratch filled
  const int tid = threadIdx.x;
  if (tid < kWords) {
    if (recipe_word_asked(p, tid)) {
      uint64_t total = 0;
      for (int w = 0; w < kWarps; ++w) total += scratch.words[w][tid];
      if (total != 0) {
        atomicAdd(reinterpret_cast<unsigned long long*>(p.counts + out_row * p.count_columns + count_column(p, tid)),
                  static_cast<unsigned long long>(total));
      }
    }
  } else if (tid < kWords + kSums) {
    const int k = tid - kWords;
    const int column = k == 0 ? 0 : (p.slot_of_recipe[k - 1] < 0 ? -1 : 1 + p.slot_of_recipe[k - 1]);
    if (column >= 0) {
      double total = 0.0;
      for (int w = 0; w < kWarps; ++w) total += scratch.sums[w][k];
      if (total != 0.0) atomicAdd(p.sums + out_row * p.sum_columns + column, total);
    }
  } else if (tid == kWords + kSums && p.amax_mode == kAmaxMeasure) {
    uint32_t total = 0;
    for (int w = 0; w < kWarps; ++w) total = max_u32(total, scratch.amax[w]);
    // Nonnegative float32 bits order as their values: an integer max is the float max.
    if (total != 0) atomicMax(reinterpret_cast<unsigned int*>(p.amax + out_row), total);
  }
  __syncthreads();  // scratch read before anyone writes it again
}

// Tasks [begin, begin + n) of one view, then their counts into its output row. Every thread must call it.
template <int kDtype, int kMask>
__device__ __forceinline__ void measure_piece(const ReadinessParams& p, const ReadinessKernelView& view, int64_t begin,
                                              int64_t n, FlushScratch& scratch) {
  // The tensor amax: given, or measured by amax_kernel before this launch (read at L2, where it was written);
  // its magnitude, as readiness.h's rules take it (a given -0 is 0; negative amaxes are refused where the op
  // can read them without a sync). NVFP4's decode scale follows from it, once per piece.
  const uint32_t tensor_amax_bits =
      p.amax_mode == kAmaxRead ? float32_as_bits(__ldcg(p.amax + view.out_row)) & kAbsMask32 : 0u;
  const uint32_t nvfp4_decode_bits = mask_has_rule(kMask, kScaleNvfp4) ? nvfp4_decode_scale_bits(tensor_amax_bits) : 0u;
  const double decode_reciprocal = mask_has_rule(kMask, kScaleNvfp4) ? nvfp4_decode_reciprocal(nvfp4_decode_bits) : 0.0;
  if (threadIdx.x == 0) {
    scratch.nvfp4_decode_bits = nvfp4_decode_bits;
    scratch.nvfp4_decode_reciprocal = decode_reciprocal;
    for_each_recipe<kMask>([&](auto recipe) {
      constexpr int r = decltype(recipe)::value;
      constexpr RecipeSpec spec = kRecipes[r];
      if constexpr (spec.block == 0) {
        static_assert(spec.scale == kScaleFp32Tensor, "the tensor-scaled recipes take an fp32 rule");
        constexpr ElementGrid grid = kElementGrids[spec.element];
        const BlockScale scale = block_scale(spec.scale, grid, tensor_amax_bits, 0u);
        scratch.tensor_scales[r].scale = scale;
        // Its fast path (scale_is_normal_float) takes the reciprocal: the fp32 scale is 1, FLT_MAX or in between.
        scratch.tensor_scales[r].dequant = 1.0 / scale.scale;
      }
    });
  }
  __syncthreads();  // the piece's scales written (flush's last barrier ended the reads of the previous piece's)
  Counters c;
  c.clear();
  const int warp = threadIdx.x / kWarpSize;
  const int lane_shift = highest_bit(static_cast<uint32_t>(view.lanes_per_row));  // lanes is a power of two
  // The warp's tasks are begin + warp, then every kWarps-th: one division here, then steps of whole rows and tiles.
  const int64_t tiles = view.tiles_per_row;
  const int64_t first_task = begin + warp;
  TaskPlace place{first_task / tiles, 0};
  place.tile = first_task - place.row_group * tiles;
  const int64_t step_rows = kWarps / tiles;
  const int64_t step_tiles = kWarps - step_rows * tiles;
  // Warp-uniform: the butterfly's shuffles are reached by the whole warp.
  for (int64_t task = first_task; task < begin + n; task += kWarps) {
    measure_task<kDtype, kMask>(p, view, place, lane_shift, kMask == kAllRecipes ? 0u : nvfp4_decode_bits,
                                kMask == kAllRecipes ? 0.0 : decode_reciprocal, scratch, c);
    place.row_group += step_rows;
    place.tile += step_tiles;
    if (place.tile >= tiles) {
      place.tile -= tiles;
      ++place.row_group;
    }
  }
  flush<kMask>(c, p, view.out_row, scratch);
}

// Index of the view holding `chunk` (views ordered by first_chunk; few per launch: a linear walk).
__device__ __forceinline__ int64_t view_of_chunk(const ReadinessParams& p, int64_t chunk) {
  int64_t v = 0;
  while (v + 1 < p.num_views && p.views[v + 1].first_chunk <= chunk) ++v;
  return v;
}

// The quantization pass over the views of one launch (one input dtype). Block b takes chunks
// [first_chunk + b * n / grid, first_chunk + (b + 1) * n / grid) and walks them view by view.
template <int kDtype, int kMask>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    readiness_kernel(const __grid_constant__ ReadinessParams p) {
  static_assert(kWords + kSums + 1 <= kThreads, "one thread per merged column");
  __shared__ FlushScratch scratch;
  const int64_t grid = gridDim.x;
  const int64_t block = blockIdx.x;
  const int64_t chunk_begin = p.first_chunk + block * p.num_chunks / grid;
  const int64_t chunk_end = p.first_chunk + (block + 1) * p.num_chunks / grid;
  int64_t v = chunk_begin < chunk_end ? view_of_chunk(p, chunk_begin) : 0;
  int64_t chunk = chunk_begin;
  while (chunk < chunk_end) {  // uniform over the block: every barrier inside is reached by all of it
    const ReadinessKernelView& view = p.views[v];
    const int64_t view_end = view.first_chunk + readiness_chunks(view, p.chunk_tasks);
    const int64_t last = chunk_end < view_end ? chunk_end : view_end;
    const int64_t begin = (chunk - view.first_chunk) * p.chunk_tasks;
    int64_t end = (last - view.first_chunk) * p.chunk_tasks;
    if (end > view.tasks) end = view.tasks;
    for (int64_t piece = begin; piece < end; piece += kMaxFlushTasks) {
      const int64_t n = end - piece < kMaxFlushTasks ? end - piece : kMaxFlushTasks;
      measure_piece<kDtype, kMask>(p, view, piece, n, scratch);
    }
    chunk = last;
    ++v;
  }
}

// The first pass, only where a tensor-scaled recipe is asked and no tensor_amax given: each view's finite
// amax into the amax output (zeroed), one atomicMax per warp and view. This pass only reads, so it is bound by the
// memory: a view is read as 16-byte vectors from its first 16-byte boundary on, kAmaxVectorsInFlight of them per
// thread at a time (coalesced: a warp's loads of one round are neighbours), and the few elements before that
// boundary and after the last whole vector one at a time. Magnitudes are compared in the stored width
// (finite_magnitude) and widened once, at the end, as readiness_cpu.cpp's finite_amax does.
constexpr int kAmaxVectorsInFlight = 4;

// |raw| of one stored element, in its own width, where it is finite, else 0 (NaN and Inf take no part).
template <int kDtype>
__device__ __forceinline__ uint32_t finite_magnitude(uint32_t raw) {
  if constexpr (kDtype == kFloat32) {
    const uint32_t a = raw & kAbsMask32;
    return is_finite32(a) ? a : 0u;
  } else {
    const uint32_t a = raw & kAbsMask16;
    return a < (kDtype == kFloat16 ? kFp16InfBits : kBf16InfBits) ? a : 0u;
  }
}

template <int kDtype>
__global__ void __launch_bounds__(kThreads) amax_kernel(const __grid_constant__ ReadinessParams p) {
  using W = typename Storage<kDtype>::type;
  constexpr int64_t kPerVector = kVectorBytes / static_cast<int64_t>(sizeof(W));
  const int64_t threads = static_cast<int64_t>(gridDim.x) * kThreads;
  const int64_t thread = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  for (int64_t v = 0; v < p.num_views; ++v) {
    const ReadinessKernelView& view = p.views[v];
    const W* data = static_cast<const W*>(view.data);
    const int64_t numel = view.rows * view.row_length;
    // Elements before the first 16-byte boundary (a tensor's data is aligned to its element size), whole vectors,
    // then the elements after the last one.
    const int64_t off = static_cast<int64_t>(reinterpret_cast<uintptr_t>(data) % kVectorBytes) / static_cast<int64_t>(sizeof(W));
    const int64_t head = off == 0 ? 0 : (kPerVector - off < numel ? kPerVector - off : numel);
    const int64_t vectors = (numel - head) / kPerVector;
    const int64_t tail = head + vectors * kPerVector;
    uint32_t amax = 0;  // in the stored width
    for (int64_t k = thread; k < head + (numel - tail); k += threads) {
      amax = max_u32(amax, finite_magnitude<kDtype>(__ldg(data + (k < head ? k : tail + (k - head)))));
    }
    const uint4* body = reinterpret_cast<const uint4*>(data + head);
    for (int64_t first = thread; first < vectors; first += threads * kAmaxVectorsInFlight) {
      uint4 words[kAmaxVectorsInFlight];
#pragma unroll
      for (int u = 0; u < kAmaxVectorsInFlight; ++u) {  // every load issued before any is used
        const int64_t at = first + u * threads;
        words[u] = at < vectors ? __ldg(body + at) : uint4{};  // zeros take no part in a max
      }
#pragma unroll
      for (int u = 0; u < kAmaxVectorsInFlight; ++u) {
#pragma unroll
        for (int i = 0; i < kPerVector; ++i) {
          amax = max_u32(amax, finite_magnitude<kDtype>(vector_word<W>(words[u], i)));
        }
      }
    }
    amax = stored_as_f32_bits<kDtype>(static_cast<W>(amax));  // widening is monotone: the max of the widened
    amax = warp_max(amax);
    if (threadIdx.x % kWarpSize == 0 && amax != 0) atomicMax(reinterpret_cast<unsigned int*>(p.amax + view.out_row), amax);
  }
}

// ---- host side: the launch sequence, for any backend ----
//
// A Backend runs the kernels somewhere: common/cuda_launch.cuh's CudaBackend on the GPU, common/cuda_emu.h's
// Backend on the CPU (zero, copy, blocks, launch).

// fn(the quantization kernel of `dtype` for the recipe set `mask` (kernel_recipe_mask), the amax kernel of `dtype`).
template <int kDtype, class Fn>
void with_recipe_mask(int mask, Fn&& fn) {
  switch (mask) {
    case 0: return fn(readiness_kernel<kDtype, 0>, amax_kernel<kDtype>);
    case 1 << 0: return fn(readiness_kernel<kDtype, 1 << 0>, amax_kernel<kDtype>);
    case 1 << 1: return fn(readiness_kernel<kDtype, 1 << 1>, amax_kernel<kDtype>);
    case 1 << 2: return fn(readiness_kernel<kDtype, 1 << 2>, amax_kernel<kDtype>);
    case 1 << 3: return fn(readiness_kernel<kDtype, 1 << 3>, amax_kernel<kDtype>);
    case 1 << 4: return fn(readiness_kernel<kDtype, 1 << 4>, amax_kernel<kDtype>);
    case 1 << 5: return fn(readiness_kernel<kDtype, 1 << 5>, amax_kernel<kDtype>);
    case 1 << 6: return fn(readiness_kernel<kDtype, 1 << 6>, amax_kernel<kDtype>);
    case 1 << 7: return fn(readiness_kernel<kDtype, 1 << 7>, amax_kernel<kDtype>);
    default: return fn(readiness_kernel<kDtype, kAllRecipes>, amax_kernel<kDtype>);
  }
}
static_assert(kRecipeCount == 8, "with_recipe_mask has a case per recipe");

template <class Fn>
void with_dtype(int dtype, int mask, Fn&& fn) {
  switch (dtype) {
    case kFloat32: return with_recipe_mask<kFloat32>(mask, fn);
    case kFloat16: return with_recipe_mask<kFloat16>(mask, fn);
    default: return with_recipe_mask<kBFloat16>(mask, fn);
  }
}

// Zeroes the outputs (or fills amax with the given tensor_amax), measures the amax first where a
// tensor-scaled recipe needs it, then runs the quantization pass: one launch per run of up to
// kReadinessInlineViews views of one dtype. Asynchronous on a GPU backend.
template <class Backend>
void run_readiness(const ReadinessLaunchPlan& plan, Backend& backend) {
  const int count_columns = readiness_count_columns(plan.num_recipes);
  const int sum_columns = readiness_sum_columns(plan.num_recipes);
  backend.zero(plan.counts, plan.num_tensors * count_columns * static_cast<int64_t>(sizeof(int64_t)));
  backend.zero(plan.sums, plan.num_tensors * sum_columns * static_cast<int64_t>(sizeof(double)));
  if (plan.tensor_amax != nullptr) {
    backend.copy(plan.amax, plan.tensor_amax, plan.num_tensors * static_cast<int64_t>(sizeof(float)));
  } else {
    backend.zero(plan.amax, plan.num_tensors * static_cast<int64_t>(sizeof(float)));
  }
  const bool measure_first = plan.tensor_amax == nullptr && plan.tensor_scaled_asked;
  const int recipe_mask = kernel_recipe_mask(plan);
  ReadinessParams params{};
  params.chunk_tasks = plan.chunk_tasks;
  for (int r = 0; r < kRecipeCount; ++r) params.slot_of_recipe[r] = plan.slot_of_recipe[r];
  params.count_columns = count_columns;
  params.sum_columns = sum_columns;
  params.amax_mode = plan.tensor_amax == nullptr && !plan.tensor_scaled_asked ? kAmaxMeasure : kAmaxRead;
  params.counts = plan.counts;
  params.sums = plan.sums;
  params.amax = plan.amax;
  // The launches: runs of one dtype, at most kReadinessInlineViews views each, their chunks renumbered.
  auto each_launch = [&](bool amax_pass) {
    for (int64_t first = 0; first < plan.num_views;) {
      const int32_t dtype = plan.views[first].dtype;
      int64_t end = first + 1;
      while (end < plan.num_views && end - first < kReadinessInlineViews && plan.views[end].dtype == dtype) ++end;
      params.num_views = end - first;
      int64_t chunks = 0;
      int64_t elements = 0;
      for (int64_t v = first; v < end; ++v) {
        params.views[v - first] = plan.views[v];
        params.views[v - first].first_chunk = chunks;
        chunks += readiness_chunks(plan.views[v], plan.chunk_tasks);
        elements += plan.views[v].rows * plan.views[v].row_length;
      }
      params.first_chunk = 0;
      params.num_chunks = chunks;
      with_dtype(dtype, recipe_mask, [&](auto main_kernel, auto amax_kernel_of_dtype) {
        if (amax_pass) {
          // Work in units of a main-pass chunk's elements, so both passes get grids of the same scale.
          const int64_t work = (elements + kThreads * kGroup - 1) / (kThreads * kGroup);
          backend.launch(amax_kernel_of_dtype, backend.blocks(amax_kernel_of_dtype, kThreads, work), kThreads, params);
        } else {
          backend.launch(main_kernel, backend.blocks(main_kernel, kThreads, chunks), kThreads, params);
        }
      });
      first = end;
    }
  };
  if (measure_first) each_launch(true);
  each_launch(false);
}

}  // namespace AMPI_KERNELS_NAMESPACE
}  // namespace readiness_kernels
}  // namespace amp_inspect
