// tensor_stats.h: the element logic of amp_inspect::tensor_stats (and unscale_stats_), written once for CPU and
// CUDA: the formats and their thresholds, the threshold counts of one element and the statistics derived from them,
// and the tensor views the kernels walk; at the end, the plan the host hands the CUDA kernels.
//
// Everything here is torch-free and works on bit patterns with integer compares: exact, and immune to
// flush-to-zero / denormals-are-zero modes (never build this with fast-math). The CPU kernel
// (tensor_stats_cpu.cpp) and the CUDA kernel (tensor_stats_cuda.cu) both include it, so the CPU tests
// exercise the very comparisons the GPU runs. What every op shares (the input dtypes, the bit constants and
// casts, the exact widening of fp16 / bf16) is common/numerics.h.
//
// Definitions (for a value v and a target format f, "cast" meaning round-to-nearest-even, what
// torch's `v.to(dtype)` does; docs/numerics.md lists the boundaries and how they were checked):
//   overflow[f]  : v is finite and its cast to f is +-Inf (e4m3fn has no Inf: |v| > 464 counts).
//   subnormal[f] : v is finite, nonzero, and its cast is a nonzero subnormal of f.
//   underflow[f] : v is finite, nonzero, and its cast is zero.
// The kernels do not count these directly. Per format they count three threshold tests that are
// cheap, branch-free and vectorise well, and `finalize_counts` derives the three statistics:
//   at_or_above_overflow : |bits| >= overflow_from   (this includes Inf and NaN)
//   below_normal         : |bits| <  normal_from     (this includes zero)
//   at_or_below_zero     : |bits| <= zero_upto       (this includes zero)
#pragma once

#include <cstdint>

#include "common/numerics.h"

