// readiness_cpu.cpp: the CPU kernel of amp_inspect::format_readiness (issue 21).
//
// Per tensor, blocks run along rows of its last dimension. The unit of work is one 128-element block of a row
// (the largest block a recipe uses; a row's last one may be shorter): its elements are read once into a small
// stack buffer as float32 bits, the amaxes of its 16-element sub-blocks are taken (a 32- or 128-element block's
// amax is the max of its sub-blocks'), and then every recipe asked for quantizes the buffer's elements while they
// are in L1. The per-element logic is readiness.h's: judge_element_fast in vectorised loops (AVX-512 / AVX2 clones)
// where a unit holds no float32 subnormal and its scales are normal floats, else the exact judge_element (the one the
// CUDA kernel runs); the two give the same verdicts. On a CPU with AVX2 and FMA (AVX-512 or not) the fast loops, the
// unit scan and the block scales take an AVX2 path instead (intrinsics, below: the same verdicts and float64 terms in
// the same order). Units are grouped into chunks of about kChunkElems elements,
// split across threads with torch::stable::parallel_for (torch's pool). Cost: bench/README.md.
//
// Tensor-scaled recipes (fp8_*_tensor, nvfp4) need the tensor's amax before the pass: given (tensor_amax, delayed
// scaling) or measured by a first pass over the tensor, only when such a recipe is asked for and no amax is given.
// Each chunk writes its totals to a slot of its own, summed per tensor in chunk order: results do not depend on the
// number of threads, and no lock is taken.
//
// The float64 sums' order. A unit's sq_signal, and a recipe's sq_error on a unit that takes the fast loop, are added
// in sum_in_lanes' fixed order; a recipe's sq_error on a unit that takes the exact path, element by element in
// element order. Which path a unit takes depends on its values alone (never on the FPU's mode). Since 2026-12-01
// (issue 21's CPU speed-up) a unit whose NVFP4 blocks include one with total scale 0 takes the fast loop (it took
// the exact path before): the same terms, added in the other of the two orders, within the tests' tolerance of the
// reference (tests/test_readiness.py's sums_rtol).
//
// no-trapping-math, for the whole file (before any header, so that every inline function it calls has the same
// options and inlines): without it GCC keeps a select between float results as a branch (a float operation might
// trap) and does not vectorise the element loops. It changes no value: IEEE results, their rounding and their
// order stay as written (it is not fast-math).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#endif

#include "common/cpu_clones.h"
#include "readiness/readiness_call.h"

namespace amp_inspect {
namespace {

constexpr int64_t kChunkElems = int64_t{1} << 16;  // one unit of parallel work, about
constexpr int kSubBlocks = kLargestBlock / kSmallestBlock;
constexpr int kMaxCountColumns = kReadinessFixedCounts + kReadinessCountsPerRecipe * kNumRecipes;
constexpr int kMaxSumColumns = kReadinessFixedSums + kReadinessSumsPerRecipe * kNumRecipes;

// How a view's units (128-element blocks of its rows) fall into chunks.
struct ViewWork {
  int64_t units_per_row;    // ceil(row_length / 128)
  int64_t units;            // rows * units_per_row
  int64_t units_per_chunk;  // about kChunkElems elements
  int64_t first_chunk;      // in the call's flat list of chunks
};

struct Plan {
  std::vector<ViewWork> work;
  int64_t total_chunks = 0;

  explicit Plan(const ReadinessCall& call) {
    for (const ReadinessView& v : call.views) {
      ViewWork w{};
      w.units_per_row = (v.row_length + kLargestBlock - 1) / kLargestBlock;
      w.units = (v.numel / v.row_length) * w.units_per_row;
      const int64_t unit_elems = std::min<int64_t>(v.row_length, kLargestBlock);
      w.units_per_chunk = std::max<int64_t>(1, kChunkElems / unit_elems);
      w.first_chunk = total_chunks;
      total_chunks += (w.units + w.units_per_chunk - 1) / w.units_per_chunk;
      work.push_back(w);
    }
  }

