// tensor_stats_kernels.cuh: the CUDA kernels of amp_inspect::tensor_stats and unscale_stats_, and the host
// logic that launches them, written once for two compilers:
//   - nvcc, through tensor_stats_cuda.cu: the kernels that run on the GPU;
//   - the host C++ compiler, through tensor_stats_emu.cpp with cuda_emu.h in front: the same source run on the
//     CPU, each CUDA thread of a block a real host thread (tests only; see tests/test_cuda_emu.py).
// Nothing in this file may depend on which of the two compiles it, beyond what cuda_emu.h defines.
// Why one file of about 700 lines: the kernels and the launch sequence that sizes their grid, zeroes their
// workspace and orders their launches must be compiled together by both compilers, or the emulation would
// test a launch sequence the GPU never runs.
//
// Work layout. The call's tensors are cut into chunks of `chunk_elems` elements (never crossing a tensor) and
// each block takes one contiguous run of chunks. A block walks its run tensor by tensor: every thread counts
// its elements in registers, the exponent histogram goes to one shared-memory histogram per warp, and when the
// block leaves a tensor (or has counted kMaxFlushElems of it) one packed block reduction merges everything into
// that tensor's row of a zeroed workspace with one global atomic per counter. The finalize turns the workspace
// rows into the user's outputs (overflow / subnormal / underflow from the raw threshold counts, extremes as
// floats) and, for unscale_stats_, sets found_inf: in a call of at most kFinalizeInBlockRows rows the last
// stats block to finish does it (a counter in the workspace), else a second small kernel.
//
// One kernel per mode, format count and input dtype (48), so each is register-allocated for its own dtype with
// no calls; run_stats launches one per run of views of a dtype (the ops group the views by dtype first).
//
// Per element, on the common path (count_batch says why it is exact): the conversion to float32 bits and an
// abs, a min and a max of |bits|, a float32 square-add, and a shared-memory atomic for the histogram bin. The
// threshold counts, zeros, NaN/Inf, the extremes and the squares' range are decided once per 16-element batch
// from its smallest and largest |bits|, per element only in a batch that straddles (warp vote). Squares are
// summed in float32 over a batch and added to a float64 total per batch; a batch whose largest |v| lies outside
// [2^-50, 2^60) is summed in float64 instead (see kFloatSquaresFrom), so the relative error stays below 2^-18
// whatever the values. bench/sass_per_element.py counts the SASS of every variant's hot loop.
#pragma once

#include <cstdint>

#include "common/dtype_load.cuh"  // also the namespace that keeps the GPU build's symbols apart from the emulation's
#include "common/numerics.h"
#include "common/warp_reduce.cuh"
#include "tensor_stats/tensor_stats.h"

