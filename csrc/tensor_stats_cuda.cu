// tensor_stats_cuda.cu: the CUDA kernels of amp_inspect::tensor_stats.
//
// One launch covers every tensor of the call, however many: the tensor table lives in device memory
// (copied asynchronously from pinned memory by tensor_stats_cuda_op.cpp), and a fixed grid of blocks walks
// the flat list of work chunks (kCudaChunkElems elements, never crossing a tensor), finding a chunk's
// tensor by binary search over the table. Per chunk a block counts in registers (per thread), in shared
// memory (one exponent histogram per warp, so same-bin atomics only contend within a warp), then merges
// into the outputs with one global atomic per counter and per nonzero bin. A second, tiny launch turns the
// raw threshold counts into overflow / subnormal / underflow. The per-element tests come from numerics.h,
// the same code the CPU kernel runs. Built without fast-math (float32 subnormals must survive).
#include <c10/cuda/CUDAException.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "tensor_stats_cuda.h"

namespace amp_inspect {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpSize = 32;
constexpr int kWarps = kThreads / kWarpSize;
constexpr int kBlocksPerSm = 4;  // enough resident blocks to cover memory latency
constexpr int kVectorBytes = 16;
constexpr int kMaxDevices = 64;
constexpr int kFinalizeThreads = 128;
static_assert(kCudaChunkElems % (kThreads * 8) == 0, "a chunk is a whole number of vector steps");

__device__ __forceinline__ float bits_as_float(uint32_t b) { return __uint_as_float(b); }
__device__ __forceinline__ uint32_t float_as_bits(float f) { return __float_as_uint(f); }

// One thread's counts for the chunk in hand. uint32 is enough: a thread sees at most
// kCudaChunkElems / kThreads elements per chunk.
struct ThreadCounts {
  uint32_t nan, posinf, neginf, zero;
  uint32_t at_or_above_overflow[kMaxFormats], below_normal[kMaxFormats], at_or_below_zero[kMaxFormats];
  uint32_t max_abs, min_abs_nonzero;  // float32 bits
  double sumsq;

