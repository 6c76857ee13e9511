// tensor_stats_cpu.cpp: the CPU kernel of amp_inspect::tensor_stats.
//
// One pass over all tensors: the flat list of work chunks (kCpuChunkElems elements each, never crossing a
// tensor) is split across threads with at::parallel_for. Each chunk is read in blocks of kBlockElems
// elements that are turned into float32 bits of v in a small stack buffer (L1-resident) and then counted
// by short branch-free loops the compiler vectorises. A thread keeps the running statistics of the tensor
// it is on and merges them into the outputs, under a lock, only when it moves to another tensor, so the
// lock is taken about T + threads times per call. No temporary grows with the number of elements.
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "tensor_stats.h"

namespace amp_inspect {
namespace {

constexpr int64_t kCpuChunkElems = int64_t{1} << 16;  // one unit of parallel work
constexpr int64_t kBlockElems = 2048;                 // staged in L1: 8 KiB of float32 bits
constexpr int kHistCopies = 8;  // interleaved histograms: runs of equal bins don't chain on one counter
constexpr int kLanes = 8;       // float64 lanes of the sum of squares
constexpr int kChains = 4;      // independent sum-of-squares accumulators

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}
inline double bits_to_double(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, sizeof d);
  return d;
}

// Running statistics of one tensor on one thread.
struct TensorAccumulator {
  RawCounts counts;
  uint32_t max_abs;          // float32 bits of max |v| over finite v
  uint32_t min_abs_nonzero;  // float32 bits of min |v| over finite nonzero v
  double sumsq;
  int64_t hist[kHistBins];

  void clear() {
    clear_counts(counts);
    max_abs = 0;
    min_abs_nonzero = kInfBits32;
    sumsq = 0.0;
    std::fill(hist, hist + kHistBins, int64_t{0});
  }
};

// Walks the logical elements [start, start + count) of a view: contiguous, or strided with an odometer
// over the collapsed dims (one division per block, none per element).
template <typename T>
struct ElementReader {
  const T* base;
  const TensorView& view;

  template <typename Fn>
  void for_each(int64_t start, int64_t count, Fn&& fn) const {
    if (is_contiguous_view(view)) {
      const T* p = base + start;
      for (int64_t i = 0; i < count; ++i) fn(i, p[i]);
      return;
    }
    const int nd = view.ndim;
    int64_t index[kMaxDims];
    int64_t linear = start;
    for (int d = nd - 1; d >= 0; --d) {
      index[d] = linear % view.sizes[d];
      linear /= view.sizes[d];
    }
    int64_t offset = element_offset(view, start);
    for (int64_t i = 0; i < count; ++i) {
      fn(i, base[offset]);
      for (int d = nd - 1; d >= 0; --d) {  // advance the odometer
        offset += view.strides[d];
        if (++index[d] < view.sizes[d]) break;
        offset -= view.strides[d] * view.sizes[d];
        index[d] = 0;
      }
    }
  }
};

// Block totals of count_block32, merged into a TensorAccumulator by the caller.
struct BlockCounts {
  int64_t nan, posinf, neginf, zero;
  int64_t over[kMaxFormats], below[kMaxFormats], at_zero[kMaxFormats];
  int32_t max_abs, min_abs_nonzero;
  double sumsq;
};