namespace amp_inspect {
namespace kernels {
inline namespace AMPI_KERNELS_NAMESPACE {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
// 2 blocks of 256 per SM: up to 128 registers per thread. At 3 blocks (80 registers) every 4-format and
// 16-bit variant spilled; at 2, none does, and 16 warps x 32 threads x 4 loads x 16 B = 32 KB per SM are in
// flight after each load round (Little's law at ~4 TB/s and ~0.8 us wants 21-27 KB; bench/README.md).
constexpr int kMinBlocksPerSm = 2;
constexpr int kVectorBytes = 16;
// 16-byte loads each thread issues before using any of them (memory-level parallelism), every dtype: a load
// round is 16 fp32, 32 fp16/bf16 or 8 fp64 elements per thread.
template <typename W>
constexpr int kLoadsInFlight = 4;
// 16-byte vectors per counted batch: 16 elements of 4-byte words, 16 of 2-byte words (a round is two
// batches: 32 elements at once held 128 registers and spilled), 4 of 8-byte words (likewise).
template <typename W>
constexpr int kVectorsPerBatch = sizeof(W) == 4 ? 4 : 2;
// A block flushes its counts at least this often, so per-thread uint32 counters never wrap.
constexpr int64_t kMaxFlushElems = int64_t{1} << 30;
constexpr int kFinalizeThreads = 256;
// Calls of at most this many rows finalize in their last stats block (one block copies 256 histogram bins per
// row; beyond this a separate finalize kernel, many blocks, is faster than one block).
constexpr int64_t kFinalizeInBlockRows = 16;
// The separate finalize kernel: one block per row, at most this many (a grid-stride loop over the rows).
constexpr int64_t kMaxFinalizeBlocks = 1024;
// Batches (16 values) sum their squares in float32 where tensor_stats.h's kFloatSquaresFrom / kFloatSquaresBelow
// allow it, else in float64.

// What a launch does besides counting.
enum Mode : int { kPlain = kLaunchPlain, kScaled = kLaunchScaled, kUnscale = kLaunchUnscale };

// Where the finalize writes the op's outputs.
struct FinalizeParams {
  const int64_t* workspace;
  int64_t num_tensors;
  int32_t num_formats;
  float* found_inf;  // unscale_stats_ only, else null
  int64_t* counts;
  int64_t* hist;
  float* amax;
  float* amin_nonzero;
  double* sumsq;
};

// Everything a launch reads, passed by value (the CUDA driver copies it into constant memory).
struct StatsParams {
  const TensorView* views;  // the device table, or null: the views are in `inline_views`
  int64_t num_views;
  int64_t first_chunk;      // the launch covers chunks [first_chunk, first_chunk + num_chunks)
  int64_t num_chunks;
  int64_t chunk_elems;
  FormatBounds bounds[kMaxFormats];
  // Per Tally word kZero + i (the launch's format count F), the |bits| threshold it counts below: 1 (zero),
  // then overflow_from[F], normal_from[F], zero_upto[F] + 1 ("at or below zero_upto" is "below zero_upto + 1",
  // and zero_upto < the largest |bits|). Read in the hot loop straight from the constant bank: no registers.
  uint32_t below[1 + 3 * kMaxFormats];
  int32_t num_formats;
  float scale_value;
  const float* scale_ptr;  // device memory, or null to use scale_value (kScaled only)
  const float* inv_scale;  // kUnscale only
  int64_t* workspace;      // [num_tensors, workspace_columns]
  // A small call (at most kFinalizeInBlockRows rows) finalizes in the last of its stats blocks to finish:
  // total_blocks is the grid of all its stats launches together, counted in workspace row 0's done column.
  int32_t finalize_in_block;
  int64_t total_blocks;
  FinalizeParams fin;
  TensorView inline_views[kInlineViews];
};

// ---- per-thread counting ----

// One thread's counts since the last flush. Word order matches workspace columns 1..: nan, posinf, neginf,
// zero, over[F], below[F], at_zero[F]. Words kZero.. each count |bits| below one threshold (Judge::below); the
// over[F] words thus hold |bits| < overflow_from, and flush turns them into at_or_above_overflow (the count of
// the piece less them).
template <int kFormats>
struct Tally {
  static constexpr int kWords = 4 + 3 * kFormats;
  static constexpr int kNan = 0, kPosInf = 1, kNegInf = 2, kZero = 3, kOver = 4, kBelow = 4 + kFormats,
                       kAtZero = 4 + 2 * kFormats;
  uint32_t n[kWords];
  uint32_t max_abs;            // float32 bits of the largest finite |v|
  uint32_t min_abs_minus_one;  // min over elements of (|bits| - 1), wrapping: zeros give 0xFFFFFFFF
  bool nonzero_rounded_to_zero;  // float64 only: a nonzero |x| whose float32 is 0 (the minimum is then 0)
  double sumsq;

  // The min nonzero |v| as float32 bits, kInfBits32 for none.
  __device__ uint32_t min_abs_nonzero() const {
    if (nonzero_rounded_to_zero) return 0u;
    return min_abs_minus_one >= kInfBits32 - 1u ? kInfBits32 : min_abs_minus_one + 1u;
  }

  __device__ void clear() {
#pragma unroll
    for (int k = 0; k < kWords; ++k) n[k] = 0;
    max_abs = 0;
    min_abs_minus_one = 0xFFFFFFFFu;
    nonzero_rounded_to_zero = false;
    sumsq = 0.0;
  }
};

// The block's exponent histograms, one per warp so that same-bin atomics contend only within a warp. At file
// scope, so every function addresses shared memory directly and its atomics are shared-memory atomics (a
// pointer passed to a function would be generic: slower global-scope atomics).
__shared__ uint32_t warp_histograms[kWarps][kHistBins];

// What the counting functions need besides the tally, fixed for a launch.
template <int kFormats>
struct Judge {
  static constexpr int kThresholds = 1 + 3 * kFormats;
  // The launch's parameters (__grid_constant__: the thresholds are instruction operands from the constant
  // bank, which nothing can alias, so they take no registers and are never reloaded).
  const StatsParams& p;
  int warp;  // this thread's warp: its row of warp_histograms
  float scale;
  float inv_scale;
};

// Whether `p` holds in any lane of the warp that runs this line with the caller. Every use below is exact
// whatever the other lanes answer (it picks between two exact ways of counting), as long as the answer is true
// where the caller's own `p` is; so the mask is whichever lanes are active, and loops need not be warp-uniform.
__device__ __forceinline__ bool any_in_warp(bool p) { return __any_sync(__activemask(), p); }

// Adds to `counter` how many of a[0..kCount) lie below `threshold`, given lo and hi, their smallest and
// largest value. Where no lane's batch straddles the threshold (lo < threshold <= hi), the whole batch is on
// one side of it: kCount if hi is below, else none. Otherwise every element is tested (the branch is uniform
// over the warp, so a straddling lane does not make the others pay twice).
// abs_of(k) gives a[k] (recomputed from the stored words: cheaper than holding kCount more registers).
template <int kCount, class AbsOf>
__device__ __forceinline__ void count_below(uint32_t& counter, AbsOf&& abs_of, uint32_t lo, uint32_t hi,
                                            uint32_t threshold) {
  if constexpr (kCount == 1) {
    counter += below32(abs_of(0), threshold);
  } else if (any_in_warp(lo < threshold && threshold <= hi)) {
#pragma unroll
    for (int k = 0; k < kCount; ++k) counter += below32(abs_of(k), threshold);
  } else {
    counter += hi < threshold ? static_cast<uint32_t>(kCount) : 0u;
  }
}

// NaN / +Inf / -Inf of float32 bits, for the rare batch that holds any.
template <int kFormats>
__device__ __forceinline__ void split_nonfinite32(Tally<kFormats>& t, uint32_t bits) {
  using T = Tally<kFormats>;
  t.n[T::kNan] += (bits & kAbsMask32) > kInfBits32;
  t.n[T::kPosInf] += bits == kInfBits32;
  t.n[T::kNegInf] += bits == kNegInfBits32;
}

// The storage word of each dtype (Storage) and its float32 bits (stored_as_f32_bits): common/dtype_load.cuh.

// x * inv_scale in the tensor's dtype, as torch's unscale kernel computes it (float32 math rounded to the
// dtype; float64 math for float64).
template <int kDtype>
__device__ __forceinline__ typename Storage<kDtype>::type unscaled(typename Storage<kDtype>::type raw,
                                                                  float inv_scale) {
  if constexpr (kDtype == kFloat32) {
    return __float_as_uint(__fmul_rn(__uint_as_float(raw), inv_scale));
  } else if constexpr (kDtype == kFloat64) {
    const double x = __longlong_as_double(static_cast<long long>(raw));
    return static_cast<uint64_t>(__double_as_longlong(__dmul_rn(x, static_cast<double>(inv_scale))));
  } else if constexpr (kDtype == kFloat16) {
    return __half_as_ushort(__float2half_rn(__fmul_rn(__half2float(__ushort_as_half(raw)), inv_scale)));
  } else {
    return __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(__uint_as_float(bf16_to_f32_bits(raw)), inv_scale)));
  }
}

// Whether a dtype is judged on its exact float64 value (float64 without a scale) rather than as float32 bits.
template <int kDtype, int kMode>
constexpr bool kExact64 = kDtype == kFloat64 && kMode != kScaled;

// float32 bits of v for a stored value: scaled here when the launch has a scale.
template <int kDtype, int kMode>
__device__ __forceinline__ uint32_t judged_bits(typename Storage<kDtype>::type raw, float scale) {
  const uint32_t bits = stored_as_f32_bits<kDtype>(raw);
  if constexpr (kMode == kScaled) return __float_as_uint(__fmul_rn(__uint_as_float(bits), scale));
  return bits;
}

// Counts kCount stored values held in registers, then unscales them in place when the launch unscales.
//
// Why per batch, and why it is exact. Each thread holds its batch (16 values of a full batch) in registers.
// Their |bits| a[k] give the batch's smallest (lo) and largest (hi) |bits|, NaN and Inf included. Every
// statistic but the histogram is then decided once per batch where the batch lies on one side of what it
// tests, and per element only where it does not:
//   - each threshold count (count_below): if hi < t all kCount are below t, if lo >= t none is; only when
//     lo < t <= hi (the batch straddles t, in any lane of the warp) is every a[k] tested. Both ways give the
//     same count for every batch; the per-batch way is taken only where it is right.
//   - zeros are the threshold 1; the smallest nonzero |bits| is lo when lo != 0, else found per element in
//     the same straddling branch (a batch of only zeros has none);
//   - the largest finite |bits| and the float32 sum of squares are hi and the batch sum when hi lies in
//     [kFloatSquaresFrom, kFloatSquaresBelow) (then nothing in the batch is NaN or Inf); any other batch takes
//     the rare path, which redoes the extremes and squares per element and tells NaN / +Inf / -Inf apart.
// So the common path (no threshold straddled in the warp, no NaN/Inf, no value near float32's limits) costs
// per element a load share, the conversion, an abs, a min, a max, a fused square-add and the histogram atomic,
// and per batch a few instructions per threshold. The other way the issue offered (counts from the exponent
// histogram, corrections for the thresholds inside a binade) needs a per-element test for every threshold
// that is not on a binade edge, which is all of them (65520, 2^-14 - 2^-25, ...): it saves nothing here.
template <int kDtype, int kMode, int kFormats, class Words>
__device__ __forceinline__ void count_batch(Tally<kFormats>& t, Words& raw, const Judge<kFormats>& j) {
  using T = Tally<kFormats>;
  constexpr int kCount = Words::kCount;
  if constexpr (kExact64<kDtype, kMode>) {
    // float64 judged on its exact value: thresholds on the 64-bit pattern, squares in float64, extremes and
    // histogram on float32 of the value (rounding is monotonic, so that is float32 of the exact extreme).
    bool any_nonfinite = false;
#pragma unroll
    for (int k = 0; k < kCount; ++k) {
      const uint64_t a = raw.get(k) & kAbsMask64;
      const bool finite = is_finite64(a);
      any_nonfinite |= !finite;
      t.n[T::kZero] += static_cast<uint32_t>(below64(a, uint64_t{1}));
#pragma unroll
      for (int f = 0; f < kFormats; ++f) {
        t.n[T::kOver + f] += static_cast<uint32_t>(below64(a, j.p.bounds[f].overflow_from64));
        t.n[T::kBelow + f] += static_cast<uint32_t>(below64(a, j.p.bounds[f].normal_from64));
        t.n[T::kAtZero + f] += static_cast<uint32_t>(below64(a, j.p.bounds[f].zero_upto64 + 1u));
      }
      const double x = __longlong_as_double(static_cast<long long>(raw.get(k)));
      const uint32_t bits32 = __float_as_uint(__double2float_rn(x));
      const uint32_t a32 = bits32 & kAbsMask32;
      atomicAdd(&warp_histograms[j.warp][hist_bin(bits32)], 1u);
      if (finite) {
        t.max_abs = max(t.max_abs, a32);
        if (a != 0) {
          t.min_abs_minus_one = min(t.min_abs_minus_one, a32 - 1u);
          t.nonzero_rounded_to_zero |= a32 == 0;
        }
        t.sumsq += x * x;
      }
    }
    if (any_nonfinite) {
#pragma unroll
      for (int k = 0; k < kCount; ++k) {
        t.n[T::kNan] += (raw.get(k) & kAbsMask64) > kInfBits64;
        t.n[T::kPosInf] += raw.get(k) == kInfBits64;
        t.n[T::kNegInf] += raw.get(k) == kNegInfBits64;
      }
    }
  } else {
    uint32_t lo = 0xFFFFFFFFu;
    uint32_t hi = 0;
    float squares = 0.0f;
#pragma unroll
    for (int k = 0; k < kCount; ++k) {
      const uint32_t a = judged_bits<kDtype, kMode>(raw.get(k), j.scale) & kAbsMask32;
      lo = min(lo, a);
      hi = max(hi, a);
      atomicAdd(&warp_histograms[j.warp][a >> kExponentShift32], 1u);  // the exponent field of |bits|
      const float v = __uint_as_float(a);
      squares += v * v;
    }
    // From here on |bits| is recomputed from the stored words where needed (the rare branches), rather than
    // kept: kCount registers fewer, which is what keeps every variant free of spills. The empty asm tells the
    // compiler the words may have changed, so it cannot keep the values above alive instead.
    raw.hide();
    auto a = [&](int k) { return judged_bits<kDtype, kMode>(raw.get(k), j.scale) & kAbsMask32; };
    // Zeros, and the smallest nonzero |bits| (lo - 1 wraps to all ones when lo is 0: no change).
    t.min_abs_minus_one = min(t.min_abs_minus_one, lo - 1u);
    if constexpr (kCount == 1) {
      t.n[T::kZero] += below32(a(0), 1u);
    } else if (any_in_warp(lo == 0 && hi != 0)) {
#pragma unroll
      for (int k = 0; k < kCount; ++k) {
        const uint32_t a_k = a(k);
        t.n[T::kZero] += below32(a_k, 1u);
        t.min_abs_minus_one = min(t.min_abs_minus_one, a_k - 1u);
      }
    } else {
      t.n[T::kZero] += hi == 0 ? static_cast<uint32_t>(kCount) : 0u;
    }
#pragma unroll
    for (int i = 1; i < Judge<kFormats>::kThresholds; ++i) {
      count_below<kCount>(t.n[T::kZero + i], a, lo, hi, j.p.below[i]);
    }
    if (hi - kFloatSquaresFrom < kFloatSquaresBelow - kFloatSquaresFrom) {
      t.max_abs = max(t.max_abs, hi);
      t.sumsq += static_cast<double>(squares);
    } else if (hi != 0) {  // NaN/Inf in the batch, or values near float32's limits: per element, in float64
      uint32_t finite_max = 0;
#pragma unroll
      for (int k = 0; k < kCount; ++k) {
        const uint32_t a_k = a(k);
        const uint32_t finite_a = a_k < kInfBits32 ? a_k : 0u;
        finite_max = max(finite_max, finite_a);
        const double v = static_cast<double>(__uint_as_float(finite_a));
        t.sumsq += v * v;
      }
      t.max_abs = max(t.max_abs, finite_max);
      if (hi >= kInfBits32) {
#pragma unroll
        for (int k = 0; k < kCount; ++k) split_nonfinite32(t, judged_bits<kDtype, kMode>(raw.get(k), j.scale));
      }
    }
  }
  if constexpr (kMode == kUnscale) {
#pragma unroll
    for (int k = 0; k < kCount; ++k) raw.set(k, unscaled<kDtype>(raw.get(k), j.inv_scale));
  }
}

// kVectors 16-byte vectors held in registers, read and written as storage words W. Word k is taken out of
// the vector components with shifts (a union or a cast would send the vectors to local memory).
template <typename W, int kVectors>
struct VectorWords {
  static constexpr int kPerVector = kVectorBytes / static_cast<int>(sizeof(W));
  static constexpr int kCount = kVectors * kPerVector;
  uint4 vectors[kVectors];