namespace amp_inspect {

// Formats, in the order of kFormatNames below and FORMATS in amp_inspect/core/formats.py.
enum FormatId : int32_t { kFp16 = 0, kBf16 = 1, kFp8E4M3 = 2, kFp8E5M2 = 3, kNumFormats = 4 };
constexpr int kMaxFormats = kNumFormats;  // a call may ask for each format at most once

// Format names in FormatId order: the one list of them (Python reads it through amp_inspect._C.layout()).
constexpr const char* kFormatNames[kNumFormats] = {"fp16", "bf16", "fp8_e4m3", "fp8_e5m2"};

constexpr int kHistBins = 256;  // one bin per value of the float32 exponent field

// Where a float32 sum of squares is as good as a float64 one: a group of values whose largest |v| lies in
// [2^-50, 2^60) may sum its squares in float32. No square reaches 2^120, so float32 sums of up to 2^7 of them
// cannot overflow; a square lost below float32's subnormal range (< 2^-149) is under 2^-49 of the group's
// largest square (>= 2^-100), so n lost squares cost a relative error below n * 2^-49. Other groups sum in
// float64. Used by the CUDA kernel (16 squares per float32 sum) and the CPU kernel (16 per float32 lane).
constexpr uint32_t kFloatSquaresFrom = 0x26800000u;   // 2^-50
constexpr uint32_t kFloatSquaresBelow = 0x5D800000u;  // 2^60

// The three thresholds of one format, as |bits| of float32 and of float64 holding the same real value,
// so a float64 input is classified on its exact value (a direct round-to-nearest-even cast).
struct FormatBounds {
  uint32_t overflow_from;  // |v| >= this: the cast gives Inf (or, for e4m3fn, is out of range)
  uint32_t normal_from;    // |v| >= this: the cast is a normal number (or overflows)
  uint32_t zero_upto;      // |v| <= this: the cast is zero
  uint64_t overflow_from64;
  uint64_t normal_from64;
  uint64_t zero_upto64;
};

// Indexed by FormatId. Each value is in docs/numerics.md and pinned by tests against torch's casts.
// Host only: the host code copies the bounds a call needs into the kernel's arguments.
constexpr FormatBounds kFormatBounds[kNumFormats] = {
    // fp16: overflow at 65520 (65504 < v < 65520 rounds down to 65504); subnormal below 2^-14 - 2^-25,
    // whose tie rounds up to 2^-14; zero at and below 2^-25 (the tie rounds to even, zero).
    {0x477FF000u, 0x387FE000u, 0x33000000u, 0x40EFFE0000000000ull, 0x3F0FFC0000000000ull,
     0x3E60000000000000ull},
    // bf16: overflow at (2 - 2^-8) * 2^127; subnormal below 2^-126 - 2^-134; zero at and below 2^-134.
    {0x7F7F8000u, 0x007F8000u, 0x00008000u, 0x47EFF00000000000ull, 0x380FE00000000000ull,
     0x3790000000000000ull},
    // fp8 e4m3fn: out of range above 464 (464 itself rounds to even, 448); subnormal below 2^-6 - 2^-10;
    // zero at and below 2^-10. "above 464" is ">= the next float after 464".
    {0x43E80001u, 0x3C700000u, 0x3A800000u, 0x407D000000000001ull, 0x3F8E000000000000ull,
     0x3F50000000000000ull},
    // fp8 e5m2: overflow at 61440; subnormal below 2^-14 - 2^-17; zero at and below 2^-17.
    {0x47700000u, 0x38600000u, 0x37000000u, 0x40EE000000000000ull, 0x3F0C000000000000ull,
     0x3EE0000000000000ull},
};

// ---- per-element tests on |bits| ----

AMPI_HD uint32_t hist_bin(uint32_t bits) { return (bits >> kExponentShift32) & kExponentMask32; }

// Counts of one tensor (or a part of it), merged by adding (max/min for the extremes).
// The raw threshold counts are turned into the user's statistics by finalize_counts.
struct RawCounts {
  int64_t numel;
  int64_t nan;
  int64_t posinf;
  int64_t neginf;
  int64_t zero;
  int64_t at_or_above_overflow[kMaxFormats];
  int64_t below_normal[kMaxFormats];
  int64_t at_or_below_zero[kMaxFormats];
};

AMPI_HD void clear_counts(RawCounts& c) {
  c.numel = c.nan = c.posinf = c.neginf = c.zero = 0;
  for (int f = 0; f < kMaxFormats; ++f) {
    c.at_or_above_overflow[f] = c.below_normal[f] = c.at_or_below_zero[f] = 0;
  }
}

// ---- the threshold test, written once: every loop (CPU scalar and vector, CUDA) counts with these ----
// |bits| of a float32 (or float64) is below 2^31 (2^63), and so is every bound, so a - t wraps around exactly
// when a < t and its top bit is the test: one subtraction and one shift (on sm_90 a subtraction and a LEA.HI
// into the counter), no compare-and-select. U is uint32_t / uint64_t or a GCC vector of them (the CPU's lanes).
template <typename U>
AMPI_HD U below32(U a, U t) {
  return (a - t) >> 31;
}
template <typename U>
AMPI_HD U below64(U a, U t) {
  return (a - t) >> 63;
}

// The threshold tests of one element, added to any counter struct with the fields of RawCounts but numel
// (the CPU's int64 RawCounts). The CUDA kernel does not call these: it counts with below32 / below64 once per
// 16-element batch where the batch lies on one side of a threshold, per element only where it straddles one
// (tensor_stats_kernels.cuh, count_batch). The format loop runs to the compile-time bound so that, on a GPU,
// the counter arrays would stay in registers.
#if defined(__CUDA_ARCH__)
#define AMPI_UNROLL _Pragma("unroll")
#else
#define AMPI_UNROLL
#endif

// One float32 element (bits of v).
template <typename Counts>
AMPI_HD void count_thresholds32(Counts& c, uint32_t bits, const FormatBounds* bounds, int num_formats) {
  const uint32_t a = bits & kAbsMask32;
  c.nan += a > kInfBits32;
  c.posinf += bits == kInfBits32;
  c.neginf += bits == kNegInfBits32;
  c.zero += a == 0;
  AMPI_UNROLL
  for (int f = 0; f < kMaxFormats; ++f) {
    if (f < num_formats) {
      c.at_or_above_overflow[f] += 1u - below32(a, bounds[f].overflow_from);
      c.below_normal[f] += below32(a, bounds[f].normal_from);
      c.at_or_below_zero[f] += below32(a, bounds[f].zero_upto + 1u);  // zero_upto < the largest |bits|
    }
  }
}

// One float64 element, classified on its exact value.
template <typename Counts>
AMPI_HD void count_thresholds64(Counts& c, uint64_t bits, const FormatBounds* bounds, int num_formats) {
  const uint64_t a = bits & kAbsMask64;
  c.nan += a > kInfBits64;
  c.posinf += bits == kInfBits64;
  c.neginf += bits == kNegInfBits64;
  c.zero += a == 0;
  AMPI_UNROLL
  for (int f = 0; f < kMaxFormats; ++f) {
    if (f < num_formats) {
      c.at_or_above_overflow[f] += 1u - below64(a, bounds[f].overflow_from64);
      c.below_normal[f] += below64(a, bounds[f].normal_from64);
      c.at_or_below_zero[f] += below64(a, bounds[f].zero_upto64 + 1u);
    }
  }
}

AMPI_HD void count_element32(RawCounts& c, uint32_t bits, const FormatBounds* bounds, int num_formats) {
  c.numel += 1;
  count_thresholds32(c, bits, bounds, num_formats);
}

AMPI_HD void count_element64(RawCounts& c, uint64_t bits, const FormatBounds* bounds, int num_formats) {
  c.numel += 1;
  count_thresholds64(c, bits, bounds, num_formats);
}

// The user's counts for one tensor, derived from the raw threshold counts. `per_tensor` points at the
// tensor's row of counts laid out as in the op's `counts` output:
//   [numel, nan, posinf, neginf, zero, overflow[F], subnormal[F], underflow[F]]
constexpr int kFixedCountColumns = 5;
AMPI_HD int count_columns(int num_formats) { return kFixedCountColumns + 3 * num_formats; }

AMPI_HD void finalize_counts(const RawCounts& c, int num_formats, int64_t* row) {
  row[0] = c.numel;
  row[1] = c.nan;
  row[2] = c.posinf;
  row[3] = c.neginf;
  row[4] = c.zero;
  const int64_t non_finite = c.nan + c.posinf + c.neginf;
  for (int f = 0; f < num_formats; ++f) {
    row[kFixedCountColumns + f] = c.at_or_above_overflow[f] - non_finite;
    row[kFixedCountColumns + num_formats + f] = c.below_normal[f] - c.at_or_below_zero[f];
    row[kFixedCountColumns + 2 * num_formats + f] = c.at_or_below_zero[f] - c.zero;
  }
}

// ---- strided element addressing ----

// A tensor as the kernels see it: plain pointer, sizes and strides (in elements), dims collapsed.
// A dense tensor in any dim order is described as 1-D contiguous over its storage span.
constexpr int kMaxDims = 8;

struct TensorView {
  const void* data;
  int64_t numel;
  int64_t first_chunk;  // index of this tensor's first work chunk in the call's flat chunk list
  int64_t out_row;      // the tensor's position in the caller's list (empty tensors get no view)
  int32_t dtype;        // InputDtype
  int32_t ndim;         // 1 and strides[0] == 1 means contiguous
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims];
};

