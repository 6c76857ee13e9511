// cpu_kernel_ticks.cpp: the CPU kernel alone, in TSC ticks per element, on one 65536-element chunk that stays
// in L2 (one thread, the minimum over repeats, so other processes on a shared machine matter little): what
// the kernel costs when memory is not the limit. Values: randn * MAG (default 1e-4) with 0.1% zeros, as
// bench_tensor_stats.py draws them; float32, bfloat16 and float16 copies, one and four formats. The last line
// is a plain float32 sum of squares (the work of one read) compiled for baseline x86-64.
//
// It includes the kernel's source from the first -I folder that has one (another checkout's csrc measures that):
//   T=$(python -c "import torch, os; print(os.path.dirname(torch.__file__))")
//   g++ -O3 -std=c++20 -fno-fast-math -DKERNEL_SRC='"tensor_stats/tensor_stats_cpu.cpp"' -Icsrc -I$T/include \
//     -DTORCH_TARGET_VERSION=0x020a000000000000 bench/cpu_kernel_ticks.cpp csrc/common/op.cpp \
//     -L$T/lib -ltorch -ltorch_cpu -lc10 -Wl,-rpath,$T/lib -o /tmp/ticks && /tmp/ticks [MAG]
// ONLY=<dtype 0/1/2><formats 1/4> (e.g. ONLY=01) runs one case 20000 times, for `perf record -e cpu-clock`.
#include KERNEL_SRC
#include <x86intrin.h>
#include <cstdio>
#include <random>
#include <cmath>

using namespace amp_inspect;
static uint16_t to_bf16(float f) { uint32_t b; memcpy(&b, &f, 4); return (b + 0x7FFF + ((b >> 16) & 1)) >> 16; }
int main(int argc, char** argv) {
  const int64_t n = 1 << 16;
  double mag = argc > 1 ? atof(argv[1]) : 1e-4;
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  std::vector<uint32_t> f32(n);
  std::vector<uint16_t> b16(n), h16(n);
  for (int64_t i = 0; i < n; ++i) {
    float v = (i % 1000 == 7) ? 0.0f : nd(rng) * (float)mag;
    memcpy(&f32[i], &v, 4);
    b16[i] = to_bf16(v);
    h16[i] = torch::headeronly::Half(v).x;
  }
  const char* names[] = {"fp16", "bf16", "fp8_e4m3", "fp8_e5m2"};
  const char* only = getenv("ONLY"); int reps = only ? 20000 : 300;
  for (int dt = 0; dt < 3; ++dt) {
    for (int nf : {1, 4}) {
      if (only && (only[0] - '0' != dt || only[1] - '0' != nf)) continue;
      StatsCall call;
      call.num_formats = nf;
      for (int f = 0; f < nf; ++f) call.bounds[f] = kFormatBounds[f];
      TensorView view{};
      view.data = dt == 0 ? (const void*)f32.data() : dt == 1 ? (const void*)b16.data() : (const void*)h16.data();
      view.numel = n; view.dtype = dt == 0 ? kFloat32 : dt == 1 ? kBFloat16 : kFloat16;
      view.ndim = 1; view.sizes[0] = n; view.strides[0] = 1;
      uint64_t best = ~0ull;
      TensorAccumulator acc;
      for (int r = 0; r < reps; ++r) {
        acc.clear();
        uint64_t t0 = __rdtsc();
        count_chunk(view, 0, n, call, acc);
        uint64_t t1 = __rdtsc();
        best = std::min<uint64_t>(best, t1 - t0);
      }
      printf("%-5s %d fmt: %6.3f tsc/el  (zero %ld below0 %ld at0 %ld max %08x min %08x)\n",
             dt == 0 ? "fp32" : dt == 1 ? "bf16" : "fp16", nf, (double)best / n, (long)acc.counts.zero,
             (long)acc.counts.below_normal[0], (long)acc.counts.at_or_below_zero[0], acc.max_abs, acc.min_abs_nonzero);
    }
  }
  // foreach_norm proxy: a plain float32 sum of squares, 16 lanes
  {
    uint64_t best = ~0ull; float s = 0;
    for (int r = 0; r < 300; ++r) {
      uint64_t t0 = __rdtsc();
      using FV = float __attribute__((vector_size(64)));
      FV acc[4] = {};
      const float* p = (const float*)f32.data();
      for (int64_t i = 0; i < n; i += 64) for (int k = 0; k < 4; ++k) { FV v; memcpy(&v, p + i + 16*k, 64); acc[k] += v * v; }
      for (int k = 0; k < 4; ++k) for (int l = 0; l < 16; ++l) s += acc[k][l];
      best = std::min<uint64_t>(best, __rdtsc() - t0);
    }
    printf("sumsq-only fp32: %6.3f tsc/el (%g)\n", (double)best / n, s);
  }
}