  // An empty asm that may have changed every word: values computed from them before are not reused after.
  __device__ __forceinline__ void hide() {
#pragma unroll
    for (int l = 0; l < kVectors; ++l) {
      asm volatile("" : "+r"(vectors[l].x), "+r"(vectors[l].y), "+r"(vectors[l].z), "+r"(vectors[l].w));
    }
  }

  __device__ __forceinline__ static uint32_t& component(uint4& v, int c) {
    return c == 0 ? v.x : (c == 1 ? v.y : (c == 2 ? v.z : v.w));
  }
  __device__ __forceinline__ W get(int k) {
    uint4& v = vectors[k / kPerVector];
    const int i = k % kPerVector;
    if constexpr (sizeof(W) == 8) {
      return static_cast<W>(component(v, 2 * i)) | (static_cast<W>(component(v, 2 * i + 1)) << 32);
    } else if constexpr (sizeof(W) == 4) {
      return component(v, i);
    } else {
      return static_cast<W>(component(v, i / 2) >> (16 * (i % 2)));
    }
  }
  __device__ __forceinline__ void set(int k, W w) {
    uint4& v = vectors[k / kPerVector];
    const int i = k % kPerVector;
    if constexpr (sizeof(W) == 8) {
      component(v, 2 * i) = static_cast<uint32_t>(w);
      component(v, 2 * i + 1) = static_cast<uint32_t>(w >> 32);
    } else if constexpr (sizeof(W) == 4) {
      component(v, i) = w;
    } else {
      uint32_t& c = component(v, i / 2);
      const int shift = 16 * (i % 2);
      c = (c & ~(0xFFFFu << shift)) | (static_cast<uint32_t>(w) << shift);
    }
  }
};

// A 16-byte vector of the input, read in the global space (LDG, no generic-address conversion): through the
// read-only path when nothing is written, else a streaming load (read once, written back by this thread).
template <int kMode>
__device__ __forceinline__ uint4 load_vector(const uint4* at) {
  if constexpr (kMode == kUnscale) {
    return __ldcs(at);
  } else {
    return __ldg(at);
  }
}

// One storage word, for the scalar paths.
template <typename W>
struct OneWord {
  static constexpr int kCount = 1;
  W word;
  __device__ __forceinline__ void hide() {}
  __device__ __forceinline__ W get(int) const { return word; }
  __device__ __forceinline__ void set(int, W w) { word = w; }
};

// Counts elements [start, start + count) of a dense view (and unscales them in place for kUnscale): scalar
// loads up to the first 16-byte boundary, then batches of kLoadsInFlight 16-byte loads per thread, then one
// vector at a time, then the scalar tail.
template <int kDtype, int kMode, int kFormats>
__device__ __forceinline__ void count_dense(Tally<kFormats>& t, const TensorView& view, int64_t start, int64_t count,
                            const Judge<kFormats>& j) {
  using W = typename Storage<kDtype>::type;
  constexpr int kPerVector = kVectorBytes / sizeof(W);
  W* p = static_cast<W*>(const_cast<void*>(view.data)) + start;  // written only by unscale_stats_
  const uintptr_t misalignment = reinterpret_cast<uintptr_t>(p) % kVectorBytes;
  int64_t head = misalignment == 0 ? 0 : (kVectorBytes - static_cast<int64_t>(misalignment)) / sizeof(W);
  if (misalignment % sizeof(W) != 0) head = count;  // storage not even word-aligned: all scalar
  if (head > count) head = count;
  const int64_t vectors = (count - head) / kPerVector;
  const int64_t tail_from = head + vectors * kPerVector;

  auto count_one = [&](W* at) {
    OneWord<W> one{*at};
    count_batch<kDtype, kMode, kFormats>(t, one, j);
    if constexpr (kMode == kUnscale) *at = one.word;
  };
  for (int64_t i = threadIdx.x; i < head; i += kThreads) count_one(p + i);

  const uint4* in = reinterpret_cast<const uint4*>(p + head);
  uint4* out = reinterpret_cast<uint4*>(p + head);
  constexpr int kLoads = kLoadsInFlight<W>;
  constexpr int64_t kStride = static_cast<int64_t>(kThreads) * kLoads;
  int64_t v = threadIdx.x;
  for (; v + (kLoads - 1) * kThreads < vectors; v += kStride) {
    VectorWords<W, kLoads> batch;
#pragma unroll
    for (int l = 0; l < kLoads; ++l) batch.vectors[l] = load_vector<kMode>(in + v + l * kThreads);
    constexpr int kPart = kVectorsPerBatch<W>;
#pragma unroll
    for (int first = 0; first < kLoads; first += kPart) {
      VectorWords<W, kPart> part;
#pragma unroll
      for (int l = 0; l < kPart; ++l) part.vectors[l] = batch.vectors[first + l];
      count_batch<kDtype, kMode, kFormats>(t, part, j);
      if constexpr (kMode == kUnscale) {  // stored at once: the part's registers are free for the next
#pragma unroll
        for (int l = 0; l < kPart; ++l) __stcs(out + v + (first + l) * kThreads, part.vectors[l]);
      }
    }
  }
  for (; v < vectors; v += kThreads) {  // the last, partial batch: one vector at a time
    VectorWords<W, 1> one;
    one.vectors[0] = load_vector<kMode>(in + v);
    count_batch<kDtype, kMode, kFormats>(t, one, j);
    if constexpr (kMode == kUnscale) __stcs(out + v, one.vectors[0]);
  }
  for (int64_t i = tail_from + threadIdx.x; i < count; i += kThreads) count_one(p + i);
}

// Counts elements [start, start + count) of a strided view. Each thread walks indices start + tid,
// start + tid + kThreads, ...: its multi-index is found once by division, then advanced by the digits of
// kThreads in the view's mixed radix with carries (no division per element).
template <int kDtype, int kMode, int kFormats>
__device__ __forceinline__ void count_strided(Tally<kFormats>& t, const TensorView& view, int64_t start, int64_t count,
                              const Judge<kFormats>& j) {
  using W = typename Storage<kDtype>::type;
  W* base = static_cast<W*>(const_cast<void*>(view.data));
  const int ndim = view.ndim;
  int64_t index[kMaxDims];
  int64_t step[kMaxDims];
  int64_t linear = start + threadIdx.x;
  int64_t stride_left = kThreads;
  for (int d = ndim - 1; d >= 0; --d) {
    const int64_t size = view.sizes[d];
    index[d] = linear % size;
    linear /= size;
    step[d] = stride_left % size;
    stride_left /= size;
  }
  // Beyond the outermost dim the walk has ended, so a carry out of dim 0 is never needed.
  for (int64_t i = threadIdx.x; i < count; i += kThreads) {
    int64_t offset = 0;
    for (int d = 0; d < ndim; ++d) offset += index[d] * view.strides[d];
    OneWord<W> one{base[offset]};
    count_batch<kDtype, kMode, kFormats>(t, one, j);
    if constexpr (kMode == kUnscale) base[offset] = one.word;
    int64_t carry = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      index[d] += step[d] + carry;
      carry = 0;
      while (index[d] >= view.sizes[d]) {  // at most twice: step < size and carry <= 1
        index[d] -= view.sizes[d];
        ++carry;
      }
    }
  }
}