AMPI_HD bool is_contiguous_view(const TensorView& t) { return t.ndim == 1 && t.strides[0] == 1; }

// Element offset (in elements) of logical index `linear` in a strided view.
AMPI_HD int64_t element_offset(const TensorView& t, int64_t linear) {
  int64_t offset = 0;
  for (int d = t.ndim - 1; d >= 0; --d) {
    const int64_t size = t.sizes[d];
    offset += (linear % size) * t.strides[d];
    linear /= size;
  }
  return offset;
}

// The view a work chunk belongs to: the last view whose first_chunk <= chunk (binary search, so a
// call's table has one entry per nonempty tensor, never one per chunk).
AMPI_HD int64_t tensor_of_chunk(const TensorView* views, int64_t num_tensors, int64_t chunk) {
  int64_t lo = 0;
  int64_t hi = num_tensors - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (views[mid].first_chunk <= chunk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// ---- the CUDA kernels' launch plan ----
// What the host hands the CUDA kernels of tensor_stats_kernels.cuh for one call, the sizes both sides agree on, and
// the launcher of their GPU build: shared by the host op (tensor_stats_cuda_op.cpp) and the kernels (through nvcc,
// or through the host compiler for the CPU emulation in tensor_stats_emu.cpp).

// Elements per work chunk on CUDA. A block takes a contiguous run of chunks and walks it tensor by tensor,
// so the chunk is only the unit in which work is dealt out: small enough to balance blocks (13.9M elements
// make ~6800 chunks for ~500 resident blocks), a multiple of every dtype's 16-byte vector.
constexpr int64_t kCudaChunkElems = int64_t{1} << 11;

// Tensors described in the kernel's own parameters (no table copy, and what a captured CUDA graph replays
// by value). 16 views keep the parameters under the 4 KB that every architecture and driver accepts.
constexpr int kInlineViews = 16;

// What a launch does besides counting (kernels::Mode has the same values).
enum LaunchMode : int32_t { kLaunchPlain = 0, kLaunchScaled = 1, kLaunchUnscale = 2 };

// One call, ready to launch: the call's views (host memory), optionally a copy of them in device memory,
// the per-call constants and the device buffers.
struct LaunchPlan {
  const TensorView* host_views;  // the views, in host memory
  int64_t num_views;             // nonempty tensors
  // The views in device memory, or null: then each launch carries up to kInlineViews views in its
  // parameters, so a call of more tensors takes several launches (the capture-safe way).
  const TensorView* device_views;
  int64_t num_tensors;  // rows of the outputs, empty tensors included
  int64_t total_chunks;
  int64_t chunk_elems;
  FormatBounds bounds[kMaxFormats];
  int32_t num_formats;
  int32_t mode;             // LaunchMode
  float scale_value;        // scaled: the scale, when scale_ptr is null
  const float* scale_ptr;   // scaled: device memory, or null
  const float* inv_scale;   // unscale: device memory
  float* found_inf;         // unscale: device memory, set to 1 where a row holds NaN/Inf
  int64_t* workspace;       // [num_tensors, workspace columns], zeroed by the launch sequence
  int64_t workspace_words;
  // Outputs, written whole by the finalize (no fill needed).
  int64_t* counts;
  int64_t* hist;
  float* amax;
  float* amin_nonzero;
  double* sumsq;
};

// Orders a call's views by input dtype (stably) and renumbers their chunks, so that the views of each dtype
// form one run of consecutive chunks: the kernels are compiled per dtype, and a run is one launch. The outputs
// do not depend on the order (each view names its row). One pass per dtype: views are few (one per tensor).
inline void group_views_by_dtype(const TensorView* views, int64_t count, int64_t chunk_elems, TensorView* grouped) {
  int64_t next = 0;
  int64_t chunk = 0;
  for (int32_t dtype = kFloat32; dtype <= kFloat64; ++dtype) {
    for (int64_t v = 0; v < count; ++v) {
      if (views[v].dtype != dtype) continue;
      grouped[next] = views[v];
      grouped[next].first_chunk = chunk;
      chunk += (views[v].numel + chunk_elems - 1) / chunk_elems;
      ++next;
    }
  }
}

// Workspace row of one tensor (int64 words), zeroed before the statistics kernel:
//   [0]            numel
//   [1, 5 + 3F)    nan, posinf, neginf, zero, over[F], below[F], at_zero[F]  (raw threshold counts)
//   256 histogram bins
//   one word of extremes: low half max |v| (float32 bits); high half kInfBits32 - min nonzero |v| (so that
//     a zeroed word means "none" and both halves merge with atomicMax)
//   one word of sumsq (float64 bits)
//   one word counting the stats blocks that are done (row 0's only, for the finalize in the last block)
AMPI_HD int workspace_columns(int num_formats) { return count_columns(num_formats) + kHistBins + 3; }
AMPI_HD int done_column(int num_formats) { return count_columns(num_formats) + kHistBins + 2; }
AMPI_HD int hist_column(int num_formats) { return count_columns(num_formats); }
AMPI_HD int extremes_column(int num_formats) { return count_columns(num_formats) + kHistBins; }
AMPI_HD int sumsq_column(int num_formats) { return count_columns(num_formats) + kHistBins + 1; }

// The GPU build of the kernels (tensor_stats_cuda.cu, by nvcc), which the CUDA op calls: zeroes the workspace and
// launches the statistics and finalize kernels on `stream` (the device's current stream as the C shim hands it, a
// cudaStream_t). Asynchronous: no host sync. Throws (std::runtime_error) when the GPU has no kernel image for this
// binary's architectures.
void launch_tensor_stats(const LaunchPlan& plan, int device_index, void* stream);

// Whether this binary holds a kernel the device can run (a cubin of its architecture or PTX it can compile).
bool device_supported(int device_index);

}  // namespace amp_inspect
