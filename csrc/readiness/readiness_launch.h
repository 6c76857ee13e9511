// readiness_launch.h: what the host hands the CUDA kernels of amp_inspect::format_readiness
// (readiness_kernels.cuh) for one call, the work geometry both sides agree on, and the launcher of their GPU build.
// Torch-free and CUDA-free: included by the host side (readiness_call.h, for the CUDA op and the emulated op) and by
// the kernels (through nvcc, or through the host compiler with cuda_emu.h in front).
//
// Work geometry. Blocks of every recipe run along the last dimension, so the kernel walks rows. A lane holds
// kReadinessGroupElems (8) contiguous elements of one row (one 16-byte load of fp16/bf16, two of fp32): a
// 16-, 32- or 128-element block is then 2, 4 or 16 neighbouring lanes, and its amax is a butterfly of
// __shfl_xor_sync over them. A "task" is what one warp does in one step:
//   - a row of at least 32 groups (256 elements) is cut into tiles of 32 groups, one task per tile (256 is a
//     multiple of every block size, so no block straddles two tasks);
//   - shorter rows are packed, 32 / P rows per task, each row on P lanes, P the smallest power of two >= its
//     groups: rows start on lane multiples of P, so a butterfly over offsets < P never leaves its row, and a
//     row shorter than a block is that row's one (short) block.
// A row whose length is not a multiple of 8 ends in a lane holding fewer than 8 elements: the rest of its
// registers are +0, which adds nothing to any count or sum (0 quantizes to 0 with no error), and its blocks
// end where the row ends.
#pragma once

#include <cstdint>

#include "common/numerics.h"
#include "readiness/readiness.h"  // the recipe table, the output columns

namespace amp_inspect {

constexpr int kReadinessWarpLanes = 32;
constexpr int kReadinessGroupElems = 8;  // contiguous elements per lane
constexpr int64_t kReadinessTileGroups = kReadinessWarpLanes;  // groups of a row per task, for long rows
// Tasks per work chunk on the GPU: a block takes a contiguous run of chunks (never crossing a tensor), so the
// chunk is the unit work is dealt out in. 16 tasks are 2 per warp of a 256-thread block, at most 4096 elements.
constexpr int64_t kReadinessChunkTasks = 16;
// Tensors per launch, described in the kernel's own parameters (no device table to copy, so a call is also
// safe under CUDA graph capture); a call of more tensors takes several launches. 16 views keep the parameters
// well under the 4 KB every architecture and driver accepts.
constexpr int kReadinessInlineViews = 16;
// A call asks each recipe of the table at most once.
constexpr int kReadinessMaxRecipes = kNumRecipes;

// One nonempty tensor of a call, contiguous, with its work geometry.
struct ReadinessKernelView {
  const void* data;
  int64_t row_length;     // elements per row: the last dim (1 for a 0-d tensor)
  int64_t rows;           // numel / row_length
  int64_t tiles_per_row;  // tasks per row: ceil(groups / 32) when a row fills a warp, else 1
  int64_t rows_per_task;  // rows a task covers: 32 / lanes_per_row (1 when tiles_per_row > 1)
  int64_t tasks;          // warp tasks of the whole tensor
  int64_t first_chunk;    // its first chunk within its launch
  int64_t out_row;        // its row of the outputs
  int32_t lanes_per_row;  // P: lanes a row (or a tile of one) occupies, a power of two <= 32
  int32_t dtype;          // InputDtype: kFloat32, kFloat16 or kBFloat16
};

// Fills the geometry of a contiguous tensor of `numel` > 0 elements whose rows hold `row_length` > 0.
inline void set_readiness_geometry(ReadinessKernelView& v, int64_t numel, int64_t row_length) {
  v.row_length = row_length;
  v.rows = numel / row_length;
  const int64_t groups = (row_length + kReadinessGroupElems - 1) / kReadinessGroupElems;
  if (groups >= kReadinessTileGroups) {
    v.lanes_per_row = kReadinessWarpLanes;
    v.tiles_per_row = (groups + kReadinessTileGroups - 1) / kReadinessTileGroups;
    v.rows_per_task = 1;
    v.tasks = v.rows * v.tiles_per_row;
  } else {
    int32_t lanes = 1;
    while (lanes < groups) lanes *= 2;
    v.lanes_per_row = lanes;
    v.tiles_per_row = 1;
    v.rows_per_task = kReadinessWarpLanes / lanes;
    v.tasks = (v.rows + v.rows_per_task - 1) / v.rows_per_task;
  }
}

AMPI_HD int64_t readiness_chunks(const ReadinessKernelView& v, int64_t chunk_tasks) {
  return (v.tasks + chunk_tasks - 1) / chunk_tasks;
}

// One call, ready to launch.
struct ReadinessLaunchPlan {
  const ReadinessKernelView* views;  // host memory, the nonempty tensors grouped by dtype (one launch per run)
  int64_t num_views;
  int64_t num_tensors;  // rows of the outputs, empty tensors included
  int64_t chunk_tasks;
  int32_t num_recipes;
  int32_t slot_of_recipe[kReadinessMaxRecipes];  // output slot of each table recipe, -1 where not asked
  bool tensor_scaled_asked;  // a recipe that needs the tensor amax (Recipe.needs_tensor_amax) is asked
  const float* tensor_amax;  // device memory [T], or null: measured by the kernels
  // Outputs, device memory, zeroed (and amax filled) by the launch sequence.
  int64_t* counts;
  double* sums;
  float* amax;
};

// The GPU build of the kernels (readiness_cuda.cu, by nvcc), which the CUDA op calls: zeroes the outputs (or copies
// the given tensor amax), measures the tensor amax where the plan needs it first, and launches the quantization pass
// on `stream` (the device's current stream as the C shim hands it, a cudaStream_t). Asynchronous: no host sync.
void launch_format_readiness(const ReadinessLaunchPlan& plan, int device_index, void* stream);

}  // namespace amp_inspect
