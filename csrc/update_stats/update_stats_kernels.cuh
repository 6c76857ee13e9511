// update_stats_kernels.cuh: the CUDA kernel of amp_inspect::update_stats and the host logic that launches it,
// written once for two compilers (as readiness_kernels.cuh is):
//   - nvcc, through update_stats_cuda.cu: the kernel that runs on the GPU;
//   - the host C++ compiler, through update_stats_emu.cpp with cuda_emu.h in front: the same source run on the
//     CPU, each CUDA thread a real host thread (tests only: tests/test_update_stats_emu.py).
// The element logic is update_stats.h's judge_update_element (through tally_update_element), as the CPU kernel's.
//
// One read of the data. A launch carries up to kUpdateViewsPerLaunch tensors of one combination of input dtypes in its
// parameters (no device table: safe under CUDA graph capture); the kernel is compiled per combination (weight, grad,
// and exp_avg_sq's dtype or none: 36 kernels), so that no load or conversion branches on a dtype at run time. The
// tensors' elements fall into chunks of chunk_elems, and each block takes chunks in turn (a grid-stride loop over the
// chunks). Within a chunk each thread reads units of kUpdateUnitElems consecutive elements with 16-byte loads of
// every input (one per 16-bit input, two per float32 one: all of a unit's loads issued before any is used), the
// units of a block side by side; the elements before the first unit and after the last one, and every element of a
// tensor whose arrays are not 16-byte aligned at a common element (update_vector_phase), are read one at a time.
// Each element is judged by update_stats.h's judge_update_element (through tally_update_element), as the CPU
// kernel's, into the thread's totals in registers (uint32 counts: a chunk holds fewer than 2^32 elements); at the
// chunk's end the block's totals are summed by warp shuffles and across the warps in shared memory, and one thread
// per column adds them to the outputs with one global atomic (int64 counts, float64 sums, amax as float32 bits by
// atomicMax: nonnegative float bits order as their values). The float64 sums' order therefore depends on the
// schedule: they agree with the reference to a tolerance, the counts and amax exactly.
#pragma once

#include <cstdint>
#include <vector>

#include "common/dtype_load.cuh"  // also the namespace that keeps the GPU build's symbols apart from the emulation's
#include "common/numerics.h"
#include "common/warp_reduce.cuh"
#include "update_stats/update_stats.h"

