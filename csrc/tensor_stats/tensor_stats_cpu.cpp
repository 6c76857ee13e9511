// tensor_stats_cpu.cpp: the CPU kernel of amp_inspect::tensor_stats.
//
// One pass over all tensors: the flat list of work chunks (kCpuChunkElems elements each, never crossing a
// tensor) is split across threads with torch::stable::parallel_for (at::parallel_for through the stable C
// shim, so torch's own thread pool). Each chunk is read in blocks of kBlockElems elements: float32 and
// bfloat16 as stored (bfloat16 on its 16-bit bits), the others turned into float32 bits of v in a small
// stack buffer (L1-resident; float16 by vcvtph2ps where the CPU has it). A block is counted by one vector
// pass (extremes, squares, exponent bins), then per-element threshold tests only for the bounds between
// its smallest and largest magnitude ("the common path" below says why that is exact; those the previous block
// straddled too are counted inside the vector pass, "the straddled bounds guessed" below), and its exponent
// histogram over the window of bins between those magnitudes (bit-sliced where the CPU has GFNI, VBMI and
// VPOPCNTDQ, byte compares elsewhere); blocks with NaN, Inf or float32 subnormals take count_block32_full,
// every test on every element. A thread keeps the running statistics of the tensor it is on and merges them
// into the outputs, under a lock, only when it moves to another tensor, so the lock is taken about
// T + threads times per call. No temporary grows with the number of elements.
//
// Why one file of about 1300 lines: the common path, the full path and the block driver share the block's
// staging buffer, the vector types and the lane-count bounds that keep their counters from wrapping; split
// across files, the proofs of exactness at the top of each path would refer to constants defined elsewhere.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/headeronly/util/BFloat16.h>
#include <torch/headeronly/util/Half.h>

#include <algorithm>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "common/cpu_clones.h"
#include "tensor_stats/tensor_stats_call.h"

namespace amp_inspect {
namespace {

constexpr int64_t kCpuChunkElems = int64_t{1} << 16;  // one unit of parallel work
constexpr int64_t kBlockElems = 2048;                 // staged in L1: 8 KiB of float32 bits
constexpr int kHistCopies = 8;  // interleaved histograms: runs of equal bins don't chain on one counter

// Which of a call's bounds (3 per format: overflow, normal, zero, in finish_block's order) the vector pass of the
// next block counts: those the previous block straddled ("the straddled bounds guessed" below). -1: none. It never
// changes a count, only which loop makes it.
struct StraddleGuess {
  int8_t bound[kMaxFormats] = {-1, -1, -1, -1};
};
static_assert(kMaxFormats == 4, "StraddleGuess's initialiser names every slot");

// Running statistics of one tensor on one thread.
struct TensorAccumulator {
  RawCounts counts;
  uint32_t max_abs;          // float32 bits of max |v| over finite v
  uint32_t min_abs_nonzero;  // float32 bits of min |v| over finite nonzero v
  double sumsq;
  int64_t hist[kHistBins];
  StraddleGuess guess;  // not a statistic: kept by clear(), so the next tensor's first block may use it too

  void clear() {
    clear_counts(counts);
    max_abs = 0;
    min_abs_nonzero = kInfBits32;
    sumsq = 0.0;
    std::fill(hist, hist + kHistBins, int64_t{0});
  }
};

// Walks the logical elements [start, start + count) of a view: contiguous, or strided with an odometer
// over the collapsed dims (one division per block, none per element). fn(i, offset) gets the element's
// position in the walk and its offset from the view's base, in elements.
template <typename Fn>
void walk_offsets(const TensorView& view, int64_t start, int64_t count, Fn&& fn) {
  if (is_contiguous_view(view)) {
    for (int64_t i = 0; i < count; ++i) fn(i, start + i);
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
    fn(i, offset);
    for (int d = nd - 1; d >= 0; --d) {  // advance the odometer
      offset += view.strides[d];
      if (++index[d] < view.sizes[d]) break;
      offset -= view.strides[d] * view.sizes[d];
      index[d] = 0;
    }
  }
}

template <typename T>
struct ElementReader {
  const T* base;
  const TensorView& view;