// ---- block-level merge ----

// warp_sum and warp_max: common/warp_reduce.cuh.

__device__ __forceinline__ void add_count(int64_t* target, uint64_t value) {
  if (value != 0) atomicAdd(reinterpret_cast<unsigned long long*>(target), static_cast<unsigned long long>(value));
}

// Shared scratch of the packed block reduction: per warp, every tally word, the two extremes and sumsq.
template <int kFormats>
struct MergeScratch {
  uint32_t words[kWarps][Tally<kFormats>::kWords + 2];
  double sumsq[kWarps];
};

// Merges the block's tallies and warp histograms into the workspace row `row` (one packed reduction: warp
// shuffles, one shared exchange, then one thread per counter does the global atomic); clears the histograms.
// Every thread of the block must call it.
template <int kFormats>
__device__ __forceinline__ void flush(const Tally<kFormats>& t, int64_t counted, int64_t* row,
                                      MergeScratch<kFormats>& scratch, int num_formats) {
  constexpr int kWords = Tally<kFormats>::kWords;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  uint32_t words[kWords + 2];
#pragma unroll
  for (int k = 0; k < kWords; ++k) words[k] = warp_sum(t.n[k]);
  words[kWords] = warp_max(t.max_abs);
  words[kWords + 1] = warp_max(kInfBits32 - t.min_abs_nonzero());  // min of x == max of (inf - x)
  const double sumsq = warp_sum(t.sumsq);
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < kWords + 2; ++k) scratch.words[warp][k] = words[k];
    scratch.sumsq[warp] = sumsq;
  }
  __syncthreads();  // scratch filled, and every warp's histogram complete
  const int tid = threadIdx.x;
  if (tid < kWords) {
    uint64_t total = 0;
    for (int w = 0; w < kWarps; ++w) total += scratch.words[w][tid];
    // The over[F] words counted |bits| below overflow_from: the rest of the piece is at or above it.
    const bool over = tid >= Tally<kFormats>::kOver && tid < Tally<kFormats>::kBelow;
    add_count(row + 1 + tid, over ? static_cast<uint64_t>(counted) - total : total);
  } else if (tid < kWords + 2) {
    uint32_t extreme = 0;
    for (int w = 0; w < kWarps; ++w) extreme = max(extreme, scratch.words[w][tid]);
    const int half = tid - kWords;  // 0: max |v|, 1: kInfBits32 - min nonzero |v|
    uint32_t* extremes = reinterpret_cast<uint32_t*>(row + extremes_column(num_formats));
    if (extreme != 0) atomicMax(extremes + half, extreme);
  } else if (tid == kWords + 2) {
    double total = 0.0;
    for (int w = 0; w < kWarps; ++w) total += scratch.sumsq[w];
    if (total != 0.0) atomicAdd(reinterpret_cast<double*>(row + sumsq_column(num_formats)), total);
  } else if (tid == kWords + 3) {
    add_count(row, static_cast<uint64_t>(counted));
  }
  int64_t* hist_row = row + hist_column(num_formats);
  for (int b = tid; b < kHistBins; b += kThreads) {
    uint64_t total = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      total += warp_histograms[w][b];
      warp_histograms[w][b] = 0;
    }
    add_count(hist_row + b, total);
  }
  __syncthreads();  // scratch read and histograms cleared before anyone counts again
}

