// update_stats_cpu.cpp: the CPU kernel of amp_inspect::update_stats (issue 22): what optimizer.step() did to each
// parameter, in one pass over before, after, grad (and exp_avg_sq) per tensor.
//
// Each tensor's elements fall into chunks of kChunkElems, split across threads with torch::stable::parallel_for
// (torch's pool). A chunk reads its elements in blocks of kStage: float32 inputs in place, 16-bit ones widened to
// float32 bits into small stack buffers (exactly: bf16 on its bits, fp16 by numerics.h), then update_stats.h's
// judge_update_element judges each element of the block in a vectorised loop (AVX-512 / AVX2 clones): int32 counts,
// the amax as |bits|, and the two float64 terms staged per block and added into kSumLanes running sums.
//
// The order of the float64 sums, fixed so that they do not depend on the number of threads or on the clone that
// runs: element i of a chunk (counted from the chunk's start) is added to lane i mod kSumLanes, in element order; a
// chunk's total is its lanes added from lane 0 to lane 7; a tensor's total is its chunks' totals added in chunk
// order. Each chunk writes its totals to a slot of its own, merged per tensor after the parallel loop: no lock is
// taken. The counts and the amax are exact, the same as tally_update_element's (the CUDA kernel's). The float64 terms
// widen float32 values by the hardware, as tally_update_element does: a thread running with denormals-are-zero set
// (torch.set_flush_denormal(True) sets it) would take a float32 subnormal weight (its square is below 2^-252) as 0
// in both.
//
// no-trapping-math, for the whole file (before any header, so that every inline function it calls has the same
// options and inlines): without it GCC keeps a select between float results as a branch (a float operation might
// trap) and does not vectorise the element loop. It changes no value: IEEE results, their rounding and their order
// stay as written (it is not fast-math).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-trapping-math")
#endif
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/cpu_clones.h"
#include "update_stats/update_stats_call.h"