  template <typename Fn>
  void for_each(int64_t start, int64_t count, Fn&& fn) const {
    walk_offsets(view, start, count, [&](int64_t i, int64_t offset) { fn(i, base[offset]); });
  }
};

// Block totals of count_block32, merged into a TensorAccumulator by the caller.
struct BlockCounts {
  int64_t nan, posinf, neginf, zero;
  int64_t over[kMaxFormats], below[kMaxFormats], at_zero[kMaxFormats];
  int32_t max_abs, min_abs_nonzero;
  double sumsq;
};

// The block loops are written with GCC vector types, in one of two widths (kBytes): 64 bytes, 16 float32 lanes,
// one AVX-512 register; or 32 bytes, 8 lanes, one AVX2 register. On AVX2, GCC splits a 64-byte type into register
// pairs but keeps the loop-carried ones (extremes, squares) in memory: every step moved them through the stack 8
// bytes at a time. So the AVX2 build of the loops takes the 32-byte types (count_block_avx2 below), the AVX-512 and
// baseline clones the 64-byte ones. A vector_size cannot depend on a template parameter, hence one specialisation
// per width. What the widths change: which lane an element lands in, so the float32 partial sums of squares (each
// lane still sums at most kSquaresPerFlush terms, the same error bound); no count, extreme or histogram bin.
template <int kBytes>
struct Lanes;
template <>
struct Lanes<64> {
  using IntVec = int32_t __attribute__((vector_size(64)));
  using UintVec = uint32_t __attribute__((vector_size(64)));
  using FloatVec = float __attribute__((vector_size(64)));
  using DoubleVec = double __attribute__((vector_size(128)));
  using BinVec = uint8_t __attribute__((vector_size(16)));  // one byte per 32-bit lane
  using ByteVec = uint8_t __attribute__((vector_size(64)));
  using ShortVec = uint16_t __attribute__((vector_size(64)));
  using SignedShortVec = int16_t __attribute__((vector_size(64)));
  using WordVec = uint64_t __attribute__((vector_size(64)));
};
template <>
struct Lanes<32> {
  using IntVec = int32_t __attribute__((vector_size(32)));
  using UintVec = uint32_t __attribute__((vector_size(32)));
  using FloatVec = float __attribute__((vector_size(32)));
  using DoubleVec = double __attribute__((vector_size(64)));
  using BinVec = uint8_t __attribute__((vector_size(8)));
  using ByteVec = uint8_t __attribute__((vector_size(32)));
  using ShortVec = uint16_t __attribute__((vector_size(32)));
  using SignedShortVec = int16_t __attribute__((vector_size(32)));
  using WordVec = uint64_t __attribute__((vector_size(32)));
};
constexpr int kWideBytes = 64;  // the AVX-512 and baseline clones
constexpr int kAvx2Bytes = 32;  // the AVX2 build
// A function of the block loops names the types of its width: IntVec, UintVec, ... and kVectorWidth (float32 lanes),
// as their comments do.
#define AMPI_LANE_TYPES(kBytes)                                      \
  using IntVec [[maybe_unused]] = typename Lanes<kBytes>::IntVec;     \
  using UintVec [[maybe_unused]] = typename Lanes<kBytes>::UintVec;   \
  using FloatVec [[maybe_unused]] = typename Lanes<kBytes>::FloatVec; \
  using DoubleVec [[maybe_unused]] = typename Lanes<kBytes>::DoubleVec; \
  using BinVec [[maybe_unused]] = typename Lanes<kBytes>::BinVec;     \
  using ShortVec [[maybe_unused]] = typename Lanes<kBytes>::ShortVec; \
  [[maybe_unused]] constexpr int kVectorWidth = (kBytes) / 4;         \
  [[maybe_unused]] constexpr int kShortLanes = (kBytes) / 2

// Counts a block (at most kBlockElems) of float32 bits of v: the path of float32, float16, bfloat16 and
// scaled inputs. One loop does everything for kVectorWidth elements at a time, written with GCC vector
// types so every statistic but the histogram is a handful of vector instructions, and the histogram's
// scattered increments overlap with them. Lane counters are int32: a lane sees at most
// kBlockElems / kVectorWidth elements. Abs bits fit in int32, so signed compares are exact.
// Widest bin window counted by byte compares (2 vector ops per 64 elements per bin); a wider block takes
// one scattered increment per element instead.
constexpr int kMaxWindowBins = 40;
// Sums of squares: float32 lanes for this many vectors, then float64 (see scan_block32).
constexpr int kSquaresPerFlush = 16;
// Blocks whose largest |v| lies in [kFloatSquaresFrom, kFloatSquaresBelow) (tensor_stats.h, with the proof) sum their
// squares in float32 lanes of at most kSquaresPerFlush terms each; squares lost below float32's subnormal range (at
// most kBlockElems of them) are below 2^-38 of the block's sum. Other blocks sum in float64.

template <typename V>
inline int64_t lane_sum(const V& v) {
  int64_t total = 0;
  for (size_t l = 0; l < sizeof(V) / sizeof(v[0]); ++l) total += v[l];
  return total;
}

// Adds to hist[lo..hi] how many of bins[0, n) equal each bin, n <= kBlockElems. Byte compares over whole
// vectors, four bins per read of the block (a compare and a masked add per bin and 64 elements): the block
// is padded with bin 255, which is never inside the window (hi is a finite value's bin).
template <int kBytes>
__attribute__((always_inline)) inline void count_bins_in_window(uint8_t* __restrict bins, int64_t n, int lo, int hi,
                                                               uint32_t* hist) {
  constexpr int kBinLanes = kBytes;
  constexpr int kBinsPerRead = 4;
  using ByteVec = typename Lanes<kBytes>::ByteVec;
  using WordVec = typename Lanes<kBytes>::WordVec;
  static_assert(kBlockElems / kBinLanes <= 255, "byte counters must not wrap within a block");
  const int64_t vectors = (n + kBinLanes - 1) / kBinLanes;
  for (int64_t i = n; i < vectors * kBinLanes; ++i) bins[i] = static_cast<uint8_t>(kHistBins - 1);
  for (int first = lo; first <= hi; first += kBinsPerRead) {
    ByteVec count[kBinsPerRead] = {};
    for (int64_t v = 0; v < vectors; ++v) {
      ByteVec x;
      std::memcpy(&x, bins + v * kBinLanes, sizeof x);
      for (int k = 0; k < kBinsPerRead; ++k) {
        const ByteVec bin = ByteVec{} + static_cast<uint8_t>(first + k);
        if constexpr (kBytes == kAvx2Bytes) {
          count[k] -= (ByteVec)(x == bin);  // the compare's -1 lanes: a compare and a subtraction (a blend is a third)
        } else {
          count[k] = x == bin ? count[k] + 1 : count[k];  // AVX-512: a compare into a mask and a masked add
        }
      }
    }
    for (int k = 0; k < kBinsPerRead && first + k <= hi; ++k) {
      // Sum the 64 byte counters: pairwise within each 64-bit word (bytes -> 16 -> 32 -> 64 bits).
      WordVec w = (WordVec)count[k];  // a vector cast reinterprets the bits
      w = (w & 0x00FF00FF00FF00FFull) + ((w >> 8) & 0x00FF00FF00FF00FFull);
      w = (w & 0x0000FFFF0000FFFFull) + ((w >> 16) & 0x0000FFFF0000FFFFull);
      w = (w & 0x00000000FFFFFFFFull) + (w >> 32);
      uint64_t total = 0;
      for (int j = 0; j < kBinLanes / 8; ++j) total += w[j];
      hist[first + k] += static_cast<uint32_t>(total);
    }
  }
}

// ---- the window bit-sliced (AVX-512 with GFNI, VBMI and VPOPCNTDQ) ----
//
// count_bins_in_window spends a compare and a masked add per bin and 64 elements: with the 14-17 binades of a
// block of Gaussian gradients, about half of the kernel. Here each 512 elements of the block become five bit
// planes (the bits of d = min(bin - lo, 31) mod 256), and a bin's count over them is two ternary-logic
// operations, a popcount and an add: about 3 vector operations per bin and 512 elements, plus about 5 per 64 to
// build the planes (subtract, min, an 8 x 8 bit transpose per 8 bytes, byte and lane shuffles).
//
// Exactness. For a bin b of the block, d = (b - lo) mod 256 is b - lo in [0, hi - lo] exactly when lo <= b <= hi,
// and above hi - lo otherwise (b > hi: b - lo > hi - lo; b < lo wraps to 256 + b - lo > 254 - lo >= hi - lo, as
// hi <= 254, a finite bin; the padding's 255 is above hi). min(d, 31) keeps that, as only windows with
// hi - lo <= 30 come here. So offset k <= hi - lo counts exactly the bytes of bin lo + k, whichever order the
// transposes leave the elements in (the same order in every plane).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AMPI_BITSLICED_WINDOW 1
#define AMPI_BITSLICED_TARGET \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,gfni,avx512vpopcntdq")))
constexpr int kSliceElems = 512;  // one chunk: 8 vectors of 64 bins, 5 planes of 512 bits
constexpr int kPlanes = 5;        // offsets 0..31
constexpr int kSlicedBins = 31;   // offsets 0..30 are bins; 31 takes every byte outside the window
constexpr int kBinsPerGroup = 4;  // offset = 4 * group + i: planes 2..4 pick the group, planes 0..1 the bin
constexpr int kMaxChunks = static_cast<int>(kBlockElems / kSliceElems);
// For tests, set (to anything) in the environment: the window takes count_bins_in_window's byte compares where this
// CPU would take the bit-sliced form (tests/test_histogram_paths.py compares the two in two processes).
constexpr const char* kByteWindowVariable = "AMP_INSPECT_TEST_TENSOR_STATS_BYTE_WINDOW";

// The AVX-512 clones' features (wide_lanes, common/cpu_clones.h: the window runs inside their loops) and the three
// this form adds.
bool bitsliced_window() {
  static const bool ok = wide_lanes() && __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("gfni") &&
                         __builtin_cpu_supports("avx512vpopcntdq") && std::getenv(kByteWindowVariable) == nullptr;
  return ok;
}

// Byte shuffles of the transpose. After the bit transpose, byte 8q + j of a vector is plane j of its elements
// 8q..8q+7. kPairPlanes takes two such vectors (a, and b as indices 64..127) into one: 128-bit lane j holds plane j
// of both (a's 8 bytes, then b's), j = 0..3. kPairPlane4 puts plane 4 of both in every lane.
struct PlaneShuffles {
  alignas(64) uint8_t pair_planes[64];
  alignas(64) uint8_t pair_plane4[64];
};
constexpr PlaneShuffles make_plane_shuffles() {
  PlaneShuffles s{};
  for (int o = 0; o < 64; ++o) {
    const int lane = o / 16, within = o % 16;
    const int source = (within / 8) * 64 + 8 * (within % 8);
    s.pair_planes[o] = static_cast<uint8_t>(source + lane);
    s.pair_plane4[o] = static_cast<uint8_t>(source + 4);
  }
  return s;
}
constexpr PlaneShuffles kPlaneShuffles = make_plane_shuffles();

// ternarylogic's truth table with one row set: the AND of (a == A, b == B, c == C), row (a << 2) | (b << 1) | c.
constexpr int only_row(int a, int b, int c) { return 1 << ((a << 2) | (b << 1) | c); }

// count plus, per 64-bit lane, how many of the group's elements have I in planes 0..1.
template <int I>
AMPI_BITSLICED_TARGET inline __m512i add_sliced_bin(__m512i count, __m512i p0, __m512i p1, __m512i group) {
  const __m512i in_bin = _mm512_ternarylogic_epi64(p0, p1, group, only_row(I & 1, I >> 1, 1));
  return _mm512_add_epi64(count, _mm512_popcnt_epi64(in_bin));
}

// Adds the counts of offsets k = 4G .. 4G + 3 (those <= last) in the chunks' planes to hist[k] (hist: the window's
// first bin).
template <int G>
AMPI_BITSLICED_TARGET void count_sliced_group(const __m512i (*planes)[kPlanes], int chunks, int last,
                                              uint32_t* hist) {
  constexpr int kGroup = only_row(G & 1, (G >> 1) & 1, (G >> 2) & 1);
  __m512i count[kBinsPerGroup];
  for (int i = 0; i < kBinsPerGroup; ++i) count[i] = _mm512_setzero_si512();
  for (int c = 0; c < chunks; ++c) {
    const __m512i group = _mm512_ternarylogic_epi64(planes[c][2], planes[c][3], planes[c][4], kGroup);
    const __m512i p0 = planes[c][0], p1 = planes[c][1];
    count[0] = add_sliced_bin<0>(count[0], p0, p1, group);
    count[1] = add_sliced_bin<1>(count[1], p0, p1, group);
    count[2] = add_sliced_bin<2>(count[2], p0, p1, group);
    count[3] = add_sliced_bin<3>(count[3], p0, p1, group);
  }
  // Each 64-bit lane counts at most kBlockElems / 8 elements: the four bins' lanes packed 16 bits apart, then
  // one horizontal sum.
  // (GCC's vector operators and a store, not _mm512_slli_epi64 / _mm512_reduce_add_epi64, whose GCC 12 forms
  // start from an undefined vector and warn of it as uninitialized.)
  const __m512i packed = (count[0] + (count[1] << 16)) + ((count[2] << 32) + (count[3] << 48));
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, packed);
  uint64_t total = 0;
  for (const uint64_t lane : lanes) total += lane;
  for (int i = 0; i < kBinsPerGroup && kBinsPerGroup * G + i <= last; ++i) {
    hist[kBinsPerGroup * G + i] += static_cast<uint32_t>((total >> (16 * i)) & 0xFFFFu);
  }
}

// Adds to hist[lo..hi] how many of bins[0, n) equal each bin, n <= kBlockElems, 0 <= hi - lo < kSlicedBins: what
// count_bins_in_window does, bit-sliced. Pads bins up to whole chunks with 255.
AMPI_BITSLICED_TARGET void count_bins_bitsliced(uint8_t* __restrict bins, int64_t n, int lo, int hi, uint32_t* hist) {
  static_assert(kBlockElems % kSliceElems == 0 && kBlockElems / 8 < (1 << 16), "16-bit fields of the packed sum");
  const int chunks = static_cast<int>((n + kSliceElems - 1) / kSliceElems);
  std::memset(bins + n, 0xFF, static_cast<size_t>(chunks * kSliceElems - n));
  const __m512i base = _mm512_set1_epi8(static_cast<char>(lo)), top = _mm512_set1_epi8(kSlicedBins);
  // gf2p8affine with the data as the matrices and byte j of each qword = 1 << j: byte j of the result is bit j of
  // the qword's 8 bytes (element 8q + 7 - i in bit i).
  const __m512i unit = _mm512_set1_epi64(static_cast<int64_t>(0x8040201008040201ull));
  const __m512i pair_planes = _mm512_load_si512(kPlaneShuffles.pair_planes);
  const __m512i pair_plane4 = _mm512_load_si512(kPlaneShuffles.pair_plane4);
  __m512i planes[kMaxChunks][kPlanes];
  for (int c = 0; c < chunks; ++c) {
    __m512i t[8];
    for (int v = 0; v < 8; ++v) {
      const __m512i b = _mm512_load_si512(bins + c * kSliceElems + 64 * v);
      t[v] = _mm512_gf2p8affine_epi64_epi8(unit, _mm512_min_epu8(_mm512_sub_epi8(b, base), top), 0);
    }
    __m512i z[4], y[4];
    for (int a = 0; a < 4; ++a) {
      z[a] = _mm512_permutex2var_epi8(t[2 * a], pair_planes, t[2 * a + 1]);  // lane j: plane j of the pair
      y[a] = _mm512_permutex2var_epi8(t[2 * a], pair_plane4, t[2 * a + 1]);  // every lane: plane 4 of the pair
    }
    // Plane j (0..3) of the chunk = lane j of z[0..3]: a 4 x 4 transpose of 128-bit lanes (the zero-masked form
    // with every lane kept: the plain one's GCC 12 form starts from an undefined vector and warns of it).
    constexpr __mmask8 kAll = 0xFF;
    const __m512i low01 = _mm512_maskz_shuffle_i64x2(kAll, z[0], z[1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i high01 = _mm512_maskz_shuffle_i64x2(kAll, z[0], z[1], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i low23 = _mm512_maskz_shuffle_i64x2(kAll, z[2], z[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i high23 = _mm512_maskz_shuffle_i64x2(kAll, z[2], z[3], _MM_SHUFFLE(3, 2, 3, 2));
    planes[c][0] = _mm512_maskz_shuffle_i64x2(kAll, low01, low23, _MM_SHUFFLE(2, 0, 2, 0));
    planes[c][1] = _mm512_maskz_shuffle_i64x2(kAll, low01, low23, _MM_SHUFFLE(3, 1, 3, 1));
    planes[c][2] = _mm512_maskz_shuffle_i64x2(kAll, high01, high23, _MM_SHUFFLE(2, 0, 2, 0));
    planes[c][3] = _mm512_maskz_shuffle_i64x2(kAll, high01, high23, _MM_SHUFFLE(3, 1, 3, 1));
    // Plane 4: lane a from y[a], in the same element order.
    __m512i p4 = _mm512_mask_blend_epi64(0x0C, y[0], y[1]);
    p4 = _mm512_mask_blend_epi64(0x30, p4, y[2]);
    planes[c][4] = _mm512_mask_blend_epi64(0xC0, p4, y[3]);
  }
  const int last = hi - lo;
  uint32_t* window = hist + lo;
  for (int g = 0; g * kBinsPerGroup <= last; ++g) {
    switch (g) {
      case 0: count_sliced_group<0>(planes, chunks, last, window); break;
      case 1: count_sliced_group<1>(planes, chunks, last, window); break;
      case 2: count_sliced_group<2>(planes, chunks, last, window); break;
      case 3: count_sliced_group<3>(planes, chunks, last, window); break;
      case 4: count_sliced_group<4>(planes, chunks, last, window); break;
      case 5: count_sliced_group<5>(planes, chunks, last, window); break;
      case 6: count_sliced_group<6>(planes, chunks, last, window); break;
      default: count_sliced_group<7>(planes, chunks, last, window); break;
    }
  }
}
#endif

// The window counted the fastest way this CPU has: bit-sliced on AVX-512 CPUs with GFNI, VBMI and VPOPCNTDQ (for
// windows of at most kSlicedBins bins), else byte compares.
template <int kBytes>
__attribute__((always_inline)) inline void count_window(uint8_t* __restrict bins, int64_t n, int lo, int hi,
                                                        uint32_t* hist) {
#ifdef AMPI_BITSLICED_WINDOW
  if (kBytes == kWideBytes && lo <= hi && hi - lo < kSlicedBins && bitsliced_window()) {
    count_bins_bitsliced(bins, n, lo, hi, hist);
    return;
  }
#endif
  count_bins_in_window<kBytes>(bins, n, lo, hi, hist);
}

template <int kFormats, int kBytes>
__attribute__((always_inline)) inline void count_block32_full(const uint32_t* __restrict bits, int64_t n,
                                                             const FormatBounds* bounds, BlockCounts& out,
                                                             uint32_t (&hist)[kHistCopies][kHistBins]) {
  AMPI_LANE_TYPES(kBytes);
  constexpr int32_t kInf = static_cast<int32_t>(kInfBits32);
  constexpr int32_t kAbs = static_cast<int32_t>(kAbsMask32);
  // A vector comparison yields -1 in the lanes where it holds, so counters subtract it.
  IntVec nonfinite = {}, zero = {}, max_abs = {};
  UintVec min_abs_minus_one = {};
  min_abs_minus_one += kInfBits32;
  UintVec over[kFormats] = {}, below[kFormats] = {}, at_zero[kFormats] = {};  // threshold counts: below32
  uint32_t overflow_from[kFormats], normal_from[kFormats], zero_below[kFormats];
  for (int f = 0; f < kFormats; ++f) {
    overflow_from[f] = bounds[f].overflow_from;
    normal_from[f] = bounds[f].normal_from;
    zero_below[f] = bounds[f].zero_upto + 1u;  // a <= zero_upto is a < zero_upto + 1
  }
  DoubleVec sumsq = {};
  alignas(64) uint8_t bins[kBlockElems + 64];  // room to pad the last vector of count_bins_in_window

  const int64_t full = n - n % kVectorWidth;
  for (int64_t group = 0; group < full; group += kSquaresPerFlush * kVectorWidth) {
    // Squares are summed in float32 lanes for kSquaresPerFlush vectors, then added into float64 lanes:
    // a lane's float32 sum has at most kSquaresPerFlush terms, so its relative error stays below
    // kSquaresPerFlush * 2^-24 (about 1e-6). Blocks whose magnitudes could overflow or flush float32
    // squares are summed again in float64 below.
    FloatVec squares = {};
    const int64_t group_end = std::min(full, group + kSquaresPerFlush * kVectorWidth);
    for (int64_t i = group; i < group_end; i += kVectorWidth) {
      IntVec b;
      std::memcpy(&b, bits + i, sizeof b);
      const IntVec a = b & kAbs;
      nonfinite -= a >= kInf;  // split into NaN / +Inf / -Inf afterwards, only in blocks that have any
      zero -= a == 0;
      const UintVec ua = (UintVec)a;  // a vector cast reinterprets the bits
      for (int f = 0; f < kFormats; ++f) {
        over[f] += below32(ua, UintVec{} + overflow_from[f]);  // counts a < overflow_from; n - it below
        below[f] += below32(ua, UintVec{} + normal_from[f]);
        at_zero[f] += below32(ua, UintVec{} + zero_below[f]);
      }
      // Extremes over finite values: non-finite lanes become 0. The minimum is taken over |bits| - 1 as
      // unsigned, which sends zeros to the top, so one select serves both exclusions.
      const IntVec finite = a & (a < kInf);
      max_abs = finite > max_abs ? finite : max_abs;
      const UintVec minus_one = (UintVec)finite - 1u;  // a vector cast reinterprets the bits
      min_abs_minus_one = minus_one < min_abs_minus_one ? minus_one : min_abs_minus_one;
      const FloatVec v = (FloatVec)finite;
      squares += v * v;
      // Exponent bins, kept as bytes for count_bins_in_window.
      const IntVec bin = (b >> kExponentShift32) & static_cast<int32_t>(kExponentMask32);
      const BinVec bin_bytes = __builtin_convertvector(bin, BinVec);
      std::memcpy(bins + i, &bin_bytes, sizeof bin_bytes);
    }
    sumsq += __builtin_convertvector(squares, DoubleVec);
  }

  RawCounts tail;  // the last n % kVectorWidth elements, one by one
  clear_counts(tail);
  uint32_t tail_max = 0, tail_min = kInfBits32;
  double tail_sumsq = 0.0;
  for (int64_t i = full; i < n; ++i) {
    count_element32(tail, bits[i], bounds, kFormats);
    const uint32_t a = bits[i] & kAbsMask32;
    if (is_finite32(a)) {
      tail_max = std::max(tail_max, a);
      if (a != 0) tail_min = std::min(tail_min, a);
      const double v = static_cast<double>(bits_as_float32(a));
      tail_sumsq += v * v;
    }
    bins[i] = static_cast<uint8_t>(hist_bin(bits[i]));
  }

  out.nan = tail.nan;
  out.posinf = tail.posinf;
  out.neginf = tail.neginf;
  if (lane_sum(nonfinite) > 0) {  // rare: only blocks holding NaN or Inf pay for telling them apart
    for (int64_t i = 0; i < full; ++i) {
      out.nan += (bits[i] & kAbsMask32) > kInfBits32;
      out.posinf += bits[i] == kInfBits32;
      out.neginf += bits[i] == kNegInfBits32;
    }
  }
  out.zero = lane_sum(zero) + tail.zero;
  for (int f = 0; f < kFormats; ++f) {
    out.over[f] = (full - lane_sum(over[f])) + tail.at_or_above_overflow[f];
    out.below[f] = lane_sum(below[f]) + tail.below_normal[f];
    out.at_zero[f] = lane_sum(at_zero[f]) + tail.at_or_below_zero[f];
  }
  uint32_t block_max = tail_max, block_min_minus_one = kInfBits32;
  double block_sumsq = tail_sumsq;
  for (int l = 0; l < kVectorWidth; ++l) {
    block_max = std::max(block_max, static_cast<uint32_t>(max_abs[l]));
    block_min_minus_one = std::min(block_min_minus_one, min_abs_minus_one[l]);
    block_sumsq += sumsq[l];
  }
  const uint32_t vector_min = block_min_minus_one >= kInfBits32 ? kInfBits32 : block_min_minus_one + 1;
  out.max_abs = static_cast<int32_t>(block_max);
  out.min_abs_nonzero = static_cast<int32_t>(std::min(vector_min, tail_min));
  if (block_max > 0 && (block_max < kFloatSquaresFrom || block_max >= kFloatSquaresBelow)) {
    // Squares near float32's limits (they would overflow, or the whole sum would sit among flushed
    // subnormals): sum this block again in float64, exactly as the scalar tail does.
    block_sumsq = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t a = bits[i] & kAbsMask32;
      const double v = static_cast<double>(bits_as_float32(is_finite32(a) ? a : 0u));
      block_sumsq += v * v;
    }
  }
  out.sumsq = block_sumsq;

  // Histogram. Every element is zero (bin 0), non-finite (bin 255) or has its bin between those of the
  // block's smallest and largest finite nonzero magnitudes, which for gradients span a few dozen binades
  // at most. Then counting each bin of that window with byte compares over the whole block is several
  // times cheaper than one scattered increment per element; wider blocks take the scattered increments.
  const int lo = out.min_abs_nonzero == static_cast<int32_t>(kInfBits32) ? 1 : hist_bin(out.min_abs_nonzero);
  const int hi = hist_bin(out.max_abs);
  if (hi - lo < kMaxWindowBins) {  // also when there is no finite nonzero value (lo > hi): an empty window
    count_window<kBytes>(bins, n, lo, hi, hist[0]);
    // Outside the window: zeros (bin 0, unless float32 subnormals put bin 0 inside it) and non-finite values.
    if (lo > 0) hist[0][0] += static_cast<uint32_t>(out.zero);
    hist[0][kHistBins - 1] += static_cast<uint32_t>(out.nan + out.posinf + out.neginf);
  } else {
    const int64_t whole = n - n % kHistCopies;
    for (int64_t i = 0; i < whole; i += kHistCopies) {
      for (int k = 0; k < kHistCopies; ++k) hist[k][bins[i + k]] += 1;
    }
    for (int64_t i = whole; i < n; ++i) hist[0][bins[i]] += 1;
  }
}

// ---- the common path: per-block extremes decide which thresholds need a per-element pass ----
//
// A block on the common path has no NaN, no Inf and no float32 subnormal. One vector pass takes what every
// element needs (max and min of |bits|, squares, exponent bins); the threshold counts then come from the
// block's extremes wherever a threshold lies outside them, and only the thresholds inside [min, max] get a
// second, per-element pass over the block (in L1). Blocks off the common path are counted again by
// count_block32_full, which tests every element against every bound.
//
// Why this and not counts from the exponent histogram (issue 19's option a): a bound's count from the
// histogram still needs a per-element test of the bound's own bin whenever that bin is inside the block's
// window, and the window [bin(min), bin(max)] holds every bound that [min, max] holds, so the histogram
// saves a pass only for bounds exactly on a binade edge with a strict test; none of the twelve is.
//
// Exactness. Let Z be the block's zeros, m its smallest nonzero |bits| and M its largest (all finite, m at
// least float32's smallest normal). For a bound t >= 1 (every bound is), count(a < t) is
//   n  when t > M  (every a <= M < t),
//   Z  when t <= m (every nonzero a >= m >= t, and every zero is below t),
// and is otherwise counted element by element. Zeros: every element is zero (bin 0, as no subnormal is
// there) or has its bin in [bin(m), bin(M)], so Z = n minus the elements counted in those bins, and the
// histogram's bin 0 is Z. The extremes: with no non-finite value, max |bits| is the plain max, and the
// unsigned min of |bits| - 1 sends only zeros to the top, so min nonzero |bits| is that min + 1.
//
// The same holds in any order-preserving key: bfloat16 blocks are counted on their 16-bit |bits| (key =
// |bits of v| >> 16, exact as the low half is zero), with each bound t as the key ceil(t / 2^16):
// a16 * 2^16 < t exactly when a16 < ceil(t / 2^16), as a16 is an integer.

constexpr uint32_t kSmallestNormal32 = 0x00800000u;

// What the vector pass hands to finish_block, in keys (|bits| >> kKeyShift).
struct BlockScan {
  uint32_t max_key;
  uint32_t min_key_minus_one;  // ~0u when every element is zero
  double sumsq;
};

// Adds a < t to each lane of count (unsigned lanes; SignedVec the same lanes signed), a and t below the sign bit
// (every |bits|, bfloat16 key and bound is, so a signed compare is exact). On 32-byte lanes (AVX2) a signed
// compare and the subtraction of its -1 lanes; on 64-byte lanes (AVX-512) a compare into a mask register and a
// masked add (count_bins_in_window's form): two instructions either way, where below32's wrap-around test takes
// three (subtract, shift, add).
template <int kBytes, typename SignedVec, typename Vec>
__attribute__((always_inline)) inline void add_below(Vec& count, Vec a, Vec t) {
  if constexpr (kBytes == kAvx2Bytes) {
    count -= (Vec)((SignedVec)a < (SignedVec)t);
  } else {
    count = (SignedVec)a < (SignedVec)t ? count + 1 : count;
  }
}

// count(key < t[k]) over a block of keys, K bounds at a time: float32 |bits| (Key uint32_t) or bfloat16 |bits|
// (uint16_t, kShortLanes lanes; a lane counts at most kBlockElems / kShortLanes elements, far below 2^16).
template <int K, int kBytes, typename Key>
__attribute__((always_inline)) inline void count_below(const Key* __restrict keys, int64_t n, const uint32_t* t,
                                                       int64_t* below) {
  constexpr bool kShort = sizeof(Key) == 2;
  using Vec = std::conditional_t<kShort, typename Lanes<kBytes>::ShortVec, typename Lanes<kBytes>::UintVec>;
  using SignedVec =
      std::conditional_t<kShort, typename Lanes<kBytes>::SignedShortVec, typename Lanes<kBytes>::IntVec>;
  constexpr Key kMask = static_cast<Key>(kShort ? 0x7FFFu : kAbsMask32);
  constexpr int kLanes = kBytes / static_cast<int>(sizeof(Key));
  Vec count[K] = {};
  const int64_t full = n - n % kLanes;
  for (int64_t i = 0; i < full; i += kLanes) {
    Vec x;
    std::memcpy(&x, keys + i, sizeof x);
    const Vec a = x & kMask;
    for (int k = 0; k < K; ++k) add_below<kBytes, SignedVec>(count[k], a, Vec{} + static_cast<Key>(t[k]));
  }
  for (int k = 0; k < K; ++k) {
    below[k] = lane_sum(count[k]);
    for (int64_t i = full; i < n; ++i) below[k] += static_cast<uint32_t>(keys[i] & kMask) < t[k];
  }
}

// ---- the straddled bounds guessed from the previous block ----
//
// A bound inside a block's [min, max] costs a second pass over the block (count_below) unless the vector pass has
// counted it already. So the vector pass also counts the bounds that the previous block of this thread straddled
// (StraddleGuess): neighbouring blocks hold values of one tensor, or of one like it, so they mostly straddle the
// same bounds. There each costs a compare and an add per vector (add_below), where a second pass reads the block
// again and masks every vector first. A bound the guess missed still takes the second pass.
//
// Exactness: a guessed count is key < t counted element by element over the whole block, as count_below counts it,
// whether or not the block straddles t; finish_block takes it only for a bound this block straddles. The guess
// chooses which loop counts, never what is counted.
//
// The vector pass is instantiated per number of guessed bounds (0 to guess_slots), not per format count (it does not
// depend on the formats): a block with nothing to guess runs the pass without any compare, and a call's format count
// adds no copy of it. Slots: every bound a call of four formats' blocks straddle at once on gradients (fp16's and
// fp8_e5m2's normal and zero bounds, fp8_e4m3's zero bound) on 64-byte lanes, two on 32-byte lanes (AVX2's 16
// registers already hold the pass's extremes, squares and bins).
template <int kBytes>
constexpr int guess_slots() {
  return kBytes == kAvx2Bytes ? 2 : kMaxFormats;
}
constexpr int kMaxBounds = 3 * kMaxFormats;
constexpr int kBoundsPerPass = 4;  // bounds count_below takes in one pass over a block

// The bounds of a call as keys (|bits| >> shift, shift 16 for bfloat16 keys, else 0): count(a < t) of a float32
// bound t is count(key < ceil(t / 2^shift)) (see "the common path" below); zero_upto counted as a < zero_upto + 1.
__attribute__((always_inline)) inline void bound_keys(const FormatBounds* bounds, int num_formats, int shift,
                                                      uint32_t (&t)[kMaxBounds]) {
  const uint32_t round_up = (1u << shift) - 1u;
  for (int f = 0; f < num_formats; ++f) {
    t[3 * f] = (bounds[f].overflow_from + round_up) >> shift;
    t[3 * f + 1] = (bounds[f].normal_from + round_up) >> shift;
    t[3 * f + 2] = (bounds[f].zero_upto + 1u + round_up) >> shift;  // a <= zero_upto is a < zero_upto + 1
  }
}

// A call's bounds as keys of both kinds, worked out once per chunk, not per block.
struct BlockKeys {
  uint32_t f32[kMaxBounds];   // float32 |bits|
  uint32_t bf16[kMaxBounds];  // bfloat16 |bits| (16-bit keys)
};
inline BlockKeys block_keys(const FormatBounds* bounds, int num_formats) {
  BlockKeys keys;
  bound_keys(bounds, num_formats, 0, keys.f32);
  bound_keys(bounds, num_formats, 16, keys.bf16);
  return keys;
}

// The bounds the vector pass counts for a block: the guess's, those of them this call has (run_cpu's guesses live for
// one call, but a caller that keeps its TensorAccumulator across calls, as bench/cpu_kernel_ticks.cpp does, may
// hand over a guess naming a bound of more formats). below[i]: count(key < key[i]) over the whole block, from the pass.
struct LiveGuess {
  int count = 0;
  int bound[kMaxFormats];
  uint32_t key[kMaxFormats];
  int64_t below[kMaxFormats];
};

template <int kBytes>
__attribute__((always_inline)) inline LiveGuess live_guess(const StraddleGuess& guess, int num_bounds,
                                                           const uint32_t (&t)[kMaxBounds]) {
  LiveGuess live;
  for (int j = 0; j < guess_slots<kBytes>(); ++j) {
    const int k = guess.bound[j];
    if (k < 0 || k >= num_bounds) continue;
    live.bound[live.count] = k;
    live.key[live.count++] = t[k];
  }
  return live;
}

// Block results from the scan: extremes, histogram over the window of bins, thresholds. Returns false (and
// touches nothing) for a block off the common path. Key is uint32_t (float32 bits) or uint16_t (bfloat16). `t`: the
// bounds as keys (bound_keys); `live`: what the vector pass counted for the guess, which is then set to this block's
// straddled bounds.
template <int kFormats, int kBytes, typename Key>
__attribute__((always_inline)) inline bool finish_block(const Key* __restrict keys, int64_t n, BlockScan scan,
                                                        uint8_t* __restrict bins, const uint32_t (&t)[kMaxBounds],
                                                        const LiveGuess& live, StraddleGuess& guess, BlockCounts& out,
                                                        uint32_t (&hist)[kHistCopies][kHistBins]) {
  constexpr int kShift = sizeof(Key) == 2 ? 16 : 0;
  constexpr uint32_t kKeyMask = kAbsMask32 >> kShift;
  if (scan.max_key >= (kInfBits32 >> kShift) || scan.min_key_minus_one < (kSmallestNormal32 >> kShift) - 1u) {
    return false;
  }
  const bool any_nonzero = scan.min_key_minus_one != ~0u;
  const uint32_t max_key = scan.max_key, min_key = scan.min_key_minus_one + 1u;  // min: only if any_nonzero
  const uint32_t block_max = max_key << kShift;
  double block_sumsq = scan.sumsq;
  if (block_max > 0 && (block_max < kFloatSquaresFrom || block_max >= kFloatSquaresBelow)) {
    block_sumsq = 0.0;  // squares near float32's limits: float64, as count_block32_full does
    for (int64_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(bits_as_float32((keys[i] & kKeyMask) << kShift));
      block_sumsq += v * v;
    }
  }

  // Histogram over the window [bin(m), bin(M)]; what is not in it is a zero.
  int64_t zeros = n;
  if (any_nonzero) {
    const int lo = static_cast<int>(hist_bin(min_key << kShift)), hi = static_cast<int>(hist_bin(block_max));
    if (hi - lo < kMaxWindowBins) {
      uint32_t window[kHistBins] = {};
      count_window<kBytes>(bins, n, lo, hi, window);
      for (int b = lo; b <= hi; ++b) {
        hist[0][b] += window[b];
        zeros -= window[b];
      }
      hist[0][0] += static_cast<uint32_t>(zeros);
    } else {
      const int64_t whole = n - n % kHistCopies;
      for (int64_t i = 0; i < whole; i += kHistCopies) {
        for (int k = 0; k < kHistCopies; ++k) hist[k][bins[i + k]] += 1;
      }
      for (int64_t i = whole; i < n; ++i) hist[0][bins[i]] += 1;
      zeros = 0;
      for (int64_t i = 0; i < n; ++i) zeros += (keys[i] & kKeyMask) == 0;
    }
  } else {
    hist[0][0] += static_cast<uint32_t>(n);
  }

  // Thresholds, as keys: count(key < t) from the extremes, or per element for the straddled ones: by the vector
  // pass where the guess named them, else by a pass of their own.
  constexpr int kBounds = 3 * kFormats;
  int64_t below[kBounds];
  uint32_t unguessed[kBounds];
  int where[kBounds], straddled[kBounds];
  int num_straddled = 0, num_unguessed = 0;
  for (int k = 0; k < kBounds; ++k) {
    if (t[k] > max_key) {
      below[k] = n;
    } else if (!any_nonzero || t[k] <= min_key) {
      below[k] = zeros;
    } else {
      straddled[num_straddled++] = k;
      int slot = -1;
      for (int i = 0; i < live.count; ++i) slot = live.bound[i] == k ? i : slot;
      if (slot >= 0) {
        below[k] = live.below[slot];
      } else {
        unguessed[num_unguessed] = t[k];
        where[num_unguessed++] = k;
      }
    }
  }
  int64_t passed[kBounds];
  // up to four bounds per pass over the block (kBounds >= b: no pass of more bounds than a call can straddle)
  static_assert(kBoundsPerPass == 4, "the passes below are written for four bounds at most");
  for (int k = 0; k < num_unguessed; k += kBoundsPerPass) {
    const int batch = std::min(kBoundsPerPass, num_unguessed - k);
    if (batch == 1) count_below<1, kBytes>(keys, n, unguessed + k, passed + k);
    if (kBounds >= 2 && batch == 2) count_below<2, kBytes>(keys, n, unguessed + k, passed + k);
    if (kBounds >= 3 && batch == 3) count_below<3, kBytes>(keys, n, unguessed + k, passed + k);
    if (kBounds >= 4 && batch == 4) count_below<4, kBytes>(keys, n, unguessed + k, passed + k);
  }
  for (int k = 0; k < num_unguessed; ++k) below[where[k]] = passed[k];
  // The next block's guess: this block's straddled bounds, as many as there are slots, where that saves a pass over
  // the block; else none (the vector pass's compares would be extra work beside the same passes: AVX2's two slots
  // against three straddled bounds measured up to 13% slower).
  constexpr int kSlots = guess_slots<kBytes>();
  const auto passes = [](int bounds) { return (bounds + kBoundsPerPass - 1) / kBoundsPerPass; };
  const bool saves = num_straddled <= kSlots || passes(num_straddled - kSlots) < passes(num_straddled);
  const int guessed = saves ? std::min(num_straddled, kSlots) : 0;
  for (int j = 0; j < kMaxFormats; ++j) guess.bound[j] = static_cast<int8_t>(j < guessed ? straddled[j] : -1);

  out.nan = out.posinf = out.neginf = 0;
  out.zero = zeros;
  for (int f = 0; f < kFormats; ++f) {
    out.over[f] = n - below[3 * f];
    out.below[f] = below[3 * f + 1];
    out.at_zero[f] = below[3 * f + 2];
  }
  out.max_abs = static_cast<int32_t>(block_max);
  out.min_abs_nonzero = static_cast<int32_t>(any_nonzero ? min_key << kShift : kInfBits32);
  out.sumsq = block_sumsq;
  return true;
}

// The vector pass over a float32 block. Four vectors per step: their exponent bins are packed into one
// 64-byte store (element 16q + l of the step in byte 4l + q; the histogram does not care about order).
template <int kLive, int kBytes>
__attribute__((always_inline)) inline BlockScan scan_block32(const uint32_t* __restrict bits, int64_t n,
                                                             uint8_t* __restrict bins, LiveGuess& live) {
  AMPI_LANE_TYPES(kBytes);
  UintVec guess_key[kLive > 0 ? kLive : 1], guess_below[kLive > 0 ? kLive : 1] = {};
  for (int j = 0; j < kLive; ++j) guess_key[j] = UintVec{} + live.key[j];
  UintVec max_abs = {}, min_abs_minus_one = {};
  min_abs_minus_one -= 1u;
  DoubleVec sumsq = {};
  constexpr int kStep = 4 * kVectorWidth;
  static_assert((kSquaresPerFlush * kVectorWidth) % kStep == 0, "a flush group is whole steps");
  const int64_t full = n - n % kStep;
  for (int64_t group = 0; group < full; group += kSquaresPerFlush * kVectorWidth) {
    // Squares in float32 lanes for kSquaresPerFlush vectors, then added into float64 lanes: a lane's
    // float32 sum has at most kSquaresPerFlush terms, so its relative error stays below
    // kSquaresPerFlush * 2^-24 (about 1e-6).
    FloatVec squares = {};
    const int64_t group_end = std::min(full, group + kSquaresPerFlush * kVectorWidth);
    for (int64_t i = group; i < group_end; i += kStep) {
      UintVec packed;
      for (int q = 0; q < 4; ++q) {
        UintVec b;
        std::memcpy(&b, bits + i + q * kVectorWidth, sizeof b);
        const UintVec a = b & kAbsMask32;
        max_abs = a > max_abs ? a : max_abs;
        const UintVec minus_one = a - 1u;
        min_abs_minus_one = minus_one < min_abs_minus_one ? minus_one : min_abs_minus_one;
        for (int j = 0; j < kLive; ++j) add_below<kBytes, IntVec>(guess_below[j], a, guess_key[j]);
        const FloatVec v = (FloatVec)b;  // a vector cast reinterprets the bits; the sign does not matter
        squares += v * v;
        // The exponent field (bits 23..30 of a) moved to byte q of each lane.
        if (q == 0) packed = a >> kExponentShift32;
        if (q == 1) packed |= (a >> (kExponentShift32 - 8)) & 0x0000FF00u;
        if (q == 2) packed |= (a >> (kExponentShift32 - 16)) & 0x00FF0000u;
        if (q == 3) packed |= (a << 1) & 0xFF000000u;
      }
      std::memcpy(bins + i, &packed, sizeof packed);
    }
    sumsq += __builtin_convertvector(squares, DoubleVec);
  }
  BlockScan scan{0u, ~0u, 0.0};
  for (int l = 0; l < kVectorWidth; ++l) {
    scan.max_key = std::max(scan.max_key, max_abs[l]);
    scan.min_key_minus_one = std::min(scan.min_key_minus_one, min_abs_minus_one[l]);
    scan.sumsq += sumsq[l];
  }
  for (int j = 0; j < kLive; ++j) live.below[j] = lane_sum(guess_below[j]);
  for (int64_t i = full; i < n; ++i) {  // the last n % kStep elements, one by one
    const uint32_t a = bits[i] & kAbsMask32;
    scan.max_key = std::max(scan.max_key, a);
    scan.min_key_minus_one = std::min(scan.min_key_minus_one, a - 1u);
    const double v = static_cast<double>(bits_as_float32(a));
    scan.sumsq += v * v;
    bins[i] = static_cast<uint8_t>(a >> kExponentShift32);
    for (int j = 0; j < kLive; ++j) live.below[j] += a < live.key[j];
  }
  return scan;
}

// The vector pass over a bfloat16 block, on its 16-bit |bits| (32 lanes): extremes and bins need no
// widening; the squares take each half of the lanes as float32 (a zero low half: the exact value).
template <int kLive, int kBytes>
__attribute__((always_inline)) inline BlockScan scan_block16(const uint16_t* __restrict raw, int64_t n,
                                                             uint8_t* __restrict bins, LiveGuess& live) {
  AMPI_LANE_TYPES(kBytes);
  using SignedShortVec = typename Lanes<kBytes>::SignedShortVec;
  ShortVec guess_key[kLive > 0 ? kLive : 1], guess_below[kLive > 0 ? kLive : 1] = {};
  for (int j = 0; j < kLive; ++j) guess_key[j] = ShortVec{} + static_cast<uint16_t>(live.key[j]);  // below 2^15
  ShortVec max_abs = {}, min_abs_minus_one = {};
  min_abs_minus_one -= static_cast<uint16_t>(1);
  DoubleVec sumsq = {};
  constexpr int kStep = 2 * kShortLanes;
  constexpr int kFlush = kSquaresPerFlush * kVectorWidth;  // 8 vectors: 16 squares per float32 lane
  static_assert(kFlush % kStep == 0, "a flush group is whole steps");
  const int64_t full = n - n % kStep;
  for (int64_t group = 0; group < full; group += kFlush) {
    FloatVec squares = {};
    const int64_t group_end = std::min(full, group + kFlush);
    for (int64_t i = group; i < group_end; i += kStep) {
      ShortVec packed;
      for (int q = 0; q < 2; ++q) {
        ShortVec x;
        std::memcpy(&x, raw + i + q * kShortLanes, sizeof x);
        const ShortVec a = x & static_cast<uint16_t>(0x7FFF);
        max_abs = a > max_abs ? a : max_abs;
        const ShortVec minus_one = a - static_cast<uint16_t>(1);
        min_abs_minus_one = minus_one < min_abs_minus_one ? minus_one : min_abs_minus_one;
        for (int j = 0; j < kLive; ++j) add_below<kBytes, SignedShortVec>(guess_below[j], a, guess_key[j]);
        // Each 32-bit lane holds two bfloat16: the high one is a float32 as it stands but for its low
        // half (the neighbour's bits), the low one shifted up is a float32. Squares of both, exactly as
        // the widened values would give (a float32 square of each).
        const UintVec pair = (UintVec)x;
        const FloatVec high = (FloatVec)(pair & 0xFFFF0000u), low = (FloatVec)(pair << 16);
        squares += high * high;
        squares += low * low;
        if (q == 0) packed = a >> 7;  // the exponent field of a bfloat16's |bits|, in byte 2l ...
        if (q == 1) packed |= (a << 1) & static_cast<uint16_t>(0xFF00);  // ... and byte 2l + 1
      }
      std::memcpy(bins + i, &packed, sizeof packed);
    }
    sumsq += __builtin_convertvector(squares, DoubleVec);
  }
  BlockScan scan{0u, ~0u, 0.0};
  for (int l = 0; l < kShortLanes; ++l) {
    scan.max_key = std::max<uint32_t>(scan.max_key, max_abs[l]);
    // A lane's min of a - 1 is 0xFFFF when it saw only zeros: the top, like ~0u.
    const uint32_t m = min_abs_minus_one[l] == 0xFFFFu ? ~0u : min_abs_minus_one[l];
    scan.min_key_minus_one = std::min(scan.min_key_minus_one, m);
  }
  for (int l = 0; l < kVectorWidth; ++l) scan.sumsq += sumsq[l];
  for (int j = 0; j < kLive; ++j) live.below[j] = lane_sum(guess_below[j]);
  for (int64_t i = full; i < n; ++i) {
    const uint32_t a = raw[i] & 0x7FFFu;
    scan.max_key = std::max(scan.max_key, a);
    if (a != 0) scan.min_key_minus_one = std::min(scan.min_key_minus_one, a - 1u);
    const double v = static_cast<double>(bits_as_float32(a << 16));
    scan.sumsq += v * v;
    bins[i] = static_cast<uint8_t>(a >> 7);
    for (int j = 0; j < kLive; ++j) live.below[j] += a < live.key[j];
  }
  return scan;
}

// The vector pass of a block (bfloat16 keys when `raw` is given, else float32 bits), instantiated per number of
// guessed bounds (kLive <= guess_slots: one copy per count, whatever the call's formats).
template <int kLive, int kBytes>
__attribute__((always_inline)) inline BlockScan scan_block_with(const uint32_t* bits, const uint16_t* raw, int64_t n,
                                                                uint8_t* bins, LiveGuess& live) {
  return raw ? scan_block16<kLive, kBytes>(raw, n, bins, live) : scan_block32<kLive, kBytes>(bits, n, bins, live);
}
template <int kBytes>
__attribute__((always_inline)) inline BlockScan scan_block(const uint32_t* bits, const uint16_t* raw, int64_t n,
                                                           uint8_t* bins, LiveGuess& live) {
  constexpr int kSlots = guess_slots<kBytes>();
  switch (live.count) {
    case 0:
      return scan_block_with<0, kBytes>(bits, raw, n, bins, live);
    case 1:
      return scan_block_with<1, kBytes>(bits, raw, n, bins, live);
    case 2:
      return scan_block_with<std::min(2, kSlots), kBytes>(bits, raw, n, bins, live);
    case 3:
      return scan_block_with<std::min(3, kSlots), kBytes>(bits, raw, n, bins, live);
    default:
      return scan_block_with<kSlots, kBytes>(bits, raw, n, bins, live);
  }
}

// The common path's end and the full path, unrolled per format count.
template <int kFormats, int kBytes>
__attribute__((always_inline)) inline void finish_or_count_full(const uint32_t* bits, const uint16_t* raw, int64_t n,
                                                                const BlockScan& scan, uint8_t* bins,
                                                                const uint32_t (&t)[kMaxBounds], const LiveGuess& live,
                                                                const FormatBounds* bounds, BlockCounts& out,
                                                                uint32_t (&hist)[kHistCopies][kHistBins],
                                                                uint32_t* widened, StraddleGuess& guess) {
  if (raw) {
    if (finish_block<kFormats, kBytes>(raw, n, scan, bins, t, live, guess, out, hist)) return;
    for (int64_t i = 0; i < n; ++i) widened[i] = bf16_to_f32_bits(raw[i]);
    bits = widened;
  } else if (finish_block<kFormats, kBytes>(bits, n, scan, bins, t, live, guess, out, hist)) {
    return;
  }
  count_block32_full<kFormats, kBytes>(bits, n, bounds, out, hist);
}

// A block (bfloat16 keys when `raw` is given, `widened` receiving its float32 bits if it is off the common path;
// else float32 bits): the vector pass, then the common path's end, else every test on every element.
template <int kBytes>
__attribute__((always_inline)) inline void count_block_by_formats(const uint32_t* bits, const uint16_t* raw,
                                                                  int64_t n, const FormatBounds* bounds,
                                                                  int num_formats, BlockCounts& out,
                                                                  uint32_t (&hist)[kHistCopies][kHistBins],
                                                                  uint32_t* widened, const BlockKeys& keys,
                                                                  StraddleGuess& guess) {
  const uint32_t(&t)[kMaxBounds] = raw ? keys.bf16 : keys.f32;
  LiveGuess live = live_guess<kBytes>(guess, 3 * num_formats, t);
  alignas(64) uint8_t bins[kBlockElems + 64];  // room to pad the last vector of count_bins_in_window
  const BlockScan scan = scan_block<kBytes>(bits, raw, n, bins, live);
  switch (num_formats) {
    case 1:
      return finish_or_count_full<1, kBytes>(bits, raw, n, scan, bins, t, live, bounds, out, hist, widened, guess);
    case 2:
      return finish_or_count_full<2, kBytes>(bits, raw, n, scan, bins, t, live, bounds, out, hist, widened, guess);
    case 3:
      return finish_or_count_full<3, kBytes>(bits, raw, n, scan, bins, t, live, bounds, out, hist, widened, guess);
    default:
      return finish_or_count_full<4, kBytes>(bits, raw, n, scan, bins, t, live, bounds, out, hist, widened, guess);
  }
}

// The 64-byte lanes, cloned for AVX-512, AVX2 and baseline x86-64 (AMPI_CPU_CLONES, common/cpu_clones.h); the loader
// picks the best clone for the machine. A CPU with AVX2 and FMA but not the AVX-512 clones' features takes
// count_block_avx2 instead (32-byte lanes).
AMPI_CPU_CLONES void count_block_wide(const uint32_t* bits, const uint16_t* raw, int64_t n,
                                      const FormatBounds* bounds, int num_formats, BlockCounts& out,
                                      uint32_t (&hist)[kHistCopies][kHistBins], uint32_t* widened,
                                      const BlockKeys& keys, StraddleGuess& guess) {
  count_block_by_formats<kWideBytes>(bits, raw, n, bounds, num_formats, out, hist, widened, keys, guess);
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AMPI_TENSOR_STATS_AVX2 1
// For tests, set (to anything) in the environment: the first makes the cloned loops run where count_block_avx2
// would, the second makes count_block_avx2 run where the AVX-512 clones would; tests/test_histogram_paths.py runs
// a process of each on one machine and compares them, so every CI machine checks both widths it can run.
constexpr const char* kClonesOnlyVariable = "AMP_INSPECT_TEST_TENSOR_STATS_CLONES";
constexpr const char* kAvx2LanesVariable = "AMP_INSPECT_TEST_TENSOR_STATS_AVX2";

// Whether blocks take count_block_avx2: AVX2 and FMA, and not the AVX-512 clones (wide_lanes(), whose 64-byte types
// are one register there).
bool avx2_lanes() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         std::getenv(kClonesOnlyVariable) == nullptr &&
                         (std::getenv(kAvx2LanesVariable) != nullptr || !wide_lanes());
  return ok;
}

// The 32-byte lanes (see Lanes).
__attribute__((target("avx2,fma"))) void count_block_avx2(const uint32_t* bits, const uint16_t* raw, int64_t n,
                                                          const FormatBounds* bounds, int num_formats,
                                                          BlockCounts& out, uint32_t (&hist)[kHistCopies][kHistBins],
                                                          uint32_t* widened, const BlockKeys& keys,
                                                          StraddleGuess& guess) {
  count_block_by_formats<kAvx2Bytes>(bits, raw, n, bounds, num_formats, out, hist, widened, keys, guess);
}
#endif

// ---- widening 16-bit inputs to float32 bits, block by block (contiguous views) ----

// bfloat16: common/cpu_clones.h's widen_bf16, a shift vectorised per clone.

// float16 through the hardware conversion where the CPU has it (F16C, or AVX-512F for 16 at a time):
// vcvtph2ps is exact for every half, subnormals included (MXCSR.DAZ is ignored, the result is normal),
// and quiets a signalling NaN, which is still a NaN (|bits| > Inf, bin 255): no count changes. Elsewhere
// common/cpu_clones.h's widen_fp16, numerics.h's fp16_to_f32_bits on the bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target("avx512f"))) void widen_fp16_avx512(const uint16_t* src, int64_t n, uint32_t* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    // The zero-masked form with every lane kept: the plain one's GCC 12 form warns of an undefined start vector.
    const __m512 widened = _mm512_maskz_cvtph_ps(static_cast<__mmask16>(0xFFFF), h);
    _mm512_storeu_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_castps_si512(widened));
  }
  widen_fp16(src + i, n - i, dst + i);
}
__attribute__((target("avx,f16c"))) void widen_fp16_f16c(const uint16_t* src, int64_t n, uint32_t* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm256_castps_si256(_mm256_cvtph_ps(h)));
  }
  widen_fp16(src + i, n - i, dst + i);
}
#endif

