// update_tsan_driver.cpp: update_stats' CUDA kernel (update_stats_kernels.cuh) under ThreadSanitizer
// (`make test-emu-tsan`), torch-free.
//
// Runs the emulated kernel (every CUDA thread of a block a host thread, csrc/common/cuda_emu.h) on random bit patterns of
// every weight and state dtype, over several chunk sizes and grids and more tensors than one launch holds, and
// checks every run against a serial loop over update_stats.h's tally_update_element. A missing barrier in the
// block reduction shows up as a TSan data race report; a wrong index or merge as a mismatch. Exit status 0 only if
// every run matched (TSan's own reports exit 66).
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "common/cuda_emu.h"  // first: the kernels are compiled for the CPU through it
#include "update_stats/update_stats_kernels.cuh"

using namespace amp_inspect;

namespace {

struct Step {
  std::vector<uint32_t> before, after, grad, state;  // 32-bit words; 16-bit dtypes use the low halves' bytes
};

int element_bytes(int32_t dtype) { return dtype == kFloat32 ? 4 : 2; }

// n random elements of `dtype` (as raw bytes in a word vector), half of the "after" equal to "before".
Step random_step(std::mt19937& rng, int64_t n, int32_t weight, int32_t state) {
  Step s;
  const auto fill = [&](std::vector<uint32_t>& v, int32_t dtype) {
    v.resize(static_cast<size_t>((n * element_bytes(dtype) + 3) / 4 + 1));
    for (auto& w : v) w = rng();
  };
  fill(s.before, weight);
  fill(s.after, weight);
  fill(s.grad, kBFloat16);
  fill(s.state, state);
  for (size_t i = 0; i < s.after.size(); ++i) {
    if (rng() % 2) s.after[i] = s.before[i];
  }
  return s;
}

uint32_t bits_at(const void* data, int32_t dtype, int64_t i) {
  if (dtype == kFloat32) return static_cast<const uint32_t*>(data)[i];
  const uint16_t h = static_cast<const uint16_t*>(data)[i];
  return dtype == kBFloat16 ? bf16_to_f32_bits(h) : fp16_to_f32_bits(h);
}

bool run(std::mt19937& rng, int32_t weight, int32_t state, int num_tensors, int64_t chunk, int64_t blocks) {
  std::vector<Step> steps;
  std::vector<UpdateKernelView> views;
  for (int t = 0; t < num_tensors; ++t) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 700);
    steps.push_back(random_step(rng, n, weight, state));
  }
  for (int t = 0; t < num_tensors; ++t) {
    UpdateKernelView v{};
    v.before = steps[t].before.data();
    v.after = steps[t].after.data();
    v.grad = steps[t].grad.data();
    v.state = t % 3 == 2 ? nullptr : steps[t].state.data();  // some tensors without state
    v.numel = static_cast<int64_t>((steps[t].before.size() - 1) * 4 / element_bytes(weight));
    v.out_row = t;
    v.weight_dtype = weight;
    v.grad_dtype = kBFloat16;
    v.state_dtype = state;
    views.push_back(v);
  }
  std::vector<int64_t> counts(static_cast<size_t>(num_tensors) * kUpdateCountColumns);
  std::vector<double> sums(static_cast<size_t>(num_tensors) * kUpdateSumColumns);
  std::vector<float> amax(static_cast<size_t>(num_tensors));
  UpdateLaunchPlan plan;
  plan.views = views.data();
  plan.num_views = num_tensors;
  plan.num_tensors = num_tensors;
  plan.chunk_elems = chunk;
  plan.counts = counts.data();
  plan.sums = sums.data();
  plan.amax = amax.data();
  cuda_emu::Backend backend;
  backend.blocks_override = blocks;
  update_kernels::run_update_stats(plan, backend);
  for (int t = 0; t < num_tensors; ++t) {
    const UpdateKernelView& v = views[t];
    UpdateTally want;
    clear_tally(want);
    for (int64_t i = 0; i < v.numel; ++i) {
      const uint32_t s = v.state != nullptr ? bits_at(v.state, state, i) : 0u;
      tally_update_element(want, bits_at(v.before, weight, i), bits_at(v.after, weight, i), bits_at(v.grad, kBFloat16, i),
                           s, v.state != nullptr, min_normal_bits(weight), min_normal_bits(state));
    }
    want.counts[kUpdNumel] = v.numel;
    for (int k = 0; k < kUpdateCountColumns; ++k) {
      if (counts[t * kUpdateCountColumns + k] != want.counts[k]) {
        std::printf("tensor %d count %d: %lld, want %lld\n", t, k, static_cast<long long>(counts[t * kUpdateCountColumns + k]),
                    static_cast<long long>(want.counts[k]));
        return false;
      }
    }
    for (int k = 0; k < kUpdateSumColumns; ++k) {
      const double got = sums[t * kUpdateSumColumns + k];
      if (std::fabs(got - want.sums[k]) > 2.0 * v.numel * 0x1p-53 * std::fabs(want.sums[k])) {
        std::printf("tensor %d sum %d: %.17g, want %.17g\n", t, k, got, want.sums[k]);
        return false;
      }
    }
    if (float32_as_bits(amax[t]) != want.amax_bits) {
      std::printf("tensor %d amax differs\n", t);
      return false;
    }
  }
  return true;
}

}  // namespace

int main() {
  std::mt19937 rng(20240611);
  int runs = 0;
  for (int32_t weight : {kFloat32, kBFloat16, kFloat16}) {
    for (int32_t state : {kFloat32, kFloat16}) {
      for (const auto& [chunk, blocks] : {std::pair<int64_t, int64_t>{64, 3}, {300, 2}, {1 << 16, 0}}) {
        const int tensors = chunk == 64 ? kUpdateViewsPerLaunch + 3 : 5;  // the first also takes two launches
        if (!run(rng, weight, state, tensors, chunk, blocks)) return 1;
        ++runs;
      }
    }
  }
  std::printf("update_stats emulated kernel: %d runs matched the serial tally\n", runs);
  return 0;
}
