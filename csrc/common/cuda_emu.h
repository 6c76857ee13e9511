// cuda_emu.h: the CUDA execution model on the host, so that CUDA kernel source compiled by the host compiler
// runs on the CPU as it would on a GPU (for tests: every op's kernels, <op>_kernels.cuh, unchanged), and the
// backend their launch sequences run them with here (Backend, the emulated twin of cuda_launch.cuh's CudaBackend).
//
// Include it before the kernel source. It defines what that source uses:
//   - the qualifiers (__global__, __device__, __shared__, __launch_bounds__, __grid_constant__, ...);
//   - threadIdx / blockIdx / blockDim / gridDim;
//   - __syncthreads and __syncwarp as real barriers. Every CUDA thread of a block is a host thread, so a
//     missing barrier is a real data race (ThreadSanitizer sees it) and a barrier that part of the block never
//     reaches, or that threads reach at different places, ends the launch with an error naming the lines
//     instead of hanging;
//   - __shfl_down_sync and __shfl_xor_sync as exchanges through a warp barrier and two buffers used in turn
//     (full masks only);
//   - the atomics the kernels use, on std::atomic_ref;
//   - exact host equivalents of the intrinsics (__fmul_rn, __float2half_rn, __half2float, __float2bfloat16_rn,
//     bit casts, the cached loads __ldg / __ldcs / __ldcg / __stcs, __threadfence);
//   - __any_sync as a vote the kernels must be exact under whatever the other lanes say (see below).
//     NaN results of the half/bfloat16 conversions are the canonical 0x7FFF, as the GPU's cvt gives.
// Blocks of a launch run one after another, so __shared__ variables can be function statics; launches are
// serialised by a process-wide mutex. Build without -ffast-math; FMA contraction is off from here on (the pragma
// below): the kernels' float math must round as the GPU's _rn intrinsics do.
//
// Torch-free. Include it after any torch header (the shim's macros must not meet them) and before the kernels.
#pragma once

#if defined(__CUDACC__)
#error "cuda_emu.h is for host compilers only"
#endif

// No a*b+c contracted into one FMA: the kernels' float math must round like the GPU's _rn intrinsics.
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <climits>
#include <cmath>
#include <ctime>

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __grid_constant__
#define __restrict__ __restrict
// Blocks never overlap in time, so each __shared__ variable exists once (thread-safe static init is not
// needed: every use is of plain arrays, zero-initialised before main).
#define __shared__ static
// Kernel source compiled here gets its own symbol names, apart from the GPU build's in the same library.
#define AMPI_KERNELS_NAMESPACE host_emulation

struct uint4 {
  alignas(16) uint32_t x;
  uint32_t y, z, w;
};
static_assert(sizeof(uint4) == 16 && alignof(uint4) == 16, "uint4 is one 16-byte vector");

struct dim3 {
  unsigned int x = 1, y = 1, z = 1;
};

namespace cuda_emu {

// How long a barrier waits for the rest of its threads before declaring the launch broken.
constexpr std::chrono::seconds kBarrierTimeout{20};
constexpr int kWarpSize = 32;

// Thrown in every thread of a block once a barrier is broken; the launch reports the first message.
struct LaunchError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A reusable barrier for `parties` threads that also checks they all arrived at the same source line.
// Waiters sleep on a futex of the generation counter (one wake-up call frees them all, no mutex to fight
// over: 256 host threads share two cores); the generation's acquire/release order is what ThreadSanitizer
// sees as the barrier's happens-before.
class Barrier {
 public:
  void reset(int parties, const char* what) {
    parties_ = parties;
    what_ = what;
    arrived_.store(0);
    line_.store(-1);
  }

  void arrive_and_wait(int line, std::atomic<bool>& broken, std::string& reason, std::mutex& reason_mutex) {
    if (broken.load()) throw LaunchError("launch already broken");
    const uint32_t generation = generation_.load(std::memory_order_acquire);
    int first_line = -1;
    if (!line_.compare_exchange_strong(first_line, line) && first_line != line) {
      fail(broken, reason, reason_mutex,
           std::string(what_) + " reached at different places by threads of one group (lines " +
               std::to_string(first_line) + " and " + std::to_string(line) + ")");
    }
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == parties_) {
      arrived_.store(0, std::memory_order_relaxed);
      line_.store(-1, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      futex_wake_all(generation_);
      return;
    }
    const auto deadline = std::chrono::steady_clock::now() + kBarrierTimeout;
    while (generation_.load(std::memory_order_acquire) == generation) {
      if (broken.load()) throw LaunchError("launch broken");
      if (std::chrono::steady_clock::now() > deadline) {
        fail(broken, reason, reason_mutex,
             std::string(what_) + " at line " + std::to_string(line) + " was reached by " +
                 std::to_string(arrived_.load()) + " of " + std::to_string(parties_) +
                 " threads (the others exited or wait elsewhere)");
      }
      futex_wait(generation_, generation);
    }
  }