  __device__ void clear() {
    nan = posinf = neginf = zero = 0;
#pragma unroll
    for (int f = 0; f < kMaxFormats; ++f) at_or_above_overflow[f] = below_normal[f] = at_or_below_zero[f] = 0;
    max_abs = 0;
    min_abs_nonzero = kInfBits32;
    sumsq = 0.0;
  }
};

struct ChunkContext {
  const CudaStatsArgs& args;
  uint32_t* warp_hist;  // this warp's 256 bins in shared memory
  float scale;
  bool unscale;  // unscale_stats_: write x * inv_scale back
  float inv_scale;
};

// x * inv_scale in the tensor's dtype, as torch's unscale kernel computes it.
template <int kDtype, typename T>
__device__ __forceinline__ T unscaled(T raw, float inv_scale) {
  if constexpr (kDtype == kFloat32) {
    return float_as_bits(__fmul_rn(bits_as_float(raw), inv_scale));
  } else if constexpr (kDtype == kFloat64) {
    const double x = __longlong_as_double(static_cast<long long>(raw));
    return static_cast<T>(__double_as_longlong(__dmul_rn(x, static_cast<double>(inv_scale))));
  } else if constexpr (kDtype == kFloat16) {
    const float x = bits_as_float(fp16_to_f32_bits(raw));
    return __half_as_ushort(__float2half_rn(__fmul_rn(x, inv_scale)));
  } else {
    const float x = bits_as_float(bf16_to_f32_bits(raw));
    return __bfloat16_as_ushort(__float2bfloat16_rn(__fmul_rn(x, inv_scale)));
  }
}

// Counts one element given as float32 bits of x (scaled here when the call has a scale).
__device__ __forceinline__ void count32(ThreadCounts& c, uint32_t bits, const ChunkContext& ctx) {
  if (ctx.args.has_scale) bits = float_as_bits(__fmul_rn(bits_as_float(bits), ctx.scale));
  count_thresholds32(c, bits, ctx.args.bounds, ctx.args.num_formats);
  const uint32_t a = bits & kAbsMask32;
  if (is_finite32(a)) {
    c.max_abs = max(c.max_abs, a);
    if (a != 0) c.min_abs_nonzero = min(c.min_abs_nonzero, a);
    const double v = static_cast<double>(bits_as_float(a));
    c.sumsq += v * v;
  }
  atomicAdd(&ctx.warp_hist[hist_bin(bits)], 1u);
}

// Counts one float64 element without a scale: classified on its exact value.
__device__ __forceinline__ void count64(ThreadCounts& c, uint64_t bits, const ChunkContext& ctx) {
  count_thresholds64(c, bits, ctx.args.bounds, ctx.args.num_formats);
  const uint64_t a = bits & kAbsMask64;
  const double x = __longlong_as_double(static_cast<long long>(bits));
  if (is_finite64(a)) {
    // Extremes are kept as float32 bits: rounding is monotonic, so this is float32 of the exact extreme.
    const uint32_t a32 = float_as_bits(__double2float_rn(fabs(x)));
    c.max_abs = max(c.max_abs, a32);
    if (a != 0) c.min_abs_nonzero = min(c.min_abs_nonzero, a32);
    c.sumsq += x * x;
  }
  atomicAdd(&ctx.warp_hist[hist_bin(float_as_bits(__double2float_rn(x)))], 1u);
}

// float64 x as float32 bits, rounded once (the scaled path judges float32(x) * scale).
__device__ __forceinline__ uint32_t f64_to_f32_bits(uint64_t raw) {
  return float_as_bits(__double2float_rn(__longlong_as_double(static_cast<long long>(raw))));
}

template <int kDtype>
__device__ __forceinline__ uint32_t half_to_f32_bits(uint16_t raw) {
  return kDtype == kFloat16 ? fp16_to_f32_bits(raw) : bf16_to_f32_bits(raw);
}

// Counts elements [start, start + count) of one view. T is the storage word of the dtype.
template <int kDtype, typename T>
__device__ void count_range(ThreadCounts& c, const TensorView& view, int64_t start, int64_t count,
                            const ChunkContext& ctx) {
  T* base = static_cast<T*>(const_cast<void*>(view.data));  // written only by unscale_stats_
  auto count_raw = [&](T raw) {
    if constexpr (kDtype == kFloat64) {
      if (!ctx.args.has_scale) {
        count64(c, raw, ctx);
        return;
      }
      count32(c, f64_to_f32_bits(raw), ctx);
    } else if constexpr (kDtype == kFloat32) {
      count32(c, raw, ctx);
    } else {
      count32(c, half_to_f32_bits<kDtype>(raw), ctx);
    }
  };
  if (!is_contiguous_view(view)) {  // strided: one index computation per element
    for (int64_t i = threadIdx.x; i < count; i += kThreads) {
      T& x = base[element_offset(view, start + i)];
      count_raw(x);
      if (ctx.unscale) x = unscaled<kDtype>(x, ctx.inv_scale);
    }
    return;
  }
  T* p = base + start;
  constexpr int kPerVector = kVectorBytes / sizeof(T);
  int64_t head = 0;
  if (reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0) {
    // 16-byte loads over the aligned bulk.
    const int64_t vectors = count / kPerVector;
    uint4* pv = reinterpret_cast<uint4*>(p);
    for (int64_t v = threadIdx.x; v < vectors; v += kThreads) {
      uint4 word = pv[v];
      T* items = reinterpret_cast<T*>(&word);
#pragma unroll
      for (int k = 0; k < kPerVector; ++k) count_raw(items[k]);
      if (ctx.unscale) {
#pragma unroll
        for (int k = 0; k < kPerVector; ++k) items[k] = unscaled<kDtype>(items[k], ctx.inv_scale);
        pv[v] = word;
      }
    }
    head = vectors * kPerVector;
  }
  for (int64_t i = head + threadIdx.x; i < count; i += kThreads) {
    count_raw(p[i]);
    if (ctx.unscale) p[i] = unscaled<kDtype>(p[i], ctx.inv_scale);
  }
}

// Sums a value over the block; the result is valid in thread 0.
template <typename T>
__device__ T block_sum(T value, T* scratch) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_down_sync(0xFFFFFFFFu, value, offset);
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  __syncthreads();
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  T total = 0;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) total += scratch[w];
  }
  return total;
}