  // The view a chunk belongs to: the last whose first_chunk <= chunk.
  int64_t view_of(int64_t chunk) const {
    const auto it = std::upper_bound(work.begin(), work.end(), chunk,
                                     [](int64_t c, const ViewWork& w) { return c < w.first_chunk; });
    return static_cast<int64_t>(it - work.begin()) - 1;
  }
};

// The element range of unit u of a view: its row's elements from the unit's block on, at most 128.
struct UnitRange {
  int64_t start;
  int64_t length;
};
UnitRange unit_range(const ReadinessView& view, const ViewWork& w, int64_t u) {
  const int64_t row = u / w.units_per_row;
  const int64_t offset = (u % w.units_per_row) * kLargestBlock;
  return {row * view.row_length + offset, std::min<int64_t>(kLargestBlock, view.row_length - offset)};
}

// Totals of one chunk, in the op's columns.
struct ChunkTotals {
  int64_t counts[kMaxCountColumns];
  double sums[kMaxSumColumns];
  uint32_t amax;  // float32 bits of the chunk's finite amax
};

// What the recipes of one tensor need beside its blocks: each recipe's grid, and for the tensor-scaled ones
// the tensor's scale; NVFP4's decode scale.
struct TensorRecipes {
  const RecipeSpec* spec[kNumRecipes];
  ElementGrid grid[kNumRecipes];
  BlockScale tensor_scale[kNumRecipes];  // fp32_tensor only
  uint32_t decode_bits;                  // NVFP4's d
};

TensorRecipes tensor_recipes(const ReadinessCall& call, uint32_t amax_bits) {
  TensorRecipes t{};
  t.decode_bits = nvfp4_decode_scale_bits(amax_bits);
  for (int r = 0; r < call.num_recipes; ++r) {
    t.spec[r] = &kRecipes[call.recipe_ids[r]];
    t.grid[r] = kElementGrids[t.spec[r]->element];
    t.tensor_scale[r] = fp32_scale(amax_bits, t.grid[r]);
  }
  return t;
}

// Block totals of one recipe.
struct BlockVerdicts {
  int64_t flushed;
  int64_t saturated;
  double sq_error;
};

// The sum of v[0, n) (n <= kLargestBlock) in float64, in a fixed order: kSumLanes running sums (element i into lane
// i mod kSumLanes, in element order), added from lane 0 to lane kSumLanes - 1, then the rest. A float64 `sum += v[i]`
// loop is not vectorised (without fast-math the compiler keeps its order); these lanes are. They are held in one of
// two forms that give the same sums (the same adds, per lane, in the same order): kWide, one 8-double GCC vector, a
// single AVX-512 register; else four 2-double vectors, SSE2's width, which every clone keeps in registers (the
// 8-double vector went through the stack on the AVX2 and default clones, as in update_stats_cpu.cpp).
constexpr int kSumLanes = 8;
constexpr int kPairs = kSumLanes / 2;
using DoubleLanes = double __attribute__((vector_size(kSumLanes * sizeof(double))));
using DoublePair = double __attribute__((vector_size(2 * sizeof(double))));
template <bool kWide>
__attribute__((always_inline)) inline double sum_in_lanes(const double* v, int64_t n) {
  double lane[kSumLanes];
  int64_t i = 0;
  if constexpr (kWide) {
    DoubleLanes acc = {};
    for (; i + kSumLanes <= n; i += kSumLanes) {
      DoubleLanes x;
      std::memcpy(&x, v + i, sizeof x);
      acc += x;
    }
    std::memcpy(lane, &acc, sizeof lane);
  } else {
    DoublePair acc[kPairs] = {};
    for (; i + kSumLanes <= n; i += kSumLanes) {
      DoublePair x[kPairs];
      std::memcpy(x, v + i, sizeof x);
      for (int p = 0; p < kPairs; ++p) acc[p] += x[p];
    }
    std::memcpy(lane, acc, sizeof lane);
  }
  double total = 0.0;
  for (int l = 0; l < kSumLanes; ++l) total += lane[l];
  for (; i < n; ++i) total += v[i];
  return total;
}

// One scale per element of a unit (its block's): the float32 v is computed with, and the float64 the dequantized value
// is computed with (judge_element_fast), for judge_fast.
struct UnitScales {
  float scale32[kLargestBlock];
  double dequant[kLargestBlock];
};

// judge_element_fast over a unit's elements, each under its own block's scale, the scale's kind fixed so the loop
// has no branch: vectorised (AVX-512 / AVX2 clones), int32 lane counters (at most 128 elements), the squared errors
// staged and summed in lanes.
template <bool kDivide, bool kDequantDivides, bool kWide>
__attribute__((always_inline)) inline BlockVerdicts judge_fast(const uint32_t* __restrict bits, int64_t n,
                                                              const ElementGrid& g, const UnitScales& s) {
  int32_t flushed = 0, saturated = 0;
  double squares[kLargestBlock];
  for (int64_t i = 0; i < n; ++i) {
    const ElementVerdict v = judge_element_fast(bits[i], g, kDivide, s.scale32[i], kDequantDivides, s.dequant[i]);
    flushed += v.flushed;
    saturated += v.saturated;
    squares[i] = v.sq_error;
  }
  return {flushed, saturated, sum_in_lanes<kWide>(squares, n)};
}

// The three kinds of scale: fp32 (v = x * s, q / s), E8M0 (v = x * 2^-X, q * 2^X), NVFP4 (v = x / t, q * t); each
// with paired or wide lanes (sum_in_lanes).
AMPI_CPU_CLONES BlockVerdicts judge_fast_fp32(const uint32_t* bits, int64_t n, const ElementGrid& g,
                                                    const UnitScales& s) {
  return judge_fast<false, true, false>(bits, n, g, s);
}
AMPI_CPU_CLONES BlockVerdicts judge_fast_fp32_wide(const uint32_t* bits, int64_t n, const ElementGrid& g,
                                                         const UnitScales& s) {
  return judge_fast<false, true, true>(bits, n, g, s);
}
AMPI_CPU_CLONES BlockVerdicts judge_fast_power_of_two(const uint32_t* bits, int64_t n, const ElementGrid& g,
                                                            const UnitScales& s) {
  return judge_fast<false, false, false>(bits, n, g, s);
}
AMPI_CPU_CLONES BlockVerdicts judge_fast_power_of_two_wide(const uint32_t* bits, int64_t n, const ElementGrid& g,
                                                                 const UnitScales& s) {
  return judge_fast<false, false, true>(bits, n, g, s);
}
AMPI_CPU_CLONES BlockVerdicts judge_fast_divide(const uint32_t* bits, int64_t n, const ElementGrid& g,
                                                      const UnitScales& s) {
  return judge_fast<true, false, false>(bits, n, g, s);
}
AMPI_CPU_CLONES BlockVerdicts judge_fast_divide_wide(const uint32_t* bits, int64_t n, const ElementGrid& g,
                                                           const UnitScales& s) {
  return judge_fast<true, false, true>(bits, n, g, s);
}

// The exact judge_element over elements [0, n) of a block: for blocks where judge_element_fast's conditions fail.
BlockVerdicts judge_exact(const uint32_t* bits, int64_t n, const ElementGrid& g, const BlockScale& s) {
  BlockVerdicts v{0, 0, 0.0};
  for (int64_t i = 0; i < n; ++i) {
    const ElementVerdict e = judge_element(bits[i], g, s);
    v.flushed += e.flushed;
    v.saturated += e.saturated;
    v.sq_error += e.sq_error;
  }
  return v;
}

// A unit's blocks of `block` elements each judged exactly, their verdicts added in block order: the path of a unit
// where judge_element_fast's conditions fail (float32 subnormals, a scale that is not a normal float).
BlockVerdicts judge_exact_blocks(const uint32_t* bits, int64_t n, int64_t block, const ElementGrid& g,
                                 const BlockScale* scales) {
  BlockVerdicts v{0, 0, 0.0};
  for (int64_t b = 0; b * block < n; ++b) {
    const BlockVerdicts part = judge_exact(bits + b * block, std::min(block, n - b * block), g, scales[b]);
    v.flushed += part.flushed;
    v.saturated += part.saturated;
    v.sq_error += part.sq_error;
  }
  return v;
}

// What a unit's first look (scan_unit) finds.
struct UnitScan {
  int32_t nonzero, nonfinite, subnormal;
  double sq_signal;
};

// ---- the AVX2 path (issue 33): a unit's loops written with AVX2 intrinsics, wherever this CPU has AVX2 and FMA. It
// was written on an AMD EPYC (x86-64-v3) and beats the AVX-512 clones on an Intel Xeon with AVX-512 too (one
// readiness step's calls 0.68x their time, one recipe 0.5x: bench/README.md), so the cloned loops remain only for
// CPUs without AVX2 and for other architectures.
// The same verdicts and the same float64 terms, added in the same order, as judge_fast / scan_unit: a vector holds
// elements 8k .. 8k + 7, its low four doubles go to lanes 0-3 of sum_in_lanes and its high four to lanes 4-7, and a
// unit's last, partial vector (n not a multiple of 8) is added after the lanes, element by element, as sum_in_lanes
// adds its rest. What it saves over the cloned loops: each block's scale broadcast once (no per-element scale
// arrays), x widened to float64 once per unit for the eight recipes (UnitData::x), the lanes held in two registers
// (no staging of the squares), and the fp32 rules' float64 division q / s replaced by exact multiply-adds
// (dequantize_fp32).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AMPI_AVX2_PATH 1
#define AMPI_AVX2 __attribute__((target("avx2,fma")))

// Set (to anything) in the environment, the cloned loops run even where the AVX2 path could: for the test that holds
// the two paths' outputs equal bit for bit on one machine (tests/test_readiness.py), since every machine with AVX2
// would otherwise run the AVX2 path alone. Read once, at the first call.
constexpr const char* kClonesOnlyVariable = "AMP_INSPECT_TEST_READINESS_CLONES";

// Whether a unit takes the AVX2 path: AVX2 and FMA present (AVX-512 machines included: see above).
bool avx2_path() {
  static const bool ok = std::getenv(kClonesOnlyVariable) == nullptr && __builtin_cpu_supports("avx2") &&
                         __builtin_cpu_supports("fma");
  return ok;
}

// A unit's elements for the AVX2 loops: |x| as float32 bits (non-finite ones set to 0) and as float64, exactly;
// both zero past the unit's n up to a multiple of 8, so that every vector load is whole (a zero counts nothing and
// adds nothing, and the partial vector's lanes past n are never added). Magnitudes, since no verdict or term depends
// on x's sign: q takes x's sign, so (x - dequant)^2 is (|x| - |dequant|)^2 bit for bit (IEEE's negation is exact and
// its rounding symmetric). zero_lanes: the zeros among the lanes of those vectors, padding included, so that
// a recipe counts flushed elements as its q = 0 lanes less these (x = 0 gives q = 0 under every scale).
struct alignas(32) UnitData {
  uint32_t bits[kLargestBlock];
  double x[kLargestBlock];
  int32_t zero_lanes;
};

// Lanes 0-3 and 4-7 (acc_lo, acc_hi) added from lane 0 to 7, then the partial vector's first `rest` squares: the
// order of sum_in_lanes.
AMPI_AVX2 inline double lanes_total(__m256d acc_lo, __m256d acc_hi, const double* tail, int64_t rest) {
  alignas(32) double lane[8];
  _mm256_store_pd(lane, acc_lo);
  _mm256_store_pd(lane + 4, acc_hi);
  double total = 0.0;
  for (int l = 0; l < 8; ++l) total += lane[l];
  for (int64_t i = 0; i < rest; ++i) total += tail[i];
  return total;
}

// The sum of an int32 vector's lanes.
AMPI_AVX2 inline int32_t lanes_int_total(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// The float64 square of each double, kept apart from the add that follows it: contracted into a fused multiply-add
// (GCC does so with FMA enabled) it would round once where sum_in_lanes rounds twice.
AMPI_AVX2 inline __m256d square_apart(__m256d e) {
  __m256d sq = _mm256_mul_pd(e, e);
  __asm__("" : "+x"(sq));
  return sq;
}

// scan_unit on the AVX2 path: sets d.bits to |x| and fills d.x (|x| exactly: the hardware's widening, and for a vector holding a float32
// subnormal float32_bits_to_double's, which no DAZ mode touches) beside scan_unit's counts, zeroing and sub-block
// amaxes. d.bits holds the unit's n elements and zeros up to 128.
AMPI_AVX2 UnitScan scan_unit_avx2(UnitData& d, int64_t n, uint32_t* sub_amax) {
  const __m256i abs_mask = _mm256_set1_epi32(static_cast<int32_t>(kAbsMask32));
  const __m256i largest_finite = _mm256_set1_epi32(static_cast<int32_t>(kInfBits32 - 1));
  const __m256i smallest_normal = _mm256_set1_epi32(static_cast<int32_t>(kImplicitBit32));
  const __m256i zero = _mm256_setzero_si256();
  __m256i nonzero = zero, nonfinite = zero, subnormal = zero, zeros = zero;
  __m256d acc_lo = _mm256_setzero_pd(), acc_hi = _mm256_setzero_pd();
  alignas(32) double tail[8];
  for (int64_t i = 0; i < n; i += 8) {
    __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(d.bits + i));
    const __m256i a = _mm256_and_si256(b, abs_mask);
    const __m256i not_finite = _mm256_cmpgt_epi32(a, largest_finite);
    const __m256i is_zero = _mm256_cmpeq_epi32(a, zero);
    const __m256i tiny = _mm256_cmpgt_epi32(smallest_normal, a);
    nonfinite = _mm256_sub_epi32(nonfinite, not_finite);
    nonzero = _mm256_sub_epi32(nonzero, _mm256_andnot_si256(_mm256_or_si256(is_zero, not_finite), _mm256_set1_epi32(-1)));
    const __m256i sub = _mm256_andnot_si256(is_zero, tiny);
    subnormal = _mm256_sub_epi32(subnormal, sub);
    zeros = _mm256_sub_epi32(zeros, _mm256_or_si256(is_zero, not_finite));
    b = _mm256_andnot_si256(not_finite, a);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d.bits + i), b);
    const __m256 x = _mm256_castsi256_ps(b);
    __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    _mm256_store_pd(d.x + i, lo);
    _mm256_store_pd(d.x + i + 4, hi);
    if (_mm256_movemask_ps(_mm256_castsi256_ps(sub)) != 0) {  // rare: widen on the bits
      for (int64_t k = i; k < i + 8; ++k) d.x[k] = float32_bits_to_double(d.bits[k]);
      lo = _mm256_load_pd(d.x + i);
      hi = _mm256_load_pd(d.x + i + 4);
    }
    const __m256d sq_lo = square_apart(lo), sq_hi = square_apart(hi);
    if (i + 8 <= n) {
      acc_lo = _mm256_add_pd(acc_lo, sq_lo);
      acc_hi = _mm256_add_pd(acc_hi, sq_hi);
    } else {
      _mm256_store_pd(tail, sq_lo);
      _mm256_store_pd(tail + 4, sq_hi);
    }
  }
  d.zero_lanes = lanes_int_total(zeros);
  for (int64_t first = 0; first < n; first += kSmallestBlock) {  // zeros past n leave a maximum as it is
    const __m256i m = _mm256_max_epu32(_mm256_load_si256(reinterpret_cast<const __m256i*>(d.bits + first)),
                                       _mm256_load_si256(reinterpret_cast<const __m256i*>(d.bits + first + 8)));
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
    sub_amax[first / kSmallestBlock] = static_cast<uint32_t>(_mm_cvtsi128_si32(h));
  }
  return {lanes_int_total(nonzero), lanes_int_total(nonfinite), lanes_int_total(subnormal),
          lanes_total(acc_lo, acc_hi, tail, n % 8)};
}