namespace amp_inspect {

namespace update_kernels {
inline namespace AMPI_KERNELS_NAMESPACE {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarpSize;
// No minimum of blocks per SM in the launch bounds: the kernels take 42-58 registers unbounded (4 blocks of 256 per
// SM), and asked for 4 blocks ptxas filled the 64 allowed and spilled (up to 72 bytes). 32 warps x 32 threads x
// 64-128 bytes of a unit's loads = 64-128 KB in flight per SM, against about 25 KB that H200's bandwidth wants
// (Little's law at ~4.8 TB/s and ~0.7 us over 132 SMs).
// The exp_avg_sq "dtype" of a launch without it.
constexpr int kNoState = -1;

struct UpdateParams {
  UpdateKernelView views[kUpdateViewsPerLaunch];
  int32_t num_views;
  int64_t total_chunks;
  int64_t chunk_elems;
  int64_t* counts;
  double* sums;
  float* amax;
};

// One thread's totals over one chunk (the counts' kUpdNumel column unused: the chunk's size is known).
struct ThreadTally {
  uint32_t counts[kUpdateCountColumns];
  double sums[kUpdateSumColumns];
  uint32_t amax_bits;
};

// kUpdateUnitElems consecutive elements of one input of dtype kDtype, as 16-byte vectors in registers.
template <int kDtype>
struct Unit {
  using W = typename Storage<kDtype>::type;
  static constexpr int kVectors = kUpdateUnitElems * static_cast<int>(sizeof(W)) / 16;
  uint4 vectors[kVectors];

  // Global-space loads through the read-only path (LDG.E.128.CONSTANT): the op never writes its inputs.
  __device__ __forceinline__ void load(const void* data, int64_t first) {
    const uint4* at = reinterpret_cast<const uint4*>(static_cast<const W*>(data) + first);
#pragma unroll
    for (int l = 0; l < kVectors; ++l) vectors[l] = __ldg(at + l);
  }
  __device__ __forceinline__ uint32_t bits(int k) const {
    constexpr int kPerVector = 16 / static_cast<int>(sizeof(W));
    return stored_as_f32_bits<kDtype>(vector_word<W>(vectors[k / kPerVector], k % kPerVector));
  }
};

// No exp_avg_sq: nothing read.
template <>
struct Unit<kNoState> {
  __device__ __forceinline__ void load(const void*, int64_t) {}
  __device__ __forceinline__ uint32_t bits(int) const { return 0u; }
};

// Element i of an input of dtype kDtype as float32 bits, by one scalar load (0 without the input).
template <int kDtype>
__device__ __forceinline__ uint32_t element_bits(const void* data, int64_t i) {
  if constexpr (kDtype == kNoState) {
    return 0u;
  } else {
    return stored_as_f32_bits<kDtype>(__ldg(static_cast<const typename Storage<kDtype>::type*>(data) + i));
  }
}

template <int kWeight, int kState>
__device__ __forceinline__ void tally(ThreadTally& t, uint32_t before, uint32_t after, uint32_t grad, uint32_t state) {
  tally_update_element(t, before, after, grad, state, kState != kNoState, min_normal_bits(kWeight),
                       min_normal_bits(kState == kNoState ? kFloat32 : kState));
}

// warp_sum and warp_max: common/warp_reduce.cuh.

// A warp's totals, for the sum across the block's warps.
struct WarpTally {
  uint32_t counts[kUpdateCountColumns];
  double sums[kUpdateSumColumns];
  uint32_t amax_bits;
};

template <int kWeight, int kGrad, int kState>
__global__ void __launch_bounds__(kThreads) update_stats_kernel(const __grid_constant__ UpdateParams p) {
  __shared__ WarpTally warps[kWarps];
  const int tid = threadIdx.x;
  for (int64_t c = blockIdx.x; c < p.total_chunks; c += gridDim.x) {
    int v = 0;  // the view of chunk c (few views per launch: a scan)
    while (v + 1 < p.num_views && p.views[v + 1].first_chunk <= c) ++v;
    const UpdateKernelView& view = p.views[v];
    const int64_t start = (c - view.first_chunk) * p.chunk_elems;
    const int64_t end = start + p.chunk_elems < view.numel ? start + p.chunk_elems : view.numel;
    ThreadTally t{};
    const auto one = [&](int64_t i) {
      tally<kWeight, kState>(t, element_bits<kWeight>(view.before, i), element_bits<kWeight>(view.after, i),
                             element_bits<kGrad>(view.grad, i), element_bits<kState>(view.state, i));
    };
    // Units from the first element at the view's phase; scalar before it and after the last whole unit.
    int64_t head = end - start, units = 0;
    if (view.vector_phase >= 0) {
      head = ((view.vector_phase - start) % kUpdateUnitElems + kUpdateUnitElems) % kUpdateUnitElems;
      head = head < end - start ? head : end - start;
      units = (end - start - head) / kUpdateUnitElems;
    }
    for (int64_t i = start + tid; i < start + head; i += kThreads) one(i);
    for (int64_t u = tid; u < units; u += kThreads) {
      const int64_t first = start + head + u * kUpdateUnitElems;
      Unit<kWeight> before, after;
      Unit<kGrad> grad;
      Unit<kState> state;
      before.load(view.before, first);
      after.load(view.after, first);
      grad.load(view.grad, first);
      state.load(view.state, first);
#pragma unroll
      for (int k = 0; k < kUpdateUnitElems; ++k) {
        tally<kWeight, kState>(t, before.bits(k), after.bits(k), grad.bits(k), state.bits(k));
      }
    }
    for (int64_t i = start + head + units * kUpdateUnitElems + tid; i < end; i += kThreads) one(i);

    // The block's totals: each warp's by shuffles, then the warps' in shared memory.
    const int warp = tid / kWarpSize, lane = tid % kWarpSize;
#pragma unroll
    for (int k = 1; k < kUpdateCountColumns; ++k) t.counts[k] = warp_sum(t.counts[k]);
#pragma unroll
    for (int k = 0; k < kUpdateSumColumns; ++k) t.sums[k] = warp_sum(t.sums[k]);
    t.amax_bits = warp_max(t.amax_bits);
    if (lane == 0) {
      for (int k = 1; k < kUpdateCountColumns; ++k) warps[warp].counts[k] = t.counts[k];
      for (int k = 0; k < kUpdateSumColumns; ++k) warps[warp].sums[k] = t.sums[k];
      warps[warp].amax_bits = t.amax_bits;
    }
    __syncthreads();
    if (tid > 0 && tid < kUpdateCountColumns) {
      uint64_t total = 0;
      for (int w = 0; w < kWarps; ++w) total += warps[w].counts[tid];
      if (total != 0) {
        atomicAdd(reinterpret_cast<unsigned long long*>(p.counts + view.out_row * kUpdateCountColumns + tid),
                  static_cast<unsigned long long>(total));
      }
    } else if (tid == 0) {  // numel: the chunk's elements
      atomicAdd(reinterpret_cast<unsigned long long*>(p.counts + view.out_row * kUpdateCountColumns + kUpdNumel),
                static_cast<unsigned long long>(end - start));
    } else if (tid >= kUpdateCountColumns && tid < kUpdateCountColumns + kUpdateSumColumns) {
      const int k = tid - kUpdateCountColumns;
      double total = 0.0;
      for (int w = 0; w < kWarps; ++w) total += warps[w].sums[k];
      if (total != 0.0) atomicAdd(p.sums + view.out_row * kUpdateSumColumns + k, total);
    } else if (tid == kUpdateCountColumns + kUpdateSumColumns) {
      uint32_t total = 0u;
      for (int w = 0; w < kWarps; ++w) total = total > warps[w].amax_bits ? total : warps[w].amax_bits;
      if (total != 0u) atomicMax(reinterpret_cast<unsigned int*>(p.amax + view.out_row), total);
    }
    __syncthreads();  // warps[] read before the next chunk writes it
  }
}

// One launch of the kernel of a dtype combination (the dtypes as template arguments from here on).
template <int kWeight, int kGrad, int kState, class Backend>
void launch_update_kernel(const UpdateParams& params, Backend& backend) {
  const auto kernel = update_stats_kernel<kWeight, kGrad, kState>;
  backend.launch(kernel, backend.blocks(kernel, kThreads, params.total_chunks), kThreads, params);
}

template <int kWeight, int kGrad, class Backend>
void launch_by_state(int32_t state, const UpdateParams& params, Backend& backend) {
  switch (state) {
    case kFloat32: return launch_update_kernel<kWeight, kGrad, kFloat32>(params, backend);
    case kFloat16: return launch_update_kernel<kWeight, kGrad, kFloat16>(params, backend);
    case kBFloat16: return launch_update_kernel<kWeight, kGrad, kBFloat16>(params, backend);
    default: return launch_update_kernel<kWeight, kGrad, kNoState>(params, backend);
  }
}

template <int kWeight, class Backend>
void launch_by_grad(int32_t grad, int32_t state, const UpdateParams& params, Backend& backend) {
  switch (grad) {
    case kFloat16: return launch_by_state<kWeight, kFloat16>(state, params, backend);
    case kBFloat16: return launch_by_state<kWeight, kBFloat16>(state, params, backend);
    default: return launch_by_state<kWeight, kFloat32>(state, params, backend);
  }
}

// The dtypes a view's kernel is compiled for: weight, grad, exp_avg_sq (kNoState without it).
struct DtypeKey {
  int32_t weight, grad, state;
  bool operator==(const DtypeKey& other) const {
    return weight == other.weight && grad == other.grad && state == other.state;
  }
};

inline DtypeKey dtype_key(const UpdateKernelView& view) {
  return {view.weight_dtype, view.grad_dtype, view.state == nullptr ? kNoState : view.state_dtype};
}

template <class Backend>
void launch_views(const DtypeKey& key, UpdateParams& params, Backend& backend) {
  int64_t chunks = 0;
  for (int v = 0; v < params.num_views; ++v) {
    params.views[v].first_chunk = chunks;
    chunks += (params.views[v].numel + params.chunk_elems - 1) / params.chunk_elems;
  }
  params.total_chunks = chunks;
  switch (key.weight) {
    case kFloat16: return launch_by_grad<kFloat16>(key.grad, key.state, params, backend);
    case kBFloat16: return launch_by_grad<kBFloat16>(key.grad, key.state, params, backend);
    default: return launch_by_grad<kFloat32>(key.grad, key.state, params, backend);
  }
}

// The launch sequence, for any backend (common/cuda_launch.cuh's CudaBackend on the GPU, common/cuda_emu.h's Backend
// on the CPU): the outputs zeroed, then for each dtype combination, in the order of its first view, one launch per
// kUpdateViewsPerLaunch of its views. Asynchronous on a GPU.
template <class Backend>
void run_update_stats(const UpdateLaunchPlan& plan, Backend& backend) {
  backend.zero(plan.counts, static_cast<int64_t>(sizeof(int64_t)) * plan.num_tensors * kUpdateCountColumns);
  backend.zero(plan.sums, static_cast<int64_t>(sizeof(double)) * plan.num_tensors * kUpdateSumColumns);
  backend.zero(plan.amax, static_cast<int64_t>(sizeof(float)) * plan.num_tensors);
  std::vector<bool> launched(static_cast<size_t>(plan.num_views), false);
  for (int64_t first = 0; first < plan.num_views; ++first) {
    if (launched[first]) continue;
    const DtypeKey key = dtype_key(plan.views[first]);
    UpdateParams params{};
    params.chunk_elems = plan.chunk_elems;
    params.counts = plan.counts;
    params.sums = plan.sums;
    params.amax = plan.amax;
    for (int64_t v = first; v < plan.num_views; ++v) {
      if (launched[v] || !(dtype_key(plan.views[v]) == key)) continue;
      launched[v] = true;
      UpdateKernelView& view = params.views[params.num_views++];
      view = plan.views[v];
      view.vector_phase = update_vector_phase(view);
      if (params.num_views == kUpdateViewsPerLaunch) {
        launch_views(key, params, backend);
        params.num_views = 0;
      }
    }
    if (params.num_views > 0) launch_views(key, params, backend);
  }
}

}  // namespace AMPI_KERNELS_NAMESPACE
}  // namespace update_kernels
}  // namespace amp_inspect