template <bool kMax>
__device__ uint32_t block_extreme(uint32_t value, uint32_t* scratch) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const uint32_t other = __shfl_down_sync(0xFFFFFFFFu, value, offset);
    value = kMax ? max(value, other) : min(value, other);
  }
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  __syncthreads();
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  uint32_t result = value;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) result = kMax ? max(result, scratch[w]) : min(result, scratch[w]);
  }
  return result;
}

__device__ __forceinline__ void add_count(int64_t* target, uint32_t value) {
  if (value != 0) atomicAdd(reinterpret_cast<unsigned long long*>(target), static_cast<unsigned long long>(value));
}

__global__ void __launch_bounds__(kThreads) tensor_stats_kernel(const CudaStatsArgs args) {
  __shared__ uint32_t hist[kWarps][kHistBins];
  __shared__ uint32_t scratch32[kWarps];
  __shared__ double scratch64[kWarps];
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const float scale = args.has_scale ? (args.scale_ptr ? *args.scale_ptr : args.scale_value) : 1.0f;
  const float inv_scale = args.inv_scale ? *args.inv_scale : 1.0f;
  // Written even when inv_scale is 1, as torch's kernel does (the round trip canonicalises NaN payloads).
  const ChunkContext ctx{args, hist[warp], scale, args.inv_scale != nullptr, inv_scale};
  const int columns = count_columns(args.num_formats);

  for (int64_t chunk = blockIdx.x; chunk < args.total_chunks; chunk += gridDim.x) {
    const int64_t v = tensor_of_chunk(args.views, args.num_views, chunk);
    const TensorView& view = args.views[v];
    const int64_t start = (chunk - view.first_chunk) * kCudaChunkElems;
    const int64_t remaining = view.numel - start;
    const int64_t count = remaining < kCudaChunkElems ? remaining : kCudaChunkElems;

    for (int b = lane; b < kHistBins; b += kWarpSize) hist[warp][b] = 0;
    __syncwarp();

    ThreadCounts c;
    c.clear();
    switch (view.dtype) {
      case kFloat32:
        count_range<kFloat32, uint32_t>(c, view, start, count, ctx);
        break;
      case kFloat16:
        count_range<kFloat16, uint16_t>(c, view, start, count, ctx);
        break;
      case kBFloat16:
        count_range<kBFloat16, uint16_t>(c, view, start, count, ctx);
        break;
      default:
        count_range<kFloat64, uint64_t>(c, view, start, count, ctx);
        break;
    }

    // Merge the block's counts into the tensor's row (raw threshold counts, finalized later).
    int64_t* row = args.counts + view.out_row * columns;
    const uint32_t nan = block_sum(c.nan, scratch32);
    const uint32_t posinf = block_sum(c.posinf, scratch32);
    const uint32_t neginf = block_sum(c.neginf, scratch32);
    const uint32_t zero = block_sum(c.zero, scratch32);
    if (threadIdx.x == 0) {
      add_count(row + 0, static_cast<uint32_t>(count));
      add_count(row + 1, nan);
      add_count(row + 2, posinf);
      add_count(row + 3, neginf);
      add_count(row + 4, zero);
    }
    for (int f = 0; f < args.num_formats; ++f) {
      const uint32_t over = block_sum(c.at_or_above_overflow[f], scratch32);
      const uint32_t below = block_sum(c.below_normal[f], scratch32);
      const uint32_t at_zero = block_sum(c.at_or_below_zero[f], scratch32);
      if (threadIdx.x == 0) {
        add_count(row + kFixedCountColumns + f, over);
        add_count(row + kFixedCountColumns + args.num_formats + f, below);
        add_count(row + kFixedCountColumns + 2 * args.num_formats + f, at_zero);
      }
    }
    const uint32_t max_abs = block_extreme<true>(c.max_abs, scratch32);
    const uint32_t min_abs = block_extreme<false>(c.min_abs_nonzero, scratch32);
    const double sumsq = block_sum(c.sumsq, scratch64);
    if (threadIdx.x == 0) {
      // Non-negative float32 bits order like the values, so integer atomics give the float extremes.
      if (max_abs != 0) atomicMax(reinterpret_cast<unsigned int*>(args.amax + view.out_row), max_abs);
      if (min_abs != kInfBits32) {
        atomicMin(reinterpret_cast<unsigned int*>(args.amin_nonzero + view.out_row), min_abs);
      }
      if (sumsq != 0.0) atomicAdd(args.sumsq + view.out_row, sumsq);
    }

    __syncthreads();  // every warp's histogram is complete
    int64_t* hist_row = args.hist + view.out_row * kHistBins;
    for (int b = threadIdx.x; b < kHistBins; b += kThreads) {
      uint32_t total = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += hist[w][b];
      add_count(hist_row + b, total);
    }
    __syncthreads();  // histograms are read before the next chunk clears them
  }
}