// The scale of one block on the AVX2 path, as each kind uses it: scale32 the float32 v is computed with; dequant
// the float64 q is multiplied by (E8M0: 2^X; NVFP4: the total scale, 0 for an all_zero block) or, for the fp32 rules,
// the scale s itself, with reciprocal = fl64(1 / s).
struct BlockScaleAvx2 {
  float scale32;
  double dequant;
  double reciprocal;
};
enum ScaleKind { kKindFp32 = 0, kKindPowerOfTwo = 1, kKindDivide = 2 };

// fl64(q / s) for a q of the element grids (at most 4 significant bits: 1.mmm * 2^e, or 0) and a normal float32 s,
// from r = fl64(1 / s): y = fl64(q r), the remainder q - y s exact by one fused multiply-add, and y + remainder * r
// rounded once is the correctly rounded quotient (Markstein's final step; checked exhaustively: every 4-bit q
// mantissa against every float32 mantissa of s, 2^27 quotients, all equal to the division's. Scaling q or s by a
// power of two scales every step exactly: no float64 here is subnormal or overflows, q being in [2^-16, 57344],
// s in [2^-126, 2^128)). A q of -0 gives +0 where q / s is -0: x - (+-0) is the same x.
AMPI_AVX2 inline __m256d dequantize_fp32(__m256d q, __m256d s, __m256d r) {
  const __m256d y = _mm256_mul_pd(q, r);
  const __m256d remainder = _mm256_fnmadd_pd(y, s, q);
  return _mm256_fmadd_pd(remainder, r, y);
}