using WidenFn = void (*)(const uint16_t*, int64_t, uint32_t*);
WidenFn pick_widen_fp16() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (__builtin_cpu_supports("avx512f")) return widen_fp16_avx512;
  if (__builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx")) return widen_fp16_f16c;
#endif
  return widen_fp16;
}
const WidenFn widen_fp16_fastest = pick_widen_fp16();

// A block of float32 bits, or a contiguous bfloat16 block (`raw`; `widened`, kBlockElems, receives its float32 bits
// if it is off the common path), in the lanes this CPU runs best.
void count_block(const uint32_t* bits, const uint16_t* raw, int64_t n, const FormatBounds* bounds, int num_formats,
                 BlockCounts& out, uint32_t (&hist)[kHistCopies][kHistBins], uint32_t* widened,
                 const BlockKeys& keys, StraddleGuess& guess) {
#ifdef AMPI_TENSOR_STATS_AVX2
  if (avx2_lanes()) return count_block_avx2(bits, raw, n, bounds, num_formats, out, hist, widened, keys, guess);
#endif
  count_block_wide(bits, raw, n, bounds, num_formats, out, hist, widened, keys, guess);
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
          const double v = bits_as_float64(a);
          sumsq += v * v;
        }
        // The histogram is over float32(v): a double beyond float32's range lands in bin 255.
        acc.hist[hist_bin(float64_bits_to_float32_bits(b))] += 1;
      });
  // Rounding to float32 is monotonic, so the rounded extreme is the extreme of the rounded values.
  acc.max_abs = std::max(acc.max_abs, float64_bits_to_float32_bits(max_abs));
  if (min_abs != kInfBits64) {
    acc.min_abs_nonzero =
        std::min(acc.min_abs_nonzero, float64_bits_to_float32_bits(min_abs));
  }
  acc.sumsq += sumsq;
}

