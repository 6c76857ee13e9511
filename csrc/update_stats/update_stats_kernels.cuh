// update_stats_kernels.cuh: the CUDA kernel of amp_inspect::update_stats and the host logic that launches it,
// written once for two compilers (as readiness_kernels.cuh is):
//   - nvcc, through update_stats_cuda.cu: the kernel that runs on the GPU;
//   - the host C++ compiler, through update_stats_emu.cpp with cuda_emu.h in front: the same source run on the
//     CPU, each CUDA thread a real host thread (tests only: tests/test_update_stats_emu.py).
// The element logic is update_stats.h's judge_update_element (through tally_update_element), as the CPU kernel's.
//
// One read of the data. A launch carries up to kViewsPerLaunch tensors in its parameters (no device table: safe
// under CUDA graph capture); their elements fall into chunks of kChunkElems, and each block takes chunks in turn
// (a grid-stride loop over the chunks). Within a chunk each thread judges every kThreads-th element into its own
// UpdateTally in registers; at the chunk's end a shared-memory tree reduction sums the block's tallies and one
// thread per column adds them to the outputs with one global atomic (int64 counts, float64 sums, amax as
// float32 bits by atomicMax: nonnegative float bits order as their values). The float64 sums' order therefore
// depends on the schedule: they agree with the reference to a tolerance, the counts and amax exactly.
#pragma once

#include <cstdint>

#include "common/dtype_load.cuh"  // also the namespace that keeps the GPU build's symbols apart from the emulation's
#include "common/numerics.h"
#include "update_stats/update_stats.h"

namespace amp_inspect {

namespace update_kernels {
inline namespace AMPI_KERNELS_NAMESPACE {

constexpr int kThreads = 256;

struct UpdateParams {
  UpdateKernelView views[kUpdateViewsPerLaunch];
  int32_t num_views;
  int64_t total_chunks;
  int64_t chunk_elems;
  int64_t* counts;
  double* sums;
  float* amax;
};

// Each input is read by its dtype at run time: common/dtype_load.cuh's load_as_f32_bits.

__global__ void __launch_bounds__(kThreads) update_stats_kernel(const __grid_constant__ UpdateParams p) {
  __shared__ UpdateTally scratch[kThreads];
  const int tid = threadIdx.x;
  for (int64_t c = blockIdx.x; c < p.total_chunks; c += gridDim.x) {
    int v = 0;  // the view of chunk c (few views per launch: a scan)
    while (v + 1 < p.num_views && p.views[v + 1].first_chunk <= c) ++v;
    const UpdateKernelView& view = p.views[v];
    const int64_t start = (c - view.first_chunk) * p.chunk_elems;
    const int64_t end = start + p.chunk_elems < view.numel ? start + p.chunk_elems : view.numel;
    const bool has_state = view.state != nullptr;
    const uint32_t weight_normal = min_normal_bits(view.weight_dtype);
    const uint32_t state_normal = min_normal_bits(view.state_dtype);
    UpdateTally t;
    clear_tally(t);
    for (int64_t i = start + tid; i < end; i += kThreads) {
      const uint32_t state = has_state ? load_as_f32_bits(view.state, view.state_dtype, i) : 0u;
      const uint32_t before = load_as_f32_bits(view.before, view.weight_dtype, i);
      const uint32_t after = load_as_f32_bits(view.after, view.weight_dtype, i);
      const uint32_t grad = load_as_f32_bits(view.grad, view.grad_dtype, i);
      tally_update_element(t, before, after, grad, state, has_state, weight_normal, state_normal);
    }
    scratch[tid] = t;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half /= 2) {
      if (tid < half) merge_tally(scratch[tid], scratch[tid + half]);
      __syncthreads();
    }
    const UpdateTally& total = scratch[0];
    if (tid > 0 && tid < kUpdateCountColumns && total.counts[tid] != 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(p.counts + view.out_row * kUpdateCountColumns + tid),
                static_cast<unsigned long long>(total.counts[tid]));
    } else if (tid == 0) {  // numel: the chunk's elements
      atomicAdd(reinterpret_cast<unsigned long long*>(p.counts + view.out_row * kUpdateCountColumns + kUpdNumel),
                static_cast<unsigned long long>(end - start));
    } else if (tid >= kUpdateCountColumns && tid < kUpdateCountColumns + kUpdateSumColumns) {
      const int k = tid - kUpdateCountColumns;
      if (total.sums[k] != 0.0) atomicAdd(p.sums + view.out_row * kUpdateSumColumns + k, total.sums[k]);
    } else if (tid == kUpdateCountColumns + kUpdateSumColumns && total.amax_bits != 0u) {
      atomicMax(reinterpret_cast<unsigned int*>(p.amax + view.out_row), total.amax_bits);
    }
    __syncthreads();  // scratch read before the next chunk writes it
  }
}

// The launch sequence, for any backend (common/cuda_launch.cuh's CudaBackend on the GPU, common/cuda_emu.h's Backend
// on the CPU): the outputs zeroed, then one launch per kUpdateViewsPerLaunch views. Asynchronous on a GPU.
template <class Backend>
void run_update_stats(const UpdateLaunchPlan& plan, Backend& backend) {
  backend.zero(plan.counts, static_cast<int64_t>(sizeof(int64_t)) * plan.num_tensors * kUpdateCountColumns);
  backend.zero(plan.sums, static_cast<int64_t>(sizeof(double)) * plan.num_tensors * kUpdateSumColumns);
  backend.zero(plan.amax, static_cast<int64_t>(sizeof(float)) * plan.num_tensors);
  for (int64_t first = 0; first < plan.num_views; first += kUpdateViewsPerLaunch) {
    UpdateParams params{};
    params.num_views = static_cast<int32_t>(
        plan.num_views - first < kUpdateViewsPerLaunch ? plan.num_views - first : kUpdateViewsPerLaunch);
    int64_t chunks = 0;
    for (int v = 0; v < params.num_views; ++v) {
      params.views[v] = plan.views[first + v];
      params.views[v].first_chunk = chunks;
      chunks += (params.views[v].numel + plan.chunk_elems - 1) / plan.chunk_elems;
    }
    params.total_chunks = chunks;
    params.chunk_elems = plan.chunk_elems;
    params.counts = plan.counts;
    params.sums = plan.sums;
    params.amax = plan.amax;
    backend.launch(update_stats_kernel, backend.blocks(update_stats_kernel, kThreads, chunks), kThreads, params);
  }
}

}  // namespace AMPI_KERNELS_NAMESPACE
}  // namespace update_kernels
}  // namespace amp_inspect