// cast_abs_bits of eight |v| (float32 bits, finite or Inf) on grid g: on the bits in the grid's normal range,
// float32's rounding below it, as cast_abs_bits does.
struct CastAvx2 {
  __m128i shift_count;
  __m256i one, max_bits, half_less_one, keep, below_lowest_normal;
  __m256 quantum_shift;
  AMPI_AVX2 explicit CastAvx2(const ElementGrid& g) {
    const int32_t shift = kMantissaBits32 - g.mbits;
    shift_count = _mm_cvtsi32_si128(shift);
    one = _mm256_set1_epi32(1);
    max_bits = _mm256_set1_epi32(static_cast<int32_t>(g.max_bits));
    half_less_one = _mm256_set1_epi32(static_cast<int32_t>((1u << (shift - 1)) - 1u));
    keep = _mm256_set1_epi32(static_cast<int32_t>(~((1u << shift) - 1u)));
    quantum_shift = _mm256_castsi256_ps(_mm256_set1_epi32(
        static_cast<int32_t>(static_cast<uint32_t>(g.emin - g.mbits + kMantissaBits32 + kExponentBias32)
                             << kMantissaBits32)));
    below_lowest_normal = _mm256_set1_epi32(
        static_cast<int32_t>((static_cast<uint32_t>(g.emin + kExponentBias32) << kMantissaBits32) - 1u));
  }
  AMPI_AVX2 __m256i of(__m256i v_abs) const {
    const __m256i a = _mm256_min_epu32(v_abs, max_bits);
    const __m256i last_kept = _mm256_and_si256(_mm256_srl_epi32(a, shift_count), one);
    const __m256i rounded = _mm256_and_si256(_mm256_add_epi32(_mm256_add_epi32(a, half_less_one), last_kept), keep);
    const __m256 below = _mm256_sub_ps(_mm256_add_ps(_mm256_castsi256_ps(a), quantum_shift), quantum_shift);
    return _mm256_blendv_epi8(_mm256_castps_si256(below), rounded, _mm256_cmpgt_epi32(a, below_lowest_normal));
  }
};