// Counts elements [start, start + count) of one view and merges them into its workspace row. Inlined: a kernel
// holds one input dtype, so its two layouts share one register allocation without calls (a call's saved
// registers were the spills of the earlier one-kernel-for-all-dtypes design). Every thread must call it.
template <int kDtype, int kMode, int kFormats>
__device__ __forceinline__ void count_piece(const TensorView& view, int64_t start, int64_t count, int64_t* row,
                                            MergeScratch<kFormats>& scratch, const Judge<kFormats>& j,
                                            int num_formats) {
  Tally<kFormats> tally;
  tally.clear();
  if (is_contiguous_view(view)) {
    count_dense<kDtype, kMode>(tally, view, start, count, j);
  } else {
    count_strided<kDtype, kMode>(tally, view, start, count, j);
  }
  flush(tally, count, row, scratch, num_formats);
}

// The op's counts, extremes and sumsq of output row r from workspace row r, and found_inf. One thread.
__device__ __forceinline__ void finalize_row(const FinalizeParams& p, int64_t r) {
  // Read at L2 (__ldcg), where the stats blocks' atomics landed: never a stale line of this SM's L1.
  const int64_t* row = p.workspace + r * workspace_columns(p.num_formats);
  auto word = [&](int column) {
    return static_cast<int64_t>(__ldcg(reinterpret_cast<const long long*>(row) + column));
  };
  RawCounts raw;
  clear_counts(raw);
  raw.numel = word(0);
  raw.nan = word(1);
  raw.posinf = word(2);
  raw.neginf = word(3);
  raw.zero = word(4);
  for (int f = 0; f < p.num_formats; ++f) {
    raw.at_or_above_overflow[f] = word(kFixedCountColumns + f);
    raw.below_normal[f] = word(kFixedCountColumns + p.num_formats + f);
    raw.at_or_below_zero[f] = word(kFixedCountColumns + 2 * p.num_formats + f);
  }
  finalize_counts(raw, p.num_formats, p.counts + r * count_columns(p.num_formats));
  const uint64_t extremes = static_cast<uint64_t>(word(extremes_column(p.num_formats)));
  p.amax[r] = __uint_as_float(static_cast<uint32_t>(extremes));
  p.amin_nonzero[r] = __uint_as_float(kInfBits32 - static_cast<uint32_t>(extremes >> 32));
  p.sumsq[r] = __longlong_as_double(word(sumsq_column(p.num_formats)));
  // Every writer stores the same value, so the race is benign (as in torch's own unscale kernel).
  if (p.found_inf != nullptr && raw.nan + raw.posinf + raw.neginf > 0) *p.found_inf = 1.0f;
}

