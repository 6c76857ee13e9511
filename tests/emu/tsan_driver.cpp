// tsan_driver.cpp: the CUDA kernels' source under ThreadSanitizer (`make test-emu-tsan`), torch-free.
//
// Runs the emulated kernels (every CUDA thread of a block a host thread, see csrc/common/cuda_emu.h) on small
// tensors of every dtype, dense, unaligned and strided, plain, scaled and unscaling, over several chunk
// sizes and grids, and checks every run against a serial reference built from tensor_stats.h (the per-element
// code the CPU kernel runs). A missing barrier shows up as a TSan data race report; a wrong index, merge or
// reduction as a mismatch. Exit status 0 only if every run matched (TSan's own reports exit 66).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/cuda_emu.h"  // first: the kernels are compiled for the CPU through it
#include "tensor_stats/tensor_stats_kernels.cuh"

using namespace amp_inspect;

namespace {

constexpr int kFormatsUsed = 4;

struct Expected {
  std::vector<int64_t> counts;  // [count_columns]
  std::vector<int64_t> hist;    // [256]
  float amax = 0.0f;
  float amin_nonzero = INFINITY;
  double sumsq = 0.0;
};

uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// float32 bits of v for element i of a view (scaled when scale > 0), the serial way.
uint32_t judged(const TensorView& v, int64_t i, float scale) {
  const int64_t o = element_offset(v, i);
  uint32_t bits = 0;
  switch (v.dtype) {
    case kFloat32:
      bits = static_cast<const uint32_t*>(v.data)[o];
      break;
    case kFloat16:
      bits = fp16_to_f32_bits(static_cast<const uint16_t*>(v.data)[o]);
      break;
    case kBFloat16:
      bits = bf16_to_f32_bits(static_cast<const uint16_t*>(v.data)[o]);
      break;
    default: {
      double d;
      std::memcpy(&d, static_cast<const uint64_t*>(v.data) + o, 8);
      bits = to_bits(static_cast<float>(d));
    }
  }
  return scale > 0 ? to_bits(from_bits(bits) * scale) : bits;
}

Expected reference(const TensorView& v, const FormatBounds* bounds, float scale) {
  RawCounts raw;
  clear_counts(raw);
  Expected e;
  e.hist.assign(kHistBins, 0);
  uint32_t max_abs = 0, min_abs = kInfBits32;
  for (int64_t i = 0; i < v.numel; ++i) {
    if (v.dtype == kFloat64 && scale <= 0) {
      uint64_t b = static_cast<const uint64_t*>(v.data)[element_offset(v, i)];
      count_element64(raw, b, bounds, kFormatsUsed);
      double d;
      std::memcpy(&d, &b, 8);
      const uint32_t b32 = to_bits(static_cast<float>(d));
      e.hist[hist_bin(b32)] += 1;
      if (is_finite64(b & kAbsMask64)) {
        max_abs = std::max(max_abs, b32 & kAbsMask32);
        if ((b & kAbsMask64) != 0) min_abs = std::min(min_abs, b32 & kAbsMask32);
        e.sumsq += d * d;
      }
      continue;
    }
    const uint32_t b = judged(v, i, scale);
    count_element32(raw, b, bounds, kFormatsUsed);
    e.hist[hist_bin(b)] += 1;
    const uint32_t a = b & kAbsMask32;
    if (is_finite32(a)) {
      max_abs = std::max(max_abs, a);
      if (a != 0) min_abs = std::min(min_abs, a);
      e.sumsq += static_cast<double>(from_bits(a)) * from_bits(a);
    }
  }
  e.counts.assign(count_columns(kFormatsUsed), 0);
  finalize_counts(raw, kFormatsUsed, e.counts.data());
  e.amax = from_bits(max_abs);
  e.amin_nonzero = from_bits(min_abs);
  return e;
}

struct Case {
  std::string name;
  std::vector<std::vector<uint8_t>> storage;
  std::vector<TensorView> views;
};

TensorView dense(const void* data, int64_t numel, int32_t dtype) {
  TensorView v{};
  v.data = data;
  v.numel = numel;
  v.dtype = dtype;
  v.ndim = 1;
  v.sizes[0] = numel;
  v.strides[0] = 1;
  return v;
}

Case make_case(std::mt19937_64& rng) {
  Case c;
  c.name = "mixed";
  const int64_t sizes[] = {1, 17, 64, 65, 200, 333, 8200};  // 8200: whole load rounds (4096 fp32, 8192 16-bit)
  const int32_t dtypes[] = {kFloat32, kFloat16, kBFloat16, kFloat64};
  std::uniform_int_distribution<uint64_t> bits;
  std::normal_distribution<float> normal;
  int k = 0;
  for (int64_t n : sizes) {
    for (int32_t dt : dtypes) {
      const int word = dt == kFloat64 ? 8 : (dt == kFloat32 ? 4 : 2);
      std::vector<uint8_t> buf(static_cast<size_t>((n + 4) * word) + 16);
      for (size_t i = 0; i < buf.size(); i += 8) {
        uint64_t r = bits(rng);
        std::memcpy(&buf[i], &r, std::min<size_t>(8, buf.size() - i));
      }
      // Mostly ordinary gradients, some random bit patterns (NaN, Inf, subnormals, huge and tiny).
      for (int64_t i = 0; i < n + 4; ++i) {
        if (i % 5 == 0) continue;
        const float f = normal(rng) * 1e-3f;
        if (dt == kFloat32) std::memcpy(&buf[i * 4], &f, 4);
        if (dt == kFloat64) {
          const double d = f;
          std::memcpy(&buf[i * 8], &d, 8);
        }
        if (dt == kFloat16 || dt == kBFloat16) {
          const uint16_t h = dt == kFloat16 ? cuda_emu::float_to_half_bits(f) : cuda_emu::float_to_bfloat16_bits(f);
          std::memcpy(&buf[i * 2], &h, 2);
        }
      }
      c.storage.push_back(std::move(buf));
      const uint8_t* base = c.storage.back().data();
      const int64_t offset = (k % 3 == 0) ? 1 : 0;  // some views start past a 16-byte boundary
      TensorView v = dense(base + offset * word, n, dt);
      if (k % 4 == 3 && n >= 4) {  // some strided: every other element of 2 rows
        v.ndim = 2;
        v.sizes[0] = 2;
        v.sizes[1] = n / 4;
        v.strides[0] = n / 2;
        v.strides[1] = 2;
        v.numel = 2 * (n / 4);
      }
      c.views.push_back(v);
      ++k;
    }
  }
  return c;
}

int run(const Case& c, int mode, int64_t chunk, int64_t blocks, bool inline_views, float scale) {
  const int columns = count_columns(kFormatsUsed);
  std::vector<TensorView> views = c.views;
  int64_t next = 0;
  for (size_t i = 0; i < views.size(); ++i) {
    views[i].out_row = static_cast<int64_t>(i);
    views[i].first_chunk = next;
    next += (views[i].numel + chunk - 1) / chunk;
  }
  const int64_t rows = static_cast<int64_t>(views.size());
  std::vector<int64_t> workspace(static_cast<size_t>(rows * workspace_columns(kFormatsUsed)));
  std::vector<int64_t> counts(static_cast<size_t>(rows * columns)), hist(static_cast<size_t>(rows * kHistBins));
  std::vector<float> amax(rows), amin(rows), inv_scale{0.5f}, found_inf{0.0f};
  std::vector<double> sumsq(rows);

  LaunchPlan plan{};
  plan.host_views = views.data();
  plan.num_views = rows;
  plan.device_views = inline_views ? nullptr : views.data();
  plan.num_tensors = rows;
  plan.total_chunks = next;
  plan.chunk_elems = chunk;
  for (int f = 0; f < kFormatsUsed; ++f) plan.bounds[f] = kFormatBounds[f];
  plan.num_formats = kFormatsUsed;
  plan.mode = mode;
  plan.scale_value = scale;
  plan.inv_scale = inv_scale.data();
  plan.found_inf = found_inf.data();
  plan.workspace = workspace.data();
  plan.workspace_words = static_cast<int64_t>(workspace.size());
  plan.counts = counts.data();
  plan.hist = hist.data();
  plan.amax = amax.data();
  plan.amin_nonzero = amin.data();
  plan.sumsq = sumsq.data();

  // Expected values first: unscale_stats_ overwrites the tensors.
  std::vector<Expected> expected;
  for (const TensorView& v : views) expected.push_back(reference(v, kFormatBounds, mode == kLaunchScaled ? scale : 0));
  cuda_emu::Backend backend;
  backend.blocks_override = blocks;
  kernels::run_stats(plan, backend);

  int failures = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const Expected& e = expected[static_cast<size_t>(r)];
    const char* wrong = nullptr;
    if (!std::equal(e.counts.begin(), e.counts.end(), counts.begin() + r * columns)) wrong = "counts";
    if (!std::equal(e.hist.begin(), e.hist.end(), hist.begin() + r * kHistBins)) wrong = "hist";
    if (to_bits(e.amax) != to_bits(amax[r])) wrong = "amax";
    if (to_bits(e.amin_nonzero) != to_bits(amin[r])) wrong = "amin_nonzero";
    if (!(e.sumsq == sumsq[r] || std::fabs(e.sumsq - sumsq[r]) <= 2e-6 * std::fabs(e.sumsq))) wrong = "sumsq";
    if (wrong != nullptr) {
      std::fprintf(stderr,
                   "MISMATCH in %s, mode %d chunk %lld blocks %lld inline %d: tensor %lld (dtype %d, %lld elements)\n",
                   wrong, mode, static_cast<long long>(chunk), static_cast<long long>(blocks), inline_views ? 1 : 0,
                   static_cast<long long>(r), views[r].dtype, static_cast<long long>(views[r].numel));
      ++failures;
    }
  }
  return failures;
}

}  // namespace

int main() {
  std::mt19937_64 rng(20261130);
  int failures = 0;
  int runs = 0;
  const struct {
    int mode;
    int64_t chunk, blocks;
    bool inline_views;
  } launches[] = {
      {kLaunchPlain, 64, 3, false}, {kLaunchPlain, 8, 5, true},    {kLaunchScaled, 32, 2, false},
      {kLaunchScaled, 2048, 1, true}, {kLaunchUnscale, 16, 4, false}, {kLaunchPlain, 64, 12, false},
  };
  for (const auto& l : launches) {
    const Case c = make_case(rng);  // fresh data: unscale overwrites
    failures += run(c, l.mode, l.chunk, l.blocks, l.inline_views, 1024.0f);
    ++runs;
  }
  std::printf("emulated CUDA kernels: %d launches sequences, %d mismatching tensors\n", runs, failures);
  return failures == 0 ? 0 : 1;
}