// judge_fast on the AVX2 path: one recipe over a unit, block by block (`block` elements, a multiple of 16; a
// tensor scale is one 128-element block), with judge_element_fast's verdicts and float64 terms.
template <int kKind>
AMPI_AVX2 BlockVerdicts judge_fast_avx2(const UnitData& d, int64_t n, const ElementGrid& g, int64_t block,
                                        const BlockScaleAvx2* scales) {
  const CastAvx2 cast(g);
  const __m256i below_clip = _mm256_set1_epi32(static_cast<int32_t>(clip_bits(g) - 1u));
  const __m256i zero = _mm256_setzero_si256();
  __m256i q_zero = zero, saturated = zero;
  __m256d acc_lo = _mm256_setzero_pd(), acc_hi = _mm256_setzero_pd();
  alignas(32) double tail[8];
  for (int64_t first = 0, b = 0; first < n; first += block, ++b) {
    const __m256 scale32 = _mm256_set1_ps(scales[b].scale32);
    const __m256d dequant = _mm256_set1_pd(scales[b].dequant);
    const __m256d reciprocal = _mm256_set1_pd(scales[b].reciprocal);
    const int64_t end = std::min(n, first + block);
    for (int64_t i = first; i < end; i += 8) {
      const __m256 x = _mm256_load_ps(reinterpret_cast<const float*>(d.bits + i));  // |x|
      const __m256 v = kKind == kKindDivide ? _mm256_div_ps(x, scale32) : _mm256_mul_ps(x, scale32);
      const __m256i v_abs = _mm256_castps_si256(v);
      const __m256i q_abs = cast.of(v_abs);
      saturated = _mm256_sub_epi32(saturated, _mm256_cmpgt_epi32(v_abs, below_clip));
      q_zero = _mm256_sub_epi32(q_zero, _mm256_cmpeq_epi32(q_abs, zero));
      const __m256 q = _mm256_castsi256_ps(q_abs);
      const __m256d q_lo = _mm256_cvtps_pd(_mm256_castps256_ps128(q));
      const __m256d q_hi = _mm256_cvtps_pd(_mm256_extractf128_ps(q, 1));
      const __m256d x_lo = _mm256_load_pd(d.x + i);
      const __m256d x_hi = _mm256_load_pd(d.x + i + 4);
      __m256d e_lo, e_hi;
      if constexpr (kKind == kKindFp32) {
        e_lo = _mm256_sub_pd(x_lo, dequantize_fp32(q_lo, dequant, reciprocal));
        e_hi = _mm256_sub_pd(x_hi, dequantize_fp32(q_hi, dequant, reciprocal));
      } else {  // x - q * dequant, the product exact (q's 2 to 4 bits times a power of two or a 24-bit scale)
        e_lo = _mm256_fnmadd_pd(q_lo, dequant, x_lo);
        e_hi = _mm256_fnmadd_pd(q_hi, dequant, x_hi);
      }
      const __m256d sq_lo = square_apart(e_lo), sq_hi = square_apart(e_hi);
      if (i + 8 <= n) {
        acc_lo = _mm256_add_pd(acc_lo, sq_lo);
        acc_hi = _mm256_add_pd(acc_hi, sq_hi);
      } else {
        _mm256_store_pd(tail, sq_lo);
        _mm256_store_pd(tail + 4, sq_hi);
      }
    }
  }
  return {lanes_int_total(q_zero) - d.zero_lanes, lanes_int_total(saturated), lanes_total(acc_lo, acc_hi, tail, n % 8)};
}
// judge_recipe on the AVX2 path, the scale rule fixed at compile time: each block's scale (block_scale, counted as
// judge_recipe counts it) and its broadcast form; judge_fast_avx2 over the unit where judge_recipe would take the fast
// loop, else the same exact path, block by block.
// NVFP4's block scales of a unit's eight 16-element blocks at once (nvfp4_scale, per block), for a unit that takes the
// fast loop: where every float32 operation of nvfp4_scale is the hardware's (fl32_divide, fl32_multiply: operands
// and results normal) and every total scale is normal or 0; else false, and nothing is counted or written.
// Blocks past the unit's end have amax 0 (judge_unit): they take no part.
AMPI_AVX2 bool nvfp4_scales_avx2(const uint32_t* sub_amax, int64_t blocks, uint32_t decode_bits,
                                 BlockScaleAvx2* per_block, int64_t* counts) {
  static_assert(kSubBlocks == 8, "one vector of sub-block amaxes");
  if (decode_bits < kImplicitBit32 || decode_bits >= kInfBits32) return false;
  const __m256i below_normal = _mm256_set1_epi32(static_cast<int32_t>(kImplicitBit32 - 1u));
  const __m256i zero = _mm256_setzero_si256();
  const __m256i amax = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sub_amax));
  const __m256 decode = _mm256_set1_ps(bits_as_float32(decode_bits));
  const __m256i nonzero = _mm256_cmpgt_epi32(amax, zero);
  const __m256 per_six = _mm256_div_ps(_mm256_castsi256_ps(amax), _mm256_set1_ps(bits_as_float32(e2m1_grid().max_bits)));
  const __m256 wanted = _mm256_div_ps(per_six, decode);  // +Inf where it overflows, as fl32_divide gives
  const __m256i s_b = CastAvx2(e4m3_grid()).of(_mm256_castps_si256(wanted));
  const __m256 total = _mm256_mul_ps(decode, _mm256_castsi256_ps(s_b));
  const __m256i s_b_zero = _mm256_cmpeq_epi32(s_b, zero);
  __m256i ok = _mm256_and_si256(_mm256_cmpgt_epi32(amax, below_normal),
                                _mm256_cmpgt_epi32(_mm256_castps_si256(per_six), below_normal));
  ok = _mm256_and_si256(ok, _mm256_cmpgt_epi32(_mm256_castps_si256(wanted), below_normal));
  ok = _mm256_and_si256(ok, _mm256_or_si256(s_b_zero, _mm256_cmpgt_epi32(_mm256_castps_si256(total), below_normal)));
  if (_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_andnot_si256(ok, nonzero))) != 0) return false;
  const __m256i flushed = _mm256_and_si256(
      nonzero, _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(kE4M3MinNormalBits)), s_b));
  const __m256i all_zero = _mm256_or_si256(s_b_zero, _mm256_cmpeq_epi32(nonzero, zero));
  alignas(32) float totals[kSubBlocks];
  _mm256_store_ps(totals, total);
  const int zero_mask = _mm256_movemask_ps(_mm256_castsi256_ps(all_zero));
  for (int64_t b = 0; b < blocks; ++b) {
    per_block[b] = (zero_mask >> b) & 1 ? BlockScaleAvx2{__builtin_inff(), 0.0, 0.0}
                                        : BlockScaleAvx2{totals[b], static_cast<double>(totals[b]), 0.0};
  }
  counts[2] += blocks;
  counts[3] += __builtin_popcount(static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(flushed))));
  return true;
}

// The block of each scale rule, at compile time (kRecipes says the same: checked below), so that a unit's blocks are
// counted without an integer division.
constexpr int64_t rule_block(int32_t rule) {
  return rule == kScaleNvfp4 ? 16 : rule == kScaleE8M0Floor || rule == kScaleE8M0Rceil ? 32 : kLargestBlock;
}
constexpr bool rule_blocks_match_recipes() {
  for (const RecipeSpec& r : kRecipes) {
    if ((r.block == 0 ? kLargestBlock : r.block) != rule_block(r.scale)) return false;
  }
  return true;
}
static_assert(rule_blocks_match_recipes(), "each scale rule has one block size (rule_block)");

