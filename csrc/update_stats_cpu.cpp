// update_stats_cpu.cpp: the CPU kernel of amp_inspect::update_stats (issue 22): what optimizer.step() did to each
// parameter, in one pass over before, after, grad (and exp_avg_sq) per tensor.
//
// Each tensor's elements fall into chunks of kChunkElems, split across threads with torch::stable::parallel_for
// (torch's pool). A chunk reads its elements in blocks of kStage: the four inputs widened to float32 bits into
// small stack buffers (exactly: bf16 on its bits, fp16 by numerics.h), then update_stats.h's tally_update_element
// judges each element there. Each chunk writes its totals to a slot of its own, merged per tensor in chunk order:
// the results do not depend on the number of threads, and no lock is taken.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "update_stats_call.h"

namespace amp_inspect {
namespace {

constexpr int64_t kChunkElems = int64_t{1} << 16;  // one unit of parallel work
constexpr int64_t kStage = 512;                    // elements widened at a time (4 x 2 KiB, in L1)

// Elements [start, start + n) of one input as float32 bits.
void load_bits(const void* data, int32_t dtype, int64_t start, int64_t n, uint32_t* out) {
  if (dtype == kFloat32) {
    std::memcpy(out, static_cast<const uint32_t*>(data) + start, sizeof(uint32_t) * n);
    return;
  }
  const uint16_t* p = static_cast<const uint16_t*>(data) + start;
  if (dtype == kBFloat16) {
    for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32_bits(p[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_f32_bits(p[i]);
  }
}

void tally_range(const UpdateView& view, int64_t start, int64_t n, UpdateTally& t) {
  uint32_t before[kStage], after[kStage], grad[kStage], state[kStage];
  const bool has_state = view.state != nullptr;
  const uint32_t weight_normal = min_normal_bits(view.weight_dtype), state_normal = min_normal_bits(view.state_dtype);
  for (int64_t done = 0; done < n; done += kStage) {
    const int64_t m = std::min(kStage, n - done);
    load_bits(view.before, view.weight_dtype, start + done, m, before);
    load_bits(view.after, view.weight_dtype, start + done, m, after);
    load_bits(view.grad, view.grad_dtype, start + done, m, grad);
    if (has_state) {
      load_bits(view.state, view.state_dtype, start + done, m, state);
    } else {
      std::memset(state, 0, sizeof(uint32_t) * m);
    }
    for (int64_t i = 0; i < m; ++i) {
      tally_update_element(t, before[i], after[i], grad[i], state[i], has_state, weight_normal, state_normal);
    }
  }
}

UpdateOutputs run_update_cpu(const UpdateCall& call) {
  UpdateOutputs out = allocate_update_outputs(call.num_tensors, Device(DeviceType::CPU));
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
      clear_tally(totals[c]);
      tally_range(view, start, std::min(kChunkElems, view.numel - start), totals[c]);
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
  const UpdateOutputs out = run_update_cpu(prepare_update_call(before, after, grads, exp_avg_sq));
  return {out.counts, out.sums, out.amax};
}

}  // namespace
}  // namespace amp_inspect

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CPU, m) {
  m.impl("update_stats", TORCH_BOX(&amp_inspect::update_stats_cpu));
}