// Turns each row's raw threshold counts into overflow / subnormal / underflow, in place.
__global__ void finalize_kernel(int64_t* counts, int64_t num_tensors, int num_formats, float* found_inf) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= num_tensors) return;
  int64_t* row = counts + t * count_columns(num_formats);
  RawCounts raw;
  clear_counts(raw);
  raw.numel = row[0];
  raw.nan = row[1];
  raw.posinf = row[2];
  raw.neginf = row[3];
  raw.zero = row[4];
  for (int f = 0; f < num_formats; ++f) {
    raw.at_or_above_overflow[f] = row[kFixedCountColumns + f];
    raw.below_normal[f] = row[kFixedCountColumns + num_formats + f];
    raw.at_or_below_zero[f] = row[kFixedCountColumns + 2 * num_formats + f];
  }
  finalize_counts(raw, num_formats, row);
  // Every writer stores the same value, so the race is benign (as in torch's own unscale kernel).
  if (found_inf != nullptr && raw.nan + raw.posinf + raw.neginf > 0) *found_inf = 1.0f;
}

int multiprocessor_count(int device_index) {
  static int cached[kMaxDevices] = {};
  if (device_index < 0 || device_index >= kMaxDevices) device_index = 0;
  if (cached[device_index] == 0) {
    int count = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device_index));
    cached[device_index] = count;
  }
  return cached[device_index];
}

}  // namespace

void launch_tensor_stats(const CudaStatsArgs& args, int device_index, cudaStream_t stream) {
  if (args.total_chunks > 0) {
    const int64_t max_blocks = static_cast<int64_t>(multiprocessor_count(device_index)) * kBlocksPerSm;
    const int blocks = static_cast<int>(args.total_chunks < max_blocks ? args.total_chunks : max_blocks);
    tensor_stats_kernel<<<blocks, kThreads, 0, stream>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  if (args.num_tensors > 0) {
    const int64_t blocks = (args.num_tensors + kFinalizeThreads - 1) / kFinalizeThreads;
    finalize_kernel<<<static_cast<unsigned int>(blocks), kFinalizeThreads, 0, stream>>>(
        args.counts, args.num_tensors, args.num_formats, args.found_inf);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

}  // namespace amp_inspect