template <int kRule>
AMPI_AVX2 void judge_recipe_avx2(const UnitData& d, int64_t n, bool has_subnormal, const RecipeSpec& spec,
                                 const ElementGrid& g, const uint32_t* sub_amax, const BlockScale& tensor_scale,
                                 uint32_t decode_bits, int64_t* counts, double& sq_error) {
  constexpr int kMaxBlocks = kLargestBlock / kSmallestBlock;
  constexpr bool kPowerOfTwo = kRule == kScaleE8M0Floor || kRule == kScaleE8M0Rceil;
  BlockScale scales[kMaxBlocks];
  BlockScaleAvx2 per_block[kMaxBlocks];
  (void)spec;
  constexpr int64_t block = rule_block(kRule);
  constexpr int64_t subs_per_block = block / kSmallestBlock;
  const int64_t blocks = (n + block - 1) / block;
  if constexpr (kRule == kScaleNvfp4) {
    if (!has_subnormal && nvfp4_scales_avx2(sub_amax, blocks, decode_bits, per_block, counts)) {
      const BlockVerdicts v = judge_fast_avx2<kKindDivide>(d, n, g, block, per_block);
      counts[0] += v.flushed;
      counts[1] += v.saturated;
      sq_error += v.sq_error;
      return;
    }
  }
  bool fast = !has_subnormal;
  for (int64_t b = 0; b < blocks; ++b) {
    BlockScale s;
    if constexpr (kRule == kScaleFp32Tensor) {
      s = tensor_scale;
    } else {
      uint32_t amax = 0;  // sub-blocks past the unit's end are 0 (judge_unit)
      for (int64_t k = b * subs_per_block; k < (b + 1) * subs_per_block; ++k) amax = std::max(amax, sub_amax[k]);
      s = block_scale(kRule, g, amax, decode_bits);
      counts[2] += 1;
      counts[3] += s.scale_flushed;
    }
    scales[b] = s;
    if constexpr (kPowerOfTwo) {
      // 2^-X <= 2^127 is never above float32's range; 2^X, its exact inverse, on the bits: the exponent field
      // 1023 - X becomes 1023 + X (no division per block)
      fast = fast && s.scale >= kFloatMinNormal;
      per_block[b] = {static_cast<float>(s.scale), bits_as_float64(0x7FE0000000000000ull - float64_as_bits(s.scale)),
                      0.0};
    } else if constexpr (kRule == kScaleNvfp4) {
      // a total scale of 0 (all_zero): v = x / +Inf = +-0, dequantized by 0, judge_element's verdict (judge_recipe)
      fast = fast && (scale_is_normal_float(s) || s.all_zero);
      per_block[b] = s.all_zero ? BlockScaleAvx2{__builtin_inff(), 0.0, 0.0}
                                : BlockScaleAvx2{static_cast<float>(s.scale), s.scale, 0.0};
    } else {
      fast = fast && scale_is_normal_float(s);
      per_block[b] = {static_cast<float>(s.scale), s.scale, 1.0 / s.scale};
    }
  }
  BlockVerdicts v{0, 0, 0.0};
  if (fast) {
    constexpr int kKind = kPowerOfTwo ? kKindPowerOfTwo : kRule == kScaleNvfp4 ? kKindDivide : kKindFp32;
    v = judge_fast_avx2<kKind>(d, n, g, block, per_block);
  } else {
    v = judge_exact_blocks(d.bits, n, block, g, scales);  // on |x|: the same verdicts and squares (UnitData)
  }
  counts[0] += v.flushed;
  counts[1] += v.saturated;
  sq_error += v.sq_error;
}

// The recipe's rule as a template argument.
void judge_recipe_avx2(const UnitData& d, int64_t n, bool has_subnormal, const RecipeSpec& spec, const ElementGrid& g,
                       const uint32_t* sub_amax, const BlockScale& tensor_scale, uint32_t decode_bits, int64_t* counts,
                       double& sq_error) {
  switch (spec.scale) {
    case kScaleFp32Tensor:
      return judge_recipe_avx2<kScaleFp32Tensor>(d, n, has_subnormal, spec, g, sub_amax, tensor_scale, decode_bits,
                                                 counts, sq_error);
    case kScaleFp32Block:
      return judge_recipe_avx2<kScaleFp32Block>(d, n, has_subnormal, spec, g, sub_amax, tensor_scale, decode_bits,
                                                counts, sq_error);
    case kScaleE8M0Floor:
      return judge_recipe_avx2<kScaleE8M0Floor>(d, n, has_subnormal, spec, g, sub_amax, tensor_scale, decode_bits,
                                                counts, sq_error);
    case kScaleE8M0Rceil:
      return judge_recipe_avx2<kScaleE8M0Rceil>(d, n, has_subnormal, spec, g, sub_amax, tensor_scale, decode_bits,
                                                counts, sq_error);
    default:
      return judge_recipe_avx2<kScaleNvfp4>(d, n, has_subnormal, spec, g, sub_amax, tensor_scale, decode_bits, counts,
                                            sq_error);
  }
}
#endif  // AMPI_AVX2_PATH

// One recipe on a unit (finite elements; non-finite ones were set to 0, which counts nothing): each block's scale
// (one for a tensor-scaled recipe), then judge_element_fast over the whole unit where its conditions hold for every
// block (no float32 subnormal element; normal float32 scales, or an NVFP4 total scale of 0), else each block by the
// exact judge_element, so the verdicts do not depend on the FPU's flush-to-zero mode.
AMPI_CPU_CLONES void judge_recipe(const uint32_t* bits, int64_t n, bool has_subnormal, bool wide,
                                  const RecipeSpec& spec, const ElementGrid& g, const uint32_t* sub_amax,
                                  const BlockScale& tensor_scale, uint32_t decode_bits, int64_t* counts,
                                  double& sq_error) {
  constexpr int kMaxBlocks = kLargestBlock / kSmallestBlock;
  BlockScale scales[kMaxBlocks];
  const int64_t block = spec.block == 0 ? kLargestBlock : spec.block;
  const int64_t subs_per_block = block / kSmallestBlock;
  const int64_t subs = (n + kSmallestBlock - 1) / kSmallestBlock;
  const int64_t blocks = (n + block - 1) / block;
  bool fast = !has_subnormal;
  for (int64_t b = 0; b < blocks; ++b) {
    if (spec.block == 0) {  // one scale for the tensor: its blocks are counted once, at the end
      scales[b] = tensor_scale;
    } else {
      uint32_t amax = 0;
      for (int64_t k = b * subs_per_block; k < std::min(subs, (b + 1) * subs_per_block); ++k) {
        amax = std::max(amax, sub_amax[k]);
      }
      scales[b] = block_scale(spec.scale, g, amax, decode_bits);
      counts[2] += 1;
      counts[3] += scales[b].scale_flushed;
    }
    fast = fast && (scale_is_normal_float(scales[b]) || (scales[b].all_zero && scales[b].divide));
  }
  BlockVerdicts v{0, 0, 0.0};
  if (fast) {
    const bool power_of_two = spec.scale == kScaleE8M0Floor || spec.scale == kScaleE8M0Rceil;
    UnitScales per_element;
    for (int64_t b = 0; b < blocks; ++b) {  // block by block: no division per element
      const double scale = scales[b].scale;
      // An NVFP4 block whose total scale is 0 (all_zero) divides by +Inf and dequantizes by 0: v = +-0, q = +-0, so
      // judge_element_fast gives judge_element's all_zero verdict exactly (flushed where x != 0, not saturated,
      // error x, squared x * x), x being no float32 subnormal here.
      const bool all_zero = scales[b].all_zero;
      const float scale32 = all_zero ? __builtin_inff() : static_cast<float>(scale);  // else exact: a float32 value
      const double dequant = all_zero ? 0.0 : power_of_two ? 1.0 / scale : scale;  // 2^X exactly, for 2^-X
      const int64_t end = std::min(n, (b + 1) * block);
      for (int64_t i = b * block; i < end; ++i) {
        per_element.dequant[i] = dequant;
        per_element.scale32[i] = scale32;
      }
    }
    if (scales[0].divide) {
      v = (wide ? judge_fast_divide_wide : judge_fast_divide)(bits, n, g, per_element);
    } else if (power_of_two) {
      v = (wide ? judge_fast_power_of_two_wide : judge_fast_power_of_two)(bits, n, g, per_element);
    } else {
      v = (wide ? judge_fast_fp32_wide : judge_fast_fp32)(bits, n, g, per_element);
    }
  } else {
    v = judge_exact_blocks(bits, n, block, g, scales);
  }
  counts[0] += v.flushed;
  counts[1] += v.saturated;
  sq_error += v.sq_error;
}