// Counts a block (at most kBlockElems) of float32 bits of v: the path of float32, float16, bfloat16 and
// scaled inputs. Each statistic gets its own short loop over the L1-resident block, simple enough for the
// compiler to vectorise; the function is cloned for AVX-512, AVX2 and baseline x86-64 and the best clone
// is picked when the library loads. Abs bits fit in int32, so signed compares are exact.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
void count_block32(const uint32_t* __restrict bits, int64_t n, const FormatBounds* bounds, int num_formats,
                   BlockCounts& out, uint32_t (&hist)[kHistCopies][kHistBins]) {
  constexpr int32_t kInf = static_cast<int32_t>(kInfBits32);
  constexpr int32_t kNegInf = static_cast<int32_t>(kNegInfBits32);
  constexpr int32_t kAbs = static_cast<int32_t>(kAbsMask32);
  const int32_t* __restrict sbits = reinterpret_cast<const int32_t*>(bits);

  int32_t nan = 0, posinf = 0, neginf = 0, zero = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t b = sbits[i];
    const int32_t a = b & kAbs;
    nan += a > kInf;
    posinf += b == kInf;
    neginf += b == kNegInf;
    zero += a == 0;
  }
  // Extremes over finite values. The minimum is taken over |bits| - 1 as unsigned, which sends zero (and
  // the non-finite values, mapped to zero first) to the top: one select instead of two, which vectorises.
  int32_t max_abs = 0;
  uint32_t min_abs_minus_one = kInfBits32;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t a = sbits[i] & kAbs;
    const int32_t finite = a < kInf ? a : 0;
    max_abs = std::max(max_abs, finite);
    min_abs_minus_one = std::min(min_abs_minus_one, std::min(static_cast<uint32_t>(finite - 1), kInfBits32));
  }
  const int32_t min_abs = min_abs_minus_one == kInfBits32 ? kInf : static_cast<int32_t>(min_abs_minus_one + 1);
  out.nan = nan;
  out.posinf = posinf;
  out.neginf = neginf;
  out.zero = zero;
  out.max_abs = max_abs;
  out.min_abs_nonzero = min_abs;

  for (int f = 0; f < num_formats; ++f) {
    const int32_t overflow_from = static_cast<int32_t>(bounds[f].overflow_from);
    const int32_t normal_from = static_cast<int32_t>(bounds[f].normal_from);
    const int32_t zero_upto = static_cast<int32_t>(bounds[f].zero_upto);
    int32_t over = 0, below = 0, at_zero = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t a = sbits[i] & kAbs;
      over += a >= overflow_from;
      below += a < normal_from;
      at_zero += a <= zero_upto;
    }
    out.over[f] = over;
    out.below[f] = below;
    out.at_zero[f] = at_zero;
  }

  // Sum of squares in float64. Written with GCC vector types: a plain loop's float reduction is never
  // reordered (fast-math is not an option), so the lanes are made explicit.
  using Int8 = int32_t __attribute__((vector_size(32)));
  using Float8 = float __attribute__((vector_size(32)));
  using Double8 = double __attribute__((vector_size(64)));
  // kChains independent accumulators, so the loop is not bound by the latency of one chain of adds.
  Double8 partial[kChains] = {};
  const int64_t full = n - n % (kLanes * kChains);
  for (int64_t i = 0; i < full; i += kLanes * kChains) {
    for (int c = 0; c < kChains; ++c) {
      Int8 b;
      std::memcpy(&b, sbits + i + c * kLanes, sizeof b);
      const Int8 a = b & kAbs;
      const Int8 finite = a & (a < kInf);  // the comparison yields all-ones lanes where true
      Float8 f;
      std::memcpy(&f, &finite, sizeof f);
      const Double8 v = __builtin_convertvector(f, Double8);
      partial[c] += v * v;
    }
  }
  double sumsq = 0.0;
  for (int c = 0; c < kChains; ++c) {
    for (int l = 0; l < kLanes; ++l) sumsq += partial[c][l];
  }
  for (int64_t i = full; i < n; ++i) {
    const int32_t a = sbits[i] & kAbs;
    const double v = static_cast<double>(bits_to_float(static_cast<uint32_t>(a < kInf ? a : 0)));
    sumsq += v * v;
  }
  out.sumsq = sumsq;

  // Exponent histogram: bins extracted by a vector loop, then counted into kHistCopies interleaved
  // histograms so that runs of one bin do not serialise on a single counter.
  alignas(64) uint8_t bins[kBlockElems];
  for (int64_t i = 0; i < n; ++i) bins[i] = static_cast<uint8_t>(hist_bin(bits[i]));
  const int64_t whole = n - n % kHistCopies;
  for (int64_t i = 0; i < whole; i += kHistCopies) {
    for (int k = 0; k < kHistCopies; ++k) hist[k][bins[i + k]] += 1;
  }
  for (int64_t i = whole; i < n; ++i) hist[0][bins[i]] += 1;
}

