// readiness_tsan_driver.cpp: format readiness's CUDA kernels (readiness_kernels.cuh) under ThreadSanitizer
// (`make test-emu-tsan`), torch-free.
//
// Runs the emulated kernels (every CUDA thread of a block a host thread, csrc/common/cuda_emu.h) on small tensors of
// every input dtype and many row lengths (packed short rows, short last blocks, long rows of several warp
// tasks), with and without a given tensor amax, over several work chunks and grids, and checks every run
// against a serial loop over readiness.h's own functions (block by block, element by element). A missing
// barrier shows up as a TSan data race report; a wrong index, butterfly or merge as a mismatch. Exit status 0
// only if every run matched (TSan's own reports exit 66).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_emu.h"  // first: the kernels are compiled for the CPU through it
#include "readiness/readiness_kernels.cuh"

using namespace amp_inspect;

namespace {

struct Tensor {
  std::vector<uint8_t> storage;
  ReadinessKernelView view;
};

uint32_t element_bits(const ReadinessKernelView& v, int64_t i) {
  if (v.dtype == kFloat32) return static_cast<const uint32_t*>(v.data)[i];
  const uint16_t h = static_cast<const uint16_t*>(v.data)[i];
  return v.dtype == kFloat16 ? fp16_to_f32_bits(h) : bf16_to_f32_bits(h);
}

// The op's outputs for one tensor, the serial way: counts [3 + 4R], sums [1 + R], amax bits.
void serial(const ReadinessKernelView& v, const float* given_amax, std::vector<int64_t>& counts,
            std::vector<double>& sums, uint32_t& amax_out) {
  const int64_t n = v.rows * v.row_length;
  std::vector<uint32_t> bits(static_cast<size_t>(n));
  uint32_t amax = 0;
  counts.assign(readiness_count_columns(kNumRecipes), 0);
  sums.assign(readiness_sum_columns(kNumRecipes), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t b = element_bits(v, i);
    const uint32_t a = b & kAbsMask32;
    const bool finite = is_finite32(a);
    counts[0] += 1;
    counts[1] += finite && a != 0;
    counts[2] += !finite;
    bits[static_cast<size_t>(i)] = finite ? b : 0u;
    if (finite) {
      amax = std::max(amax, a);
      const double x = float32_bits_to_double(b);
      sums[0] += x * x;
    }
  }
  uint32_t tensor_amax = amax;
  if (given_amax != nullptr) std::memcpy(&tensor_amax, given_amax, 4);
  amax_out = tensor_amax;
  tensor_amax &= kAbsMask32;
  const uint32_t decode = nvfp4_decode_scale_bits(tensor_amax);
  for (int r = 0; r < kNumRecipes; ++r) {
    const RecipeSpec& spec = kRecipes[r];
    const ElementGrid& grid = kElementGrids[spec.element];
    int64_t* c = counts.data() + kReadinessFixedCounts + kReadinessCountsPerRecipe * r;
    const int64_t block = spec.block == 0 ? n : spec.block;
    const int64_t rows = spec.block == 0 ? 1 : v.rows;
    const int64_t length = spec.block == 0 ? n : v.row_length;
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t start = 0; start < length; start += block) {
        const int64_t end = std::min(length, start + block);
        uint32_t block_amax = 0;
        for (int64_t k = start; k < end; ++k) block_amax = std::max(block_amax, bits[row * length + k] & kAbsMask32);
        const BlockScale s = block_scale(spec.scale, grid, spec.block == 0 ? tensor_amax : block_amax, decode);
        c[2] += 1;
        c[3] += s.scale_flushed;
        for (int64_t k = start; k < end; ++k) {
          const ElementVerdict e = judge_element(bits[row * length + k], grid, s);
          c[0] += e.flushed;
          c[1] += e.saturated;
          sums[1 + r] += e.sq_error;
        }
      }
    }
  }
}

Tensor make_tensor(std::mt19937_64& rng, int64_t rows, int64_t length, int32_t dtype, int64_t offset) {
  Tensor t;
  const int word = dtype == kFloat32 ? 4 : 2;
  const int64_t n = rows * length;
  t.storage.assign(static_cast<size_t>((n + offset) * word + 16), 0);
  std::uniform_int_distribution<uint32_t> bits;
  std::normal_distribution<float> normal;
  uint8_t* base = t.storage.data() + offset * word;
  for (int64_t i = 0; i < n; ++i) {
    // Mostly values a model holds (a scale per row), some random bit patterns (NaN, Inf, subnormals).
    float f = normal(rng) * std::ldexp(1.0f, static_cast<int>(i / length % 9) * 4 - 16);
    uint32_t b;
    std::memcpy(&b, &f, 4);
    if (i % 7 == 3) b = bits(rng);
    if (dtype == kFloat32) {
      std::memcpy(base + i * 4, &b, 4);
    } else {
      std::memcpy(&f, &b, 4);
      const uint16_t h = dtype == kFloat16 ? cuda_emu::float_to_half_bits(f) : cuda_emu::float_to_bfloat16_bits(f);
      std::memcpy(base + i * 2, &h, 2);
    }
  }
  t.view = ReadinessKernelView{};
  t.view.data = base;
  t.view.dtype = dtype;
  set_readiness_geometry(t.view, n, length);
  return t;
}