// The first look at a unit's bits: counts nonzero, nonfinite and float32-subnormal elements, sets NaN/Inf to 0 (they
// take no part in any amax or sum), and returns the sum of squares; sub_amax gets each 16-element sub-block's amax.
// Branch-free (both widenings of x computed, one kept), so the cloned loops vectorise.
template <bool kWide>
__attribute__((always_inline)) inline UnitScan scan_unit(uint32_t* __restrict bits, int64_t n,
                                                     uint32_t* __restrict sub_amax) {
  int32_t nonzero = 0, nonfinite = 0, subnormal = 0;
  double squares[kLargestBlock];
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = bits[i] & kAbsMask32;
    const bool finite = is_finite32(a);
    nonfinite += !finite;
    nonzero += finite & (a != 0);
    const bool tiny = a < kImplicitBit32;
    subnormal += (a != 0) & tiny;
    bits[i] = finite ? bits[i] : 0u;
    // x exactly as float64: the hardware's widening of a normal float32 (no DAZ there), or mantissa * 2^-149
    const double wide = static_cast<double>(bits_as_float32(finite && !tiny ? a : 0u));
    const double small = static_cast<double>(static_cast<int32_t>(a & kMantissaMask32)) * kFloatSubnormalUnit;
    const double x = tiny ? small : wide;
    squares[i] = x * x;
  }
  for (int64_t first = 0; first < n; first += kSmallestBlock) {  // a register per sub-block, not memory
    uint32_t m = 0;
    const int64_t end = std::min<int64_t>(n, first + kSmallestBlock);
    for (int64_t i = first; i < end; ++i) m = std::max(m, bits[i] & kAbsMask32);
    sub_amax[first / kSmallestBlock] = m;
  }
  return {nonzero, nonfinite, subnormal, sum_in_lanes<kWide>(squares, n)};
}
AMPI_CPU_CLONES UnitScan scan_unit_paired(uint32_t* bits, int64_t n, uint32_t* sub_amax) {
  return scan_unit<false>(bits, n, sub_amax);
}
AMPI_CPU_CLONES UnitScan scan_unit_wide(uint32_t* bits, int64_t n, uint32_t* sub_amax) {
  return scan_unit<true>(bits, n, sub_amax);
}

// One unit: read, per-tensor counts and squares, sub-block amaxes, then every recipe.
void judge_unit(const ReadinessView& view, UnitRange range, const ReadinessCall& call, const TensorRecipes& tr,
                ChunkTotals& out) {
  const int64_t n = range.length;
  uint32_t sub_amax[kSubBlocks] = {};
  const bool wide = wide_lanes();
#ifdef AMPI_AVX2_PATH
  UnitData avx2_data;
  UnitData* avx2_unit = avx2_path() ? &avx2_data : nullptr;
  uint32_t* bits = avx2_data.bits;  // the cloned loops use the same buffer
#else
  uint32_t bits_buffer[kLargestBlock];
  uint32_t* bits = bits_buffer;
#endif
  load_f32_bits(view.data, view.dtype, range.start, n, bits);  // exact (common/cpu_clones.h)
  UnitScan scan;
#ifdef AMPI_AVX2_PATH
  if (avx2_unit != nullptr) {
    const int64_t padded = (n + kSmallestBlock - 1) / kSmallestBlock * kSmallestBlock;  // what its loads reach
    std::memset(bits + n, 0, sizeof(uint32_t) * (padded - n));
    scan = scan_unit_avx2(avx2_data, n, sub_amax);
  } else
#endif
  {
    scan = (wide ? scan_unit_wide : scan_unit_paired)(bits, n, sub_amax);
  }
  const int32_t subnormal = scan.subnormal;
  out.counts[1] += scan.nonzero;
  out.counts[2] += scan.nonfinite;
  out.sums[0] += scan.sq_signal;
  for (const uint32_t m : sub_amax) out.amax = std::max(out.amax, m);
  for (int r = 0; r < call.num_recipes; ++r) {
    int64_t* counts = out.counts + kReadinessFixedCounts + kReadinessCountsPerRecipe * r;
#ifdef AMPI_AVX2_PATH
    if (avx2_unit != nullptr) {
      judge_recipe_avx2(avx2_data, n, subnormal != 0, *tr.spec[r], tr.grid[r], sub_amax, tr.tensor_scale[r],
                        tr.decode_bits, counts, out.sums[kReadinessFixedSums + r]);
      continue;
    }
#endif
    judge_recipe(bits, n, subnormal != 0, wide, *tr.spec[r], tr.grid[r], sub_amax, tr.tensor_scale[r], tr.decode_bits,
                 counts, out.sums[kReadinessFixedSums + r]);
  }
}