// Turns workspace rows into the op's outputs and sets found_inf. Block b handles rows b, b + grid, ...
__global__ void __launch_bounds__(kFinalizeThreads) finalize_kernel(const FinalizeParams p) {
  for (int64_t r = blockIdx.x; r < p.num_tensors; r += gridDim.x) {
    const int64_t* row = p.workspace + r * workspace_columns(p.num_formats);
    for (int b = threadIdx.x; b < kHistBins; b += kFinalizeThreads) {
      p.hist[r * kHistBins + b] = row[hist_column(p.num_formats) + b];
    }
    if (threadIdx.x == 0) finalize_row(p, r);
  }
}

// The finalize of a small call, run by whichever of its stats blocks finishes last: each block, once its
// flushes are done, makes its workspace atomics visible device-wide (fence) and then counts itself done; the
// block that counts the last one fences again (so it sees every other block's atomics) and writes the outputs.
__device__ __forceinline__ void finalize_if_last(const FinalizeParams& p, int64_t* done, int64_t total_blocks) {
  __shared__ bool last_block;
  __syncthreads();  // every thread's flush is complete
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned long long before = atomicAdd(reinterpret_cast<unsigned long long*>(done), 1ull);
    last_block = static_cast<int64_t>(before) == total_blocks - 1;
  }
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  static_assert(kThreads == kHistBins, "one thread per histogram bin");
  const int b = threadIdx.x;