  // Wakes every waiter (they then see the launch broken).
  void wake_all() {
    generation_.fetch_add(1, std::memory_order_release);
    futex_wake_all(generation_);
  }

 private:
  static void futex_wait(std::atomic<uint32_t>& word, uint32_t expected) {
    timespec timeout{0, 200 * 1000 * 1000};  // wake now and then to check the deadline
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &timeout, nullptr, 0);
  }
  static void futex_wake_all(std::atomic<uint32_t>& word) {
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
  }

  [[noreturn]] void fail(std::atomic<bool>& broken, std::string& reason, std::mutex& reason_mutex,
                         const std::string& message) {
    {
      std::lock_guard<std::mutex> guard(reason_mutex);
      if (reason.empty()) reason = message;
    }
    broken.store(true);
    wake_all();
    throw LaunchError(message);
  }

  std::atomic<uint32_t> generation_{0};
  std::atomic<int> arrived_{0};
  std::atomic<int> line_{-1};
  int parties_ = 0;
  const char* what_ = "";
};

// The block being run: its barriers and the warps' shuffle buffers.
struct Block {
  Barrier block_barrier;
  std::vector<Barrier> warp_barriers;
  std::vector<uint64_t> shuffle[2];  // two buffers of one slot per thread, used in turn
  std::atomic<bool> broken{false};
  std::mutex reason_mutex;
  std::string reason;

  void reset(int threads) {
    block_barrier.reset(threads, "__syncthreads()");
    const int warps = (threads + kWarpSize - 1) / kWarpSize;
    warp_barriers = std::vector<Barrier>(static_cast<size_t>(warps));  // atomics: built, not copied
    for (int w = 0; w < warps; ++w) {
      const int in_warp = std::min(kWarpSize, threads - w * kWarpSize);
      warp_barriers[static_cast<size_t>(w)].reset(in_warp, "a warp barrier (__syncwarp or __shfl_*_sync)");
    }
    shuffle[0].assign(static_cast<size_t>(threads), 0);
    shuffle[1].assign(static_cast<size_t>(threads), 0);
    broken.store(false);
    reason.clear();
  }

  void break_launch() {
    broken.store(true);
    block_barrier.wake_all();
    for (auto& b : warp_barriers) b.wake_all();
  }
};

inline thread_local dim3 thread_index;
inline thread_local dim3 block_index;
inline thread_local Block* current_block = nullptr;
inline thread_local unsigned shuffle_parity = 0;
inline dim3 block_dims;
inline dim3 grid_dims;

inline std::mutex& launch_mutex() {
  static std::mutex m;
  return m;
}

inline void sync_threads(int line) {
  Block& b = *current_block;
  b.block_barrier.arrive_and_wait(line, b.broken, b.reason, b.reason_mutex);
}

inline void sync_warp(int line) {
  Block& b = *current_block;
  b.warp_barriers[thread_index.x / kWarpSize].arrive_and_wait(line, b.broken, b.reason, b.reason_mutex);
}

// One exchange per call, through one of two buffers in turn: a lane can only write buffer k again (two
// shuffles later) after every lane reached the barrier of the shuffle in between, so after every lane read
// it. One warp barrier per shuffle instead of two.
template <typename T>
T shfl_down(unsigned mask, T value, unsigned delta, int line) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffled values are at most 8 bytes");
  if (mask != 0xFFFFFFFFu) throw LaunchError("__shfl_down_sync with a partial mask is not emulated");
  Block& b = *current_block;
  const unsigned lane = thread_index.x % kWarpSize;
  const unsigned warp_first = thread_index.x - lane;
  std::vector<uint64_t>& buffer = b.shuffle[shuffle_parity];
  shuffle_parity ^= 1u;
  uint64_t slot = 0;
  std::memcpy(&slot, &value, sizeof(T));
  buffer[thread_index.x] = slot;
  sync_warp(line);  // every lane has written
  T result = value;
  if (lane + delta < kWarpSize) std::memcpy(&result, &buffer[warp_first + lane + delta], sizeof(T));
  return result;
}