void add_block(TensorAccumulator& acc, const BlockCounts& block, int64_t n, int num_formats) {
  RawCounts& c = acc.counts;
  c.numel += n;
  c.nan += block.nan;
  c.posinf += block.posinf;
  c.neginf += block.neginf;
  c.zero += block.zero;
  for (int f = 0; f < num_formats; ++f) {
    c.at_or_above_overflow[f] += block.over[f];
    c.below_normal[f] += block.below[f];
    c.at_or_below_zero[f] += block.at_zero[f];
  }
  acc.max_abs = std::max(acc.max_abs, static_cast<uint32_t>(block.max_abs));
  acc.min_abs_nonzero = std::min(acc.min_abs_nonzero, static_cast<uint32_t>(block.min_abs_nonzero));
  acc.sumsq += block.sumsq;
}

// float64 without a scale: classified on the exact value, element by element (a rare input dtype).
void count_chunk64(const TensorView& view, int64_t start, int64_t count, const StatsCall& call,
                   TensorAccumulator& acc) {
  uint64_t max_abs = 0, min_abs = kInfBits64;
  double sumsq = 0.0;
  ElementReader<uint64_t>{static_cast<const uint64_t*>(view.data), view}.for_each(
      start, count, [&](int64_t, uint64_t b) {
        count_element64(acc.counts, b, call.bounds, call.num_formats);
        const uint64_t a = b & kAbsMask64;
        if (is_finite64(a)) {
          max_abs = std::max(max_abs, a);
          if (a != 0) min_abs = std::min(min_abs, a);
          const double v = bits_to_double(a);
          sumsq += v * v;
        }
        // The histogram is over float32(v): a double beyond float32's range lands in bin 255.
        acc.hist[hist_bin(float_to_bits(static_cast<float>(bits_to_double(b))))] += 1;
      });
  // Rounding to float32 is monotonic, so the rounded extreme is the extreme of the rounded values.
  acc.max_abs = std::max(acc.max_abs, float_to_bits(static_cast<float>(bits_to_double(max_abs))));
  if (min_abs != kInfBits64) {
    acc.min_abs_nonzero =
        std::min(acc.min_abs_nonzero, float_to_bits(static_cast<float>(bits_to_double(min_abs))));
  }
  acc.sumsq += sumsq;
}

// Turns elements [start, start + count) of a view into float32 bits of v, block by block, and counts them.
template <typename T, typename ToBits>
void count_chunk32(const TensorView& view, int64_t start, int64_t count, const StatsCall& call,
                   TensorAccumulator& acc, ToBits&& to_bits) {
  alignas(64) uint32_t buffer[kBlockElems];
  uint32_t hist[kHistCopies][kHistBins] = {};
  const ElementReader<T> reader{static_cast<const T*>(view.data), view};
  const float scale = call.has_scale ? (call.scale_ptr ? *call.scale_ptr : call.scale_value) : 1.0f;
  for (int64_t done = 0; done < count; done += kBlockElems) {
    const int64_t n = std::min(kBlockElems, count - done);
    const uint32_t* bits = buffer;
    if constexpr (std::is_same<T, uint32_t>::value) {
      if (!call.has_scale && is_contiguous_view(view)) {
        bits = reinterpret_cast<const uint32_t*>(reader.base + start + done);  // float32 as stored: no copy
        BlockCounts block;
        count_block32(bits, n, call.bounds, call.num_formats, block, hist);
        add_block(acc, block, n, call.num_formats);
        continue;
      }
    }
    if (call.has_scale) {
      reader.for_each(start + done, n, [&](int64_t i, T x) {
        buffer[i] = float_to_bits(bits_to_float(to_bits(x)) * scale);  // one float32 multiply
      });
    } else {
      reader.for_each(start + done, n, [&](int64_t i, T x) { buffer[i] = to_bits(x); });
    }
    BlockCounts block;
    count_block32(bits, n, call.bounds, call.num_formats, block, hist);
    add_block(acc, block, n, call.num_formats);
  }
  for (int b = 0; b < kHistBins; ++b) {
    int64_t total = 0;
    for (int k = 0; k < kHistCopies; ++k) total += hist[k][b];
    acc.hist[b] += total;
  }
}