// Turns elements [start, start + count) of a view into float32 bits of v, block by block, and counts them.
// `widen`, when given, turns a contiguous run of T into float32 bits at once (what to_bits does per element).
template <typename T, typename ToBits>
void count_chunk32(const TensorView& view, int64_t start, int64_t count, const StatsCall& call,
                   TensorAccumulator& acc, ToBits&& to_bits, void (*widen)(const T*, int64_t, uint32_t*) = nullptr) {
  alignas(64) uint32_t buffer[kBlockElems];
  uint32_t hist[kHistCopies][kHistBins] = {};
  const BlockKeys keys = block_keys(call.bounds, call.num_formats);
  const ElementReader<T> reader{static_cast<const T*>(view.data), view};
  const float scale = call.has_scale ? (call.scale_ptr ? *call.scale_ptr : call.scale_value) : 1.0f;
  for (int64_t done = 0; done < count; done += kBlockElems) {
    const int64_t n = std::min(kBlockElems, count - done);
    const uint32_t* bits = buffer;
    if constexpr (std::is_same<T, uint32_t>::value) {
      if (!call.has_scale && is_contiguous_view(view)) {
        bits = reinterpret_cast<const uint32_t*>(reader.base + start + done);  // float32 as stored: no copy
        BlockCounts block;
        count_block(bits, nullptr, n, call.bounds, call.num_formats, block, hist, nullptr, keys, acc.guess);
        add_block(acc, block, n, call.num_formats);
        continue;
      }
    }
    if constexpr (std::is_same<T, uint16_t>::value) {
      if (view.dtype == kBFloat16 && !call.has_scale && is_contiguous_view(view)) {
        BlockCounts block;
        count_block(nullptr, reader.base + start + done, n, call.bounds, call.num_formats, block, hist, buffer,
                    keys, acc.guess);
        add_block(acc, block, n, call.num_formats);
        continue;
      }
    }
    if (widen != nullptr && is_contiguous_view(view)) {
      widen(reader.base + start + done, n, buffer);
      if (call.has_scale) {
        for (int64_t i = 0; i < n; ++i) buffer[i] = scaled_float32_bits(buffer[i], scale);
      }
    } else if (call.has_scale) {
      reader.for_each(start + done, n, [&](int64_t i, T x) {
        buffer[i] = scaled_float32_bits(to_bits(x), scale);  // one float32 multiply, never flushed
      });
    } else {
      reader.for_each(start + done, n, [&](int64_t i, T x) { buffer[i] = to_bits(x); });
    }
    BlockCounts block;
    count_block(bits, nullptr, n, call.bounds, call.num_formats, block, hist, nullptr, keys, acc.guess);
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
      count_chunk32<uint16_t>(view, start, count, call, acc, [](uint16_t x) { return fp16_to_f32_bits(x); },
                              widen_fp16_fastest);
      break;
    case kBFloat16:
      count_chunk32<uint16_t>(view, start, count, call, acc, [](uint16_t x) { return bf16_to_f32_bits(x); },
                              widen_bf16);
      break;
    case kFloat64:
      if (call.has_scale) {  // v = float32(x) * scale: the float32 path after one rounding
        count_chunk32<uint64_t>(view, start, count, call, acc,
                                [](uint64_t x) { return float64_bits_to_float32_bits(x); });
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

// unscale_stats_: overwrites elements [start, start + count) of a view with x * inv_scale, computed as
// torch's unscale kernel does (float32 math rounded to the dtype; float64 math for float64). Runs right
// after the chunk was counted, while it is still in cache, so memory is read once and written once.
void unscale_chunk(const TensorView& view, int64_t start, int64_t count, float inv_scale) {
  void* base = const_cast<void*>(view.data);  // unscale_stats_ takes its tensors as mutable (Tensor(a!)[])
  switch (view.dtype) {
    case kFloat32: {
      float* p = static_cast<float*>(base);
      walk_offsets(view, start, count, [&](int64_t, int64_t o) { p[o] = p[o] * inv_scale; });
      break;
    }
    case kFloat16: {
      torch::headeronly::Half* p = static_cast<torch::headeronly::Half*>(base);
      walk_offsets(view, start, count, [&](int64_t, int64_t o) { p[o] = static_cast<float>(p[o]) * inv_scale; });
      break;
    }
    case kBFloat16: {
      torch::headeronly::BFloat16* p = static_cast<torch::headeronly::BFloat16*>(base);
      walk_offsets(view, start, count, [&](int64_t, int64_t o) { p[o] = static_cast<float>(p[o]) * inv_scale; });
      break;
    }
    case kFloat64: {
      double* p = static_cast<double*>(base);
      const double inv = inv_scale;
      walk_offsets(view, start, count, [&](int64_t, int64_t o) { p[o] = p[o] * inv; });
      break;
    }
  }
}

StatsOutputs run_cpu(const StatsCall& call) {
  StatsOutputs out = allocate_outputs(call.num_tensors, call.num_formats, Device(DeviceType::CPU));

  OutputSink sink;
  RawCounts empty;
  clear_counts(empty);
  sink.counts.assign(call.num_tensors, empty);
  sink.max_abs.assign(call.num_tensors, 0u);
  sink.min_abs_nonzero.assign(call.num_tensors, kInfBits32);
  sink.hist = static_cast<int64_t*>(out.hist.data_ptr());
  sink.sumsq = static_cast<double*>(out.sumsq.data_ptr());

  const int64_t num_views = static_cast<int64_t>(call.views.size());
  torch::stable::parallel_for(0, call.total_chunks, 1, [&](int64_t begin, int64_t end) {
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
      const int64_t count = std::min(call.chunk_elems, view.numel - start);
      count_chunk(view, start, count, call, acc);
      // Written even when inv_scale is 1: converting back to the dtype canonicalises NaN payloads, and
      // torch's kernel does that too, so the results stay bitwise identical.
      if (call.unscale) unscale_chunk(view, start, count, call.inv_scale_value);
    }
    if (current >= 0) sink.merge(call.views[current].out_row, acc);
  });

  int64_t* counts = static_cast<int64_t*>(out.counts.data_ptr());
  float* amax = static_cast<float*>(out.amax.data_ptr());
  float* amin = static_cast<float*>(out.amin_nonzero.data_ptr());
  const int columns = count_columns(call.num_formats);
  bool any_non_finite = false;
  for (int64_t row = 0; row < call.num_tensors; ++row) {
    const RawCounts& c = sink.counts[row];
    any_non_finite = any_non_finite || (c.nan + c.posinf + c.neginf) > 0;
    finalize_counts(c, call.num_formats, counts + row * columns);
    amax[row] = bits_as_float32(sink.max_abs[row]);
    amin[row] = bits_as_float32(sink.min_abs_nonzero[row]);
  }
  if (call.unscale && any_non_finite) *call.found_inf_ptr = 1.0f;
  return out;
}

// The boxed kernels (TORCH_BOX) take their arguments by value.
std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> tensor_stats_cpu(std::vector<Tensor> tensors,
                                                                    std::optional<Tensor> scale,
                                                                    std::optional<double> scale_value,
                                                                    std::vector<std::string> formats) {
  const StatsOutputs out = run_cpu(prepare_call(tensors, scale, scale_value, formats, kCpuChunkElems));
  return out.returned();
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> unscale_stats_cpu(std::vector<Tensor> tensors, Tensor inv_scale,
                                                                     Tensor found_inf, std::vector<std::string> formats) {
  StatsCall call = prepare_call(tensors, std::nullopt, std::nullopt, formats, kCpuChunkElems);
  prepare_unscale(call, tensors, inv_scale, found_inf);
  const StatsOutputs out = run_cpu(call);
  return out.returned();
}

}  // namespace
}  // namespace amp_inspect

STABLE_TORCH_LIBRARY_IMPL(amp_inspect, CPU, m) {
  m.impl("tensor_stats", TORCH_BOX(&amp_inspect::tensor_stats_cpu));
  m.impl("unscale_stats_", TORCH_BOX(&amp_inspect::unscale_stats_cpu));
}