int run(std::vector<Tensor>& tensors, bool given, int64_t chunk_tasks, int64_t blocks) {
  const int64_t rows = static_cast<int64_t>(tensors.size());
  std::vector<ReadinessKernelView> views;
  for (int32_t dtype : {kFloat32, kFloat16, kBFloat16}) {  // grouped by dtype, as plan_readiness_kernels does
    for (int64_t i = 0; i < rows; ++i) {
      if (tensors[i].view.dtype != dtype) continue;
      views.push_back(tensors[i].view);
      views.back().out_row = i;
    }
  }
  std::vector<int64_t> counts(static_cast<size_t>(rows * readiness_count_columns(kNumRecipes)));
  std::vector<double> sums(static_cast<size_t>(rows * readiness_sum_columns(kNumRecipes)));
  std::vector<float> amax(rows), given_amax(rows);
  for (int64_t i = 0; i < rows; ++i) given_amax[i] = std::ldexp(1.0f, static_cast<int>(i % 5) * 8 - 16);
  ReadinessLaunchPlan plan{};
  plan.views = views.data();
  plan.num_views = static_cast<int64_t>(views.size());
  plan.num_tensors = rows;
  plan.chunk_tasks = chunk_tasks;
  plan.num_recipes = kNumRecipes;
  for (int r = 0; r < kNumRecipes; ++r) plan.slot_of_recipe[r] = r;
  plan.tensor_scaled_asked = true;
  plan.tensor_amax = given ? given_amax.data() : nullptr;
  plan.counts = counts.data();
  plan.sums = sums.data();
  plan.amax = amax.data();
  cuda_emu::Backend backend;
  backend.blocks_override = blocks;
  try {
    readiness_kernels::run_readiness(plan, backend);
  } catch (const std::exception& e) {
    std::printf("FAIL chunk %lld blocks %lld: %s\n", static_cast<long long>(chunk_tasks),
                static_cast<long long>(blocks), e.what());
    return 1;
  }
  int failures = 0;
  for (int64_t i = 0; i < rows; ++i) {
    std::vector<int64_t> want_counts;
    std::vector<double> want_sums;
    uint32_t want_amax = 0;
    serial(tensors[i].view, given ? &given_amax[i] : nullptr, want_counts, want_sums, want_amax);
    const int64_t* got = counts.data() + i * readiness_count_columns(kNumRecipes);
    const double* got_sums = sums.data() + i * readiness_sum_columns(kNumRecipes);
    bool ok = std::memcmp(&want_amax, &amax[i], 4) == 0;
    for (size_t k = 0; k < want_counts.size(); ++k) ok &= got[k] == want_counts[k];
    for (size_t k = 0; k < want_sums.size(); ++k) {
      ok &= std::fabs(got_sums[k] - want_sums[k]) <= 1e-10 * std::fabs(want_sums[k]);
    }
    if (!ok) {
      std::printf("FAIL tensor %lld (%lld x %lld, dtype %d), chunk %lld, blocks %lld, given amax %d\n",
                  static_cast<long long>(i), static_cast<long long>(tensors[i].view.rows),
                  static_cast<long long>(tensors[i].view.row_length), tensors[i].view.dtype,
                  static_cast<long long>(chunk_tasks), static_cast<long long>(blocks), given);
      ++failures;
    }
  }
  return failures;
}

}  // namespace

int main() {
  std::mt19937_64 rng(20261201);
  std::vector<Tensor> tensors;
  const int64_t shapes[][2] = {{1, 1}, {33, 1}, {9, 3}, {5, 16}, {4, 17}, {3, 33}, {2, 128}, {3, 129}, {2, 300}, {1, 1000}};
  int k = 0;
  for (const auto& shape : shapes) {
    for (int32_t dtype : {kFloat32, kFloat16, kBFloat16}) {
      tensors.push_back(make_tensor(rng, shape[0], shape[1], dtype, k % 3 == 1 ? 1 : 0));
      ++k;
    }
  }
  int failures = 0;
  int runs = 0;
  for (bool given : {false, true}) {
    for (int64_t chunk : {1, 16}) {  // kept few: every run is about 14 s under TSan on two cores
      for (int64_t blocks : {1, 3}) {
        failures += run(tensors, given, chunk, blocks);
        ++runs;
      }
    }
  }
  std::printf("%d runs of %zu tensors, %d mismatches\n", runs, tensors.size(), failures);
  return failures == 0 ? 0 : 1;
}
