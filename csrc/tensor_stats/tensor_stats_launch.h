// tensor_stats_launch.h: what the host hands the CUDA kernels of tensor_stats_kernels.cuh for one call, the sizes
// both sides agree on, and the launcher of their GPU build. Torch-free and CUDA-free: included by the host op
// (tensor_stats_cuda_op.cpp), by the kernels (through nvcc, or through the host compiler for the CPU emulation in
// tensor_stats_emu.cpp).
#pragma once

#include <cstdint>

#include "tensor_stats/tensor_stats.h"

namespace amp_inspect {

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