// __shfl_xor_sync: lane ^ lane_mask's value, through the same two buffers and one warp barrier as shfl_down
// (full masks only; a butterfly of these gives every lane of an aligned group of lanes the group's reduction).
template <typename T>
T shfl_xor(unsigned mask, T value, unsigned lane_mask, int line) {
  static_assert(sizeof(T) <= sizeof(uint64_t), "shuffled values are at most 8 bytes");
  if (mask != 0xFFFFFFFFu) throw LaunchError("__shfl_xor_sync with a partial mask is not emulated");
  Block& b = *current_block;
  const unsigned lane = thread_index.x % kWarpSize;
  const unsigned warp_first = thread_index.x - lane;
  std::vector<uint64_t>& buffer = b.shuffle[shuffle_parity];
  shuffle_parity ^= 1u;
  uint64_t slot = 0;
  std::memcpy(&slot, &value, sizeof(T));
  buffer[thread_index.x] = slot;
  sync_warp(line);  // every lane has written
  T result = value;
  const unsigned source = lane ^ lane_mask;
  if (source < kWarpSize) std::memcpy(&result, &buffer[warp_first + source], sizeof(T));
  return result;
}

// Runs kernel(args...) on a grid of blocks, each block's threads as host threads; blocks one after another.
// Throws std::runtime_error with the first broken barrier's message.
template <class Kernel, class... Args>
void launch(int64_t blocks, int threads, Kernel kernel, const Args&... args) {
  std::lock_guard<std::mutex> serial(launch_mutex());
  grid_dims = dim3{static_cast<unsigned>(blocks), 1, 1};
  block_dims = dim3{static_cast<unsigned>(threads), 1, 1};
  Block block;
  for (int64_t b = 0; b < blocks; ++b) {
    block.reset(threads);
    std::vector<std::thread> workers;
    workers.reserve(static_cast<size_t>(threads));
    std::exception_ptr other_error;
    std::mutex error_mutex;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        thread_index = dim3{static_cast<unsigned>(t), 0, 0};
        block_index = dim3{static_cast<unsigned>(b), 0, 0};
        current_block = &block;
        shuffle_parity = 0;
        try {
          kernel(args...);
        } catch (const LaunchError&) {
          block.break_launch();
        } catch (...) {
          std::lock_guard<std::mutex> guard(error_mutex);
          if (!other_error) other_error = std::current_exception();
          block.break_launch();
        }
        current_block = nullptr;
      });
    }
    for (auto& w : workers) w.join();
    if (!block.reason.empty()) {
      throw std::runtime_error("emulated CUDA launch, block " + std::to_string(b) + ": " + block.reason);
    }
    if (other_error) std::rethrow_exception(other_error);
  }
}

// What an op's launch sequence (run_* in its kernels .cuh) runs its kernels with here: the calls of
// cuda_launch.cuh's CudaBackend, on host memory, with emulated launches and a chosen number of blocks.
struct Backend {
  // Without an override, a launch gets as many blocks as its work, at most this many (each block is 256 host
  // threads, so more would only be slower).
  static constexpr int64_t kDefaultBlocks = 4;
  // A kernel of a fixed grid (blocks_up_to) gets at most this many: enough to run its grid-stride loop.
  static constexpr int64_t kMostFixedBlocks = 2;
  int64_t blocks_override = 0;  // > 0: exactly this many (more than the work on purpose: such blocks find none)

  void zero(void* at, int64_t bytes) {
    if (bytes > 0) std::memset(at, 0, static_cast<size_t>(bytes));
  }
  void copy(void* to, const void* from, int64_t bytes) {
    if (bytes > 0) std::memcpy(to, from, static_cast<size_t>(bytes));
  }

  template <class Kernel>
  int64_t blocks(Kernel, int, int64_t work) const {
    if (blocks_override > 0) return blocks_override;
    return work < kDefaultBlocks ? work : kDefaultBlocks;
  }
  int64_t blocks_up_to(int64_t work, int64_t most) const {
    const int64_t cap = most < kMostFixedBlocks ? most : kMostFixedBlocks;
    return work < cap ? work : cap;
  }

  template <class Kernel, class Params>
  void launch(Kernel kernel, int64_t grid, int threads, const Params& params) {
    if (grid > 0) ::cuda_emu::launch(grid, threads, kernel, params);
  }
};

// Round to nearest even of float32 bits to binary16 bits; NaN gives 0x7FFF (the GPU's canonical NaN).
inline uint16_t float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return 0x7FFFu;
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to Inf (65520 and up)
  if (a >= 0x38800000u) {                                               // a normal half: rebias and round
    const uint32_t rebased = a - ((127u - 15u) << 23);
    return static_cast<uint16_t>(sign | ((rebased + 0xFFFu + ((rebased >> 13) & 1u)) >> 13));
  }
  if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // at or below 2^-25: zero (the tie is even)
  // A subnormal half (or the smallest normal, by rounding up): mantissa = |v| * 2^24, rounded to even.
  const uint32_t exponent = a >> 23;
  const uint32_t significand = (a & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126u - exponent;  // |v| * 2^24 = significand * 2^(exponent - 126)
  const uint32_t kept = significand >> shift;
  const uint32_t rest = significand & ((1u << shift) - 1u);
  const uint32_t half_way = 1u << (shift - 1u);
  const uint32_t rounded = kept + ((rest > half_way || (rest == half_way && (kept & 1u))) ? 1u : 0u);
  return static_cast<uint16_t>(sign | rounded);
}