void count_chunk(const TensorView& view, int64_t start, int64_t count, const StatsCall& call,
                 TensorAccumulator& acc) {
  switch (view.dtype) {
    case kFloat32:
      count_chunk32<uint32_t>(view, start, count, call, acc, [](uint32_t x) { return x; });
      break;
    case kFloat16:
      count_chunk32<uint16_t>(view, start, count, call, acc, [](uint16_t x) { return fp16_to_f32_bits(x); });
      break;
    case kBFloat16:
      count_chunk32<uint16_t>(view, start, count, call, acc, [](uint16_t x) { return bf16_to_f32_bits(x); });
      break;
    case kFloat64:
      if (call.has_scale) {  // v = float32(x) * scale: the float32 path after one rounding
        count_chunk32<uint64_t>(view, start, count, call, acc, [](uint64_t x) {
          return float_to_bits(static_cast<float>(bits_to_double(x)));
        });
      } else {
        count_chunk64(view, start, count, call, acc);
      }
      break;
  }
}

// Output pointers, merged into under one lock.
struct OutputSink {
  std::mutex lock;
  std::vector<RawCounts> counts;  // one per tensor, finalized at the end
  std::vector<uint32_t> max_abs, min_abs_nonzero;
  int64_t* hist;
  double* sumsq;

  void merge(int64_t row, const TensorAccumulator& acc) {
    std::lock_guard<std::mutex> guard(lock);
    RawCounts& c = counts[row];
    c.numel += acc.counts.numel;
    c.nan += acc.counts.nan;
    c.posinf += acc.counts.posinf;
    c.neginf += acc.counts.neginf;
    c.zero += acc.counts.zero;
    for (int f = 0; f < kMaxFormats; ++f) {
      c.at_or_above_overflow[f] += acc.counts.at_or_above_overflow[f];
      c.below_normal[f] += acc.counts.below_normal[f];
      c.at_or_below_zero[f] += acc.counts.at_or_below_zero[f];
    }
    max_abs[row] = std::max(max_abs[row], acc.max_abs);
    min_abs_nonzero[row] = std::min(min_abs_nonzero[row], acc.min_abs_nonzero);
    sumsq[row] += acc.sumsq;
    int64_t* h = hist + row * kHistBins;
    for (int b = 0; b < kHistBins; ++b) h[b] += acc.hist[b];
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> tensor_stats_cpu(
    const std::vector<at::Tensor>& tensors, const std::optional<at::Tensor>& scale,
    std::optional<double> scale_value, const std::vector<std::string>& formats) {
  const StatsCall call = prepare_call(tensors, scale, scale_value, formats, kCpuChunkElems);
  StatsOutputs out = allocate_outputs(call.num_tensors, call.num_formats, at::Device(at::kCPU));

  OutputSink sink;
  RawCounts empty;
  clear_counts(empty);
  sink.counts.assign(call.num_tensors, empty);
  sink.max_abs.assign(call.num_tensors, 0u);
  sink.min_abs_nonzero.assign(call.num_tensors, kInfBits32);
  sink.hist = out.hist.data_ptr<int64_t>();
  sink.sumsq = out.sumsq.data_ptr<double>();

  const int64_t num_views = static_cast<int64_t>(call.views.size());
  at::parallel_for(0, call.total_chunks, 1, [&](int64_t begin, int64_t end) {
    TensorAccumulator acc;
    int64_t current = -1;
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t v = tensor_of_chunk(call.views.data(), num_views, chunk);
      if (v != current) {
        if (current >= 0) sink.merge(call.views[current].out_row, acc);
        acc.clear();
        current = v;
      }
      const TensorView& view = call.views[v];
      const int64_t start = (chunk - view.first_chunk) * call.chunk_elems;
      count_chunk(view, start, std::min(call.chunk_elems, view.numel - start), call, acc);
    }
    if (current >= 0) sink.merge(call.views[current].out_row, acc);
  });

  int64_t* counts = out.counts.data_ptr<int64_t>();
  float* amax = out.amax.data_ptr<float>();
  float* amin = out.amin_nonzero.data_ptr<float>();
  const int columns = count_columns(call.num_formats);
  for (int64_t row = 0; row < call.num_tensors; ++row) {
    finalize_counts(sink.counts[row], call.num_formats, counts + row * columns);
    amax[row] = bits_to_float(sink.max_abs[row]);
    amin[row] = bits_to_float(sink.min_abs_nonzero[row]);
  }
  return {out.counts, out.hist, out.amax, out.amin_nonzero, out.sumsq};
}

}  // namespace
}  // namespace amp_inspect

TORCH_LIBRARY_IMPL(amp_inspect, CPU, m) { m.impl("tensor_stats", &amp_inspect::tensor_stats_cpu); }