namespace amp_inspect {
namespace {

constexpr int64_t kChunkElems = int64_t{1} << 16;  // one unit of parallel work
constexpr int64_t kStage = 512;                    // elements judged at a time (their staged terms stay in L1)
constexpr int kSumLanes = 8;                       // float64 running sums per term (an AVX-512 register's width)
static_assert(kChunkElems % kStage == 0 && kStage % kSumLanes == 0, "a block's lanes continue the chunk's");
static_assert(kChunkElems < (int64_t{1} << 31), "a chunk's counts are kept in int32");

// The totals of one chunk while it is read: exact int32 counts (a chunk holds fewer than 2^31 elements), the float64
// sums in lanes, the amax as |bits|.
struct ChunkTally {
  int32_t counts[kUpdateCountColumns];  // kUpdNumel unused: filled from the tensor's size
  double sq_change[kSumLanes], sq_weight[kSumLanes];
  uint32_t amax_bits;
};

// terms[0, n) added into lanes, element i into lane i mod kSumLanes (n a multiple of kSumLanes), lane by lane, in
// one of two forms that give the same sums (the same adds, per lane, in the same order): kWide, one 8-double GCC
// vector, a single AVX-512 register; else four 2-double vectors, SSE2's width, which every clone keeps in registers
// (the 8-double vector went through the stack on AVX2, 2-3x slower than SSE2; the pairs cost AVX-512 7-12%).
using DoubleLanes = double __attribute__((vector_size(kSumLanes * sizeof(double))));
using DoublePair = double __attribute__((vector_size(2 * sizeof(double))));
constexpr int kPairs = kSumLanes / 2;
template <bool kWide>
__attribute__((always_inline)) inline void add_in_lanes(double* __restrict lanes, const double* __restrict terms,
                                                        int64_t n) {
  if constexpr (kWide) {
    DoubleLanes acc;
    std::memcpy(&acc, lanes, sizeof acc);
    for (int64_t i = 0; i < n; i += kSumLanes) {
      DoubleLanes x;
      std::memcpy(&x, terms + i, sizeof x);
      acc += x;
    }
    std::memcpy(lanes, &acc, sizeof acc);
  } else {
    DoublePair acc[kPairs];
    std::memcpy(acc, lanes, sizeof acc);
    for (int64_t i = 0; i < n; i += kSumLanes) {
      DoublePair x[kPairs];
      std::memcpy(x, terms + i, sizeof x);
      for (int p = 0; p < kPairs; ++p) acc[p] += x[p];
    }
    std::memcpy(lanes, acc, sizeof acc);
  }
}

// One block of at most kStage elements (a multiple of kSumLanes unless it ends the chunk), judged element by element
// by judge_update_element: branch-free, so the cloned loop vectorises.
template <bool kHasState, bool kWide>
__attribute__((always_inline)) inline void tally_block(const uint32_t* __restrict before,
                                                       const uint32_t* __restrict after,
                                                       const uint32_t* __restrict grad,
                                                       const uint32_t* __restrict state, int64_t n,
                                                       uint32_t weight_normal, uint32_t state_normal,
                                                       ChunkTally& t) {
  int32_t with_grad = 0, lost = 0, changed = 0, nonfinite = 0, subnormal = 0, underflow = 0, made_nonfinite = 0;
  uint32_t amax = t.amax_bits;
  alignas(64) double sq_change[kStage];
  alignas(64) double sq_weight[kStage];
  for (int64_t i = 0; i < n; ++i) {
    const UpdateElement e = judge_update_element(before[i], after[i], grad[i], kHasState ? state[i] : 0u, kHasState,
                                                 weight_normal, state_normal);
    with_grad += e.with_grad;
    lost += e.lost;
    changed += e.changed;
    nonfinite += e.weight_nonfinite;
    subnormal += e.weight_subnormal;
    underflow += e.state_underflow;
    made_nonfinite += e.made_nonfinite;
    sq_change[i] = e.sq_change;
    sq_weight[i] = e.sq_weight;
    amax = std::max(amax, e.magnitude);
  }
  const int64_t padded = (n + kSumLanes - 1) / kSumLanes * kSumLanes;
  for (int64_t i = n; i < padded; ++i) sq_change[i] = sq_weight[i] = 0.0;  // x + 0.0 == x for the sums' x >= 0
  add_in_lanes<kWide>(t.sq_change, sq_change, padded);
  add_in_lanes<kWide>(t.sq_weight, sq_weight, padded);
  t.counts[kUpdWithGrad] += with_grad;
  t.counts[kUpdLost] += lost;
  t.counts[kUpdChanged] += changed;
  t.counts[kUpdWeightNonfinite] += nonfinite;
  t.counts[kUpdWeightSubnormal] += subnormal;
  t.counts[kUpdStateUnderflow] += underflow;
  t.counts[kUpdMadeNonfinite] += made_nonfinite;
  t.amax_bits = amax;
}

// The four cloned forms: with or without exp_avg_sq, wide or paired lanes.
AMPI_CPU_CLONES void tally_block_with_state(const uint32_t* before, const uint32_t* after, const uint32_t* grad,
                                               const uint32_t* state, int64_t n, uint32_t weight_normal,
                                               uint32_t state_normal, ChunkTally& t) {
  tally_block<true, false>(before, after, grad, state, n, weight_normal, state_normal, t);
}
AMPI_CPU_CLONES void tally_block_with_state_wide(const uint32_t* before, const uint32_t* after, const uint32_t* grad,
                                                    const uint32_t* state, int64_t n, uint32_t weight_normal,
                                                    uint32_t state_normal, ChunkTally& t) {
  tally_block<true, true>(before, after, grad, state, n, weight_normal, state_normal, t);
}
AMPI_CPU_CLONES void tally_block_without_state(const uint32_t* before, const uint32_t* after, const uint32_t* grad,
                                                  int64_t n, uint32_t weight_normal, ChunkTally& t) {
  tally_block<false, false>(before, after, grad, nullptr, n, weight_normal, 0u, t);
}
AMPI_CPU_CLONES void tally_block_without_state_wide(const uint32_t* before, const uint32_t* after,
                                                       const uint32_t* grad, int64_t n, uint32_t weight_normal,
                                                       ChunkTally& t) {
  tally_block<false, true>(before, after, grad, nullptr, n, weight_normal, 0u, t);
}

// The chunk's totals as the op's columns: the lanes added from lane 0 to lane kSumLanes - 1.
UpdateTally chunk_totals(const ChunkTally& c) {
  UpdateTally t;
  clear_tally(t);
  for (int k = 0; k < kUpdateCountColumns; ++k) t.counts[k] = c.counts[k];
  for (int l = 0; l < kSumLanes; ++l) {
    t.sums[kUpdSqChange] += c.sq_change[l];
    t.sums[kUpdSqWeight] += c.sq_weight[l];
  }
  t.amax_bits = c.amax_bits;
  return t;
}

// Elements [start, start + n) of a view, n <= kChunkElems.
UpdateTally tally_chunk(const UpdateView& view, int64_t start, int64_t n) {
  uint32_t before_stage[kStage], after_stage[kStage], grad_stage[kStage], state_stage[kStage];
  const uint32_t weight_normal = min_normal_bits(view.weight_dtype), state_normal = min_normal_bits(view.state_dtype);
  const bool wide = wide_lanes();
  ChunkTally t;
  std::memset(&t, 0, sizeof t);
  for (int64_t done = 0; done < n; done += kStage) {
    const int64_t m = std::min(kStage, n - done), at = start + done;
    const uint32_t* before = f32_bits_in_place(view.before, view.weight_dtype, at, m, before_stage);
    const uint32_t* after = f32_bits_in_place(view.after, view.weight_dtype, at, m, after_stage);
    const uint32_t* grad = f32_bits_in_place(view.grad, view.grad_dtype, at, m, grad_stage);
    if (view.state != nullptr) {
      const uint32_t* state = f32_bits_in_place(view.state, view.state_dtype, at, m, state_stage);
      (wide ? tally_block_with_state_wide : tally_block_with_state)(before, after, grad, state, m, weight_normal,
                                                                    state_normal, t);
    } else {
      (wide ? tally_block_without_state_wide : tally_block_without_state)(before, after, grad, m, weight_normal, t);
    }
  }
  return chunk_totals(t);
}

TallyOutputs run_update_cpu(const UpdateCall& call) {
  TallyOutputs out = allocate_update_outputs(call.num_tensors, Device(DeviceType::CPU));
  const int64_t num_views = static_cast<int64_t>(call.views.size());
  std::vector<int64_t> first_chunk(num_views + 1, 0);  // the views' chunks in one flat list
  for (int64_t v = 0; v < num_views; ++v) {
    first_chunk[v + 1] = first_chunk[v] + (call.views[v].numel + kChunkElems - 1) / kChunkElems;
  }
  const int64_t total_chunks = first_chunk[num_views];
  std::vector<int64_t> view_of(total_chunks);
  for (int64_t v = 0; v < num_views; ++v) {
    std::fill(view_of.begin() + first_chunk[v], view_of.begin() + first_chunk[v + 1], v);
  }
  std::vector<UpdateTally> totals(total_chunks);
  torch::stable::parallel_for(0, total_chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const UpdateView& view = call.views[view_of[c]];
      const int64_t start = (c - first_chunk[view_of[c]]) * kChunkElems;
      totals[c] = tally_chunk(view, start, std::min(kChunkElems, view.numel - start));
    }
  });
  int64_t* counts = static_cast<int64_t*>(out.counts.data_ptr());
  double* sums = static_cast<double*>(out.sums.data_ptr());
  float* amax = static_cast<float*>(out.amax.data_ptr());
  for (int64_t v = 0; v < num_views; ++v) {
    UpdateTally t;
    clear_tally(t);
    for (int64_t c = first_chunk[v]; c < first_chunk[v + 1]; ++c) merge_tally(t, totals[c]);
    const int64_t row = call.views[v].out_row;
    t.counts[kUpdNumel] = call.views[v].numel;
    std::copy(t.counts, t.counts + kUpdateCountColumns, counts + row * kUpdateCountColumns);
    std::copy(t.sums, t.sums + kUpdateSumColumns, sums + row * kUpdateSumColumns);
    amax[row] = bits_as_float32(t.amax_bits);
  }
  return out;
}

// The boxed kernel (TORCH_BOX) takes its arguments by value.
std::tuple<Tensor, Tensor, Tensor> update_stats_cpu(std::vector<Tensor> before, std::vector<Tensor> after,
                                                    std::vector<Tensor> grads, std::vector<Tensor> exp_avg_sq) {
  const TallyOutputs out = run_update_cpu(prepare_update_call(before, after, grads, exp_avg_sq));
  return out.returned();
}

}  // namespace
}  // namespace amp_inspect

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CPU, m) {
  m.impl("update_stats", TORCH_BOX(&amp_inspect::update_stats_cpu));
}