#pragma unroll 4
  for (int64_t r = 0; r < p.num_tensors; ++r) {
    const int64_t* bin = p.workspace + r * workspace_columns(p.num_formats) + hist_column(p.num_formats) + b;
    p.hist[r * kHistBins + b] = static_cast<int64_t>(__ldcg(reinterpret_cast<const long long*>(bin)));
  }
  if (b < p.num_tensors) finalize_row(p, b);
}

// The statistics pass over views of one input dtype. Block b takes chunks [first_chunk + b * n / grid,
// first_chunk + (b + 1) * n / grid).
template <int kMode, int kFormats, int kDtype>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) stats_kernel(const __grid_constant__ StatsParams p) {
  static_assert(kThreads <= kHistBins, "each thread clears at most one bin per warp below");
  static_assert(Tally<kFormats>::kWords + 4 <= kThreads, "one thread per merged counter");
  __shared__ MergeScratch<kFormats> scratch;
  const int warp = threadIdx.x / kWarpSize;
  for (int b = threadIdx.x; b < kHistBins; b += kThreads) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) warp_histograms[w][b] = 0;
  }
  __syncthreads();

  Judge<kFormats> judge{p, warp, 1.0f, 1.0f};
  if constexpr (kMode == kScaled) judge.scale = p.scale_ptr != nullptr ? *p.scale_ptr : p.scale_value;
  if constexpr (kMode == kUnscale) judge.inv_scale = *p.inv_scale;

  const int64_t grid = gridDim.x;
  const int64_t block = blockIdx.x;
  const int64_t chunk_begin = p.first_chunk + block * p.num_chunks / grid;
  const int64_t chunk_end = p.first_chunk + (block + 1) * p.num_chunks / grid;
  const TensorView* views = p.views != nullptr ? p.views : p.inline_views;
  const int columns = workspace_columns(p.num_formats);

  // A block without chunks counts nothing but still takes part in the finalize hand-over below.
  int64_t v = chunk_begin < chunk_end ? tensor_of_chunk(views, p.num_views, chunk_begin) : 0;
  int64_t chunk = chunk_begin;
  while (chunk < chunk_end) {  // uniform over the block: every barrier inside is reached by all of it
    const TensorView& view = views[v];
    const int64_t view_chunks = (view.numel + p.chunk_elems - 1) / p.chunk_elems;
    const int64_t view_end = view.first_chunk + view_chunks;
    const int64_t last = chunk_end < view_end ? chunk_end : view_end;
    // Elements of this view in chunks [chunk, last).
    const int64_t begin = (chunk - view.first_chunk) * p.chunk_elems;
    int64_t end = (last - view.first_chunk) * p.chunk_elems;
    if (end > view.numel) end = view.numel;
    int64_t* row = p.workspace + view.out_row * columns;
    for (int64_t piece = begin; piece < end; piece += kMaxFlushElems) {
      const int64_t n = end - piece < kMaxFlushElems ? end - piece : kMaxFlushElems;
      count_piece<kDtype, kMode>(view, piece, n, row, scratch, judge, p.num_formats);
    }
    chunk = last;
    ++v;
  }
  if (p.finalize_in_block) finalize_if_last(p.fin, p.workspace + done_column(p.num_formats), p.total_blocks);
}

// ---- host side: the launch sequence, for any backend ----
//
// A Backend runs the kernels somewhere: common/cuda_launch.cuh's CudaBackend on the GPU, common/cuda_emu.h's
// Backend on the CPU (zero, blocks, blocks_up_to, launch).