// Round to nearest even of float32 bits to bfloat16 bits; NaN gives 0x7FFF.
inline uint16_t float_to_bfloat16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFFu;
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

template <typename To, typename From>
To bit_cast(From from) {
  static_assert(sizeof(To) == sizeof(From), "same size");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

}  // namespace cuda_emu

#define threadIdx (::cuda_emu::thread_index)
#define blockIdx (::cuda_emu::block_index)
#define blockDim (::cuda_emu::block_dims)
#define gridDim (::cuda_emu::grid_dims)
#define __syncthreads() ::cuda_emu::sync_threads(__LINE__)
#define __syncwarp(...) ::cuda_emu::sync_warp(__LINE__)
#define __shfl_down_sync(mask, value, delta) ::cuda_emu::shfl_down((mask), (value), (delta), __LINE__)
#define __shfl_xor_sync(mask, value, lane_mask) ::cuda_emu::shfl_xor((mask), (value), (lane_mask), __LINE__)

struct __half {
  uint16_t bits;
};
struct __nv_bfloat16 {
  uint16_t bits;
};

inline float __uint_as_float(uint32_t bits) { return cuda_emu::bit_cast<float>(bits); }
inline uint32_t __float_as_uint(float f) { return cuda_emu::bit_cast<uint32_t>(f); }
inline double __longlong_as_double(long long bits) { return cuda_emu::bit_cast<double>(bits); }
inline long long __double_as_longlong(double d) { return cuda_emu::bit_cast<long long>(d); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __double2float_rn(double d) { return static_cast<float>(d); }
inline __half __float2half_rn(float f) { return __half{cuda_emu::float_to_half_bits(f)}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{cuda_emu::float_to_bfloat16_bits(f)}; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }

// binary16 bits to float32, exactly (a subnormal half is its mantissa times 2^-24); NaN stays NaN.
inline float half_bits_to_float(uint16_t h) {
  const float sign = (h & 0x8000u) != 0 ? -1.0f : 1.0f;
  const int exponent = (h >> 10) & 0x1F;
  const int mantissa = h & 0x3FF;
  if (exponent == 0x1F) return mantissa == 0 ? sign * INFINITY : NAN;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  return sign * std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
}
inline __half __ushort_as_half(unsigned short bits) { return __half{bits}; }
inline float __half2float(__half h) { return half_bits_to_float(h.bits); }

// Global-space loads and stores with cache hints: plain memory accesses here.
template <typename T>
T __ldg(const T* at) {
  return *at;
}
template <typename T>
T __ldcs(const T* at) {
  return *at;
}
template <typename T>
T __ldcg(const T* at) {
  return *at;
}
// A read-modify-write of one process-wide word: it orders the caller's memory accesses like a fence, and,
// unlike std::atomic_thread_fence, ThreadSanitizer understands it (blocks also run one after another here).
inline void __threadfence() {
  static std::atomic<unsigned> fence_word{0};
  fence_word.fetch_add(0u, std::memory_order_acq_rel);
}
template <typename T>
void __stcs(T* at, T value) {
  *at = value;
}

// Warp votes. The emulation does not know which lanes a GPU would run together, and the kernels must be
// exact whatever the other lanes vote (they only pick between exact ways of counting). So the vote answers the
// caller's own predicate on even lanes and true on odd ones: both of a kernel's ways run in every test, and no
// lane waits on another (divergent loops stay legal, as __activemask makes them on the GPU).
inline unsigned __activemask() { return 0xFFFFFFFFu; }
inline bool __any_sync(unsigned, bool predicate) { return predicate || (threadIdx.x % 2) == 1; }

inline uint32_t max(uint32_t a, uint32_t b) { return a > b ? a : b; }
inline uint32_t min(uint32_t a, uint32_t b) { return a < b ? a : b; }

inline unsigned int atomicAdd(unsigned int* address, unsigned int value) {
  return std::atomic_ref<unsigned int>(*address).fetch_add(value, std::memory_order_relaxed);
}
inline unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
  return std::atomic_ref<unsigned long long>(*address).fetch_add(value, std::memory_order_relaxed);
}
inline double atomicAdd(double* address, double value) {
  std::atomic_ref<double> target(*address);
  double seen = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(seen, seen + value, std::memory_order_relaxed)) {
  }
  return seen;
}
inline unsigned int atomicMax(unsigned int* address, unsigned int value) {
  std::atomic_ref<unsigned int> target(*address);
  unsigned int seen = target.load(std::memory_order_relaxed);
  while (seen < value && !target.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
  return seen;
}