// The finite amax of elements [start, start + n) of a view, as float32 bits (cloned: SSE2 has no unsigned max).
// Read in place, in the tensor's own width: the magnitudes of bf16 and fp16 bits order as their values do, and
// widening is monotone, so the widened max of the 16-bit magnitudes is the max of the widened ones. Inf and NaN are
// masked to 0 (GCC 12 leaves the max of a select scalar: the reduction variable is used twice).
AMPI_CPU_CLONES uint32_t finite_amax_f32(const uint32_t* __restrict p, int64_t n) {
  uint32_t amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = p[i] & kAbsMask32;
    const uint32_t f = a & (0u - static_cast<uint32_t>(a < kInfBits32));  // a, or 0 for Inf / NaN
    amax = std::max(amax, f);
  }
  return amax;
}
// |bits| of the largest finite value of 16-bit elements, finite below `inf_bits` (the format's +Inf).
AMPI_CPU_CLONES uint16_t finite_amax_16(const uint16_t* __restrict p, int64_t n, uint16_t inf_bits) {
  uint16_t amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t a = static_cast<uint16_t>(p[i] & kAbsMask16);
    const uint16_t f = static_cast<uint16_t>(a & (0u - static_cast<uint32_t>(a < inf_bits)));
    amax = std::max(amax, f);
  }
  return amax;
}
uint32_t finite_amax(const ReadinessView& view, int64_t start, int64_t n) {
  switch (view.dtype) {
    case kFloat32:
      return finite_amax_f32(static_cast<const uint32_t*>(view.data) + start, n);
    case kBFloat16:
      return bf16_to_f32_bits(finite_amax_16(static_cast<const uint16_t*>(view.data) + start, n, kBf16InfBits));
    default:
      return fp16_to_f32_bits(finite_amax_16(static_cast<const uint16_t*>(view.data) + start, n, kFp16InfBits));
  }
}

TallyOutputs run_readiness_cpu(const ReadinessCall& call) {
  TallyOutputs out = allocate_readiness_outputs(call.num_tensors, call.num_recipes, Device(DeviceType::CPU));
  const Plan plan(call);
  const int64_t num_views = static_cast<int64_t>(call.views.size());

  // The tensor amax each view's recipes use: given, or measured (a first pass where a recipe needs it first).
  std::vector<uint32_t> amax_bits(num_views, 0u);
  if (call.tensor_amax != nullptr) {
    // |amax|: a given -0.0 is 0 (negative amaxes are refused where they can be read without a sync)
    for (int64_t v = 0; v < num_views; ++v) {
      amax_bits[v] = float32_as_bits(call.tensor_amax[call.views[v].out_row]) & kAbsMask32;
    }
  } else if (call.needs_tensor_amax) {
    std::vector<uint32_t> chunk_amax(plan.total_chunks, 0u);
    torch::stable::parallel_for(0, plan.total_chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const int64_t v = plan.view_of(c);
        const ViewWork& w = plan.work[v];
        const int64_t first_unit = (c - w.first_chunk) * w.units_per_chunk;
        const int64_t last_unit = std::min(w.units, first_unit + w.units_per_chunk);  // exclusive
        const int64_t start = unit_range(call.views[v], w, first_unit).start;
        const UnitRange last = unit_range(call.views[v], w, last_unit - 1);
        chunk_amax[c] = finite_amax(call.views[v], start, last.start + last.length - start);
      }
    });
    for (int64_t c = 0; c < plan.total_chunks; ++c) {
      uint32_t& a = amax_bits[plan.view_of(c)];
      a = std::max(a, chunk_amax[c]);
    }
  }
  std::vector<TensorRecipes> recipes;
  recipes.reserve(num_views);
  for (int64_t v = 0; v < num_views; ++v) recipes.push_back(tensor_recipes(call, amax_bits[v]));

  std::vector<ChunkTotals> totals(plan.total_chunks);
  torch::stable::parallel_for(0, plan.total_chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t v = plan.view_of(c);
      const ViewWork& w = plan.work[v];
      ChunkTotals& t = totals[c];
      std::memset(&t, 0, sizeof t);
      const int64_t first_unit = (c - w.first_chunk) * w.units_per_chunk;
      const int64_t last_unit = std::min(w.units, first_unit + w.units_per_chunk);
      for (int64_t u = first_unit; u < last_unit; ++u) {
        const UnitRange range = unit_range(call.views[v], w, u);
        judge_unit(call.views[v], range, call, recipes[v], t);
      }
    }
  });

  int64_t* counts = static_cast<int64_t*>(out.counts.data_ptr());
  double* sums = static_cast<double*>(out.sums.data_ptr());
  float* amax = static_cast<float*>(out.amax.data_ptr());
  const int count_columns = readiness_count_columns(call.num_recipes);
  const int sum_columns = readiness_sum_columns(call.num_recipes);
  for (int64_t v = 0; v < num_views; ++v) {
    const ReadinessView& view = call.views[v];
    const ViewWork& w = plan.work[v];
    const int64_t last_chunk = v + 1 < num_views ? plan.work[v + 1].first_chunk : plan.total_chunks;
    int64_t* row = counts + view.out_row * count_columns;
    double* sum_row = sums + view.out_row * sum_columns;
    uint32_t a = amax_bits[v];
    for (int64_t c = w.first_chunk; c < last_chunk; ++c) {
      for (int k = 0; k < count_columns; ++k) row[k] += totals[c].counts[k];
      for (int k = 0; k < sum_columns; ++k) sum_row[k] += totals[c].sums[k];
      if (call.tensor_amax == nullptr) a = std::max(a, totals[c].amax);  // measured: the max of its blocks'
    }
    row[0] = view.numel;
    for (int r = 0; r < call.num_recipes; ++r) {
      if (recipes[v].spec[r]->block != 0) continue;
      row[kReadinessFixedCounts + kReadinessCountsPerRecipe * r + 2] = 1;  // the tensor is the block
      row[kReadinessFixedCounts + kReadinessCountsPerRecipe * r + 3] = recipes[v].tensor_scale[r].scale_flushed;
    }
    amax[view.out_row] = bits_as_float32(a);
  }
  if (call.tensor_amax != nullptr) {  // empty tensors too: the amax used is the one given
    for (int64_t t = 0; t < call.num_tensors; ++t) amax[t] = call.tensor_amax[t];
  }
  return out;
}

// The boxed kernel (TORCH_BOX) takes its arguments by value.
std::tuple<Tensor, Tensor, Tensor> format_readiness_cpu(std::vector<Tensor> tensors, std::vector<int64_t> recipes,
                                                        std::optional<Tensor> tensor_amax) {
  const TallyOutputs out = run_readiness_cpu(prepare_readiness_call(tensors, recipes, tensor_amax));
  return out.returned();
}

}  // namespace
}  // namespace amp_inspect

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CPU, m) {
  m.impl("format_readiness", TORCH_BOX(&amp_inspect::format_readiness_cpu));
}