// Calls fn(stats_kernel<mode, formats, dtype>) for the variant a launch needs.
template <int kMode, int kFormats, class Fn>
void with_dtype_kernel(int dtype, Fn&& fn) {
  switch (dtype) {
    case kFloat32: return fn(stats_kernel<kMode, kFormats, kFloat32>);
    case kFloat16: return fn(stats_kernel<kMode, kFormats, kFloat16>);
    case kBFloat16: return fn(stats_kernel<kMode, kFormats, kBFloat16>);
    default: return fn(stats_kernel<kMode, kFormats, kFloat64>);
  }
}
template <int kMode, class Fn>
void with_formats_kernel(int num_formats, int dtype, Fn&& fn) {
  switch (num_formats) {
    case 1: return with_dtype_kernel<kMode, 1>(dtype, fn);
    case 2: return with_dtype_kernel<kMode, 2>(dtype, fn);
    case 3: return with_dtype_kernel<kMode, 3>(dtype, fn);
    default: return with_dtype_kernel<kMode, 4>(dtype, fn);
  }
}
template <class Fn>
void with_stats_kernel(int mode, int num_formats, int dtype, Fn&& fn) {
  switch (mode) {
    case kPlain: return with_formats_kernel<kPlain>(num_formats, dtype, fn);
    case kScaled: return with_formats_kernel<kScaled>(num_formats, dtype, fn);
    default: return with_formats_kernel<kUnscale>(num_formats, dtype, fn);
  }
}
static_assert(kMaxFormats == 4, "with_formats_kernel lists one variant per format count");

// Zeroes the workspace, launches the statistics pass (once with a device table, or once per group of
// kInlineViews views without one) and the finalize pass. Asynchronous on a GPU backend.
template <class Backend>
void run_stats(const LaunchPlan& plan, Backend& backend) {
  backend.zero(plan.workspace, plan.workspace_words * static_cast<int64_t>(sizeof(int64_t)));
  StatsParams params{};
  params.chunk_elems = plan.chunk_elems;
  const int formats = plan.num_formats;
  params.below[0] = 1u;
  for (int f = 0; f < formats; ++f) {
    params.bounds[f] = plan.bounds[f];
    params.below[1 + f] = plan.bounds[f].overflow_from;
    params.below[1 + formats + f] = plan.bounds[f].normal_from;
    params.below[1 + 2 * formats + f] = plan.bounds[f].zero_upto + 1u;
  }
  params.num_formats = formats;
  params.scale_value = plan.scale_value;
  params.scale_ptr = plan.scale_ptr;
  params.inv_scale = plan.inv_scale;
  params.workspace = plan.workspace;
  FinalizeParams fin{};
  fin.workspace = plan.workspace;
  fin.num_tensors = plan.num_tensors;
  fin.num_formats = plan.num_formats;
  fin.found_inf = plan.mode == kUnscale ? plan.found_inf : nullptr;
  fin.counts = plan.counts;
  fin.hist = plan.hist;
  fin.amax = plan.amax;
  fin.amin_nonzero = plan.amin_nonzero;
  fin.sumsq = plan.sumsq;
  params.fin = fin;
  // One launch per run of views of one dtype (group_views_by_dtype makes it one run per dtype): with the
  // device table, the run's slice of it; without, up to kInlineViews views per launch in the parameters.
  // Walked twice: once to add up the grids (the last block of them all finalizes a small call), once to launch.
  auto chunks_of = [&](int64_t first, int64_t n) {
    const TensorView& last = plan.host_views[first + n - 1];
    return last.first_chunk + (last.numel + plan.chunk_elems - 1) / plan.chunk_elems -
           plan.host_views[first].first_chunk;
  };
  auto each_launch = [&](bool launch) {
    int64_t blocks = 0;
    for (int64_t run = 0; run < plan.num_views;) {
      const int32_t dtype = plan.host_views[run].dtype;
      int64_t run_end = run + 1;
      while (run_end < plan.num_views && plan.host_views[run_end].dtype == dtype) ++run_end;
      with_stats_kernel(plan.mode, plan.num_formats, dtype, [&](auto kernel) {
        const int64_t per_launch = plan.device_views != nullptr ? run_end - run : kInlineViews;
        for (int64_t first = run; first < run_end; first += per_launch) {
          const int64_t n = run_end - first < per_launch ? run_end - first : per_launch;
          const int64_t grid = backend.blocks(kernel, kThreads, chunks_of(first, n));
          blocks += grid;
          if (!launch) continue;
          params.views = plan.device_views != nullptr ? plan.device_views + first : nullptr;
          if (plan.device_views == nullptr) {
            for (int64_t v = 0; v < n; ++v) params.inline_views[v] = plan.host_views[first + v];
          }
          params.num_views = n;
          params.first_chunk = plan.host_views[first].first_chunk;
          params.num_chunks = chunks_of(first, n);
          backend.launch(kernel, grid, kThreads, params);
        }
      });
      run = run_end;
    }
    return blocks;
  };
  params.total_blocks = each_launch(false);
  // A call of few rows with any stats launch at all finalizes in its last block: no finalize launch.
  params.finalize_in_block = params.total_blocks > 0 && plan.num_tensors <= kFinalizeInBlockRows;
  each_launch(true);
  if (plan.num_tensors == 0 || params.finalize_in_block) return;
  backend.launch(finalize_kernel, backend.blocks_up_to(plan.num_tensors, kMaxFinalizeBlocks), kFinalizeThreads, fin);
}

}  // namespace AMPI_KERNELS_NAMESPACE
}  // namespace kernels
}  // namespace amp_inspect
