// Float32 kernels that reproduce two of ONNX Runtime's CPU spatial operators operation by
// operation, for the float islands of files ORT's quantizer wrote (docs/float-ops.md):
// quanta::OrtResizeLinear (ORT's bilinear Resize) and quanta::MlasAveragePool in MlasPool's
// vector and generic orders.
//
// ---------------------------------------------------------------------------------------
// Contract (NumPy twins: kernels/reference/ort_resize.py, mlas_pool.py). Every float
// operation is one float32 IEEE operation in the order written (no FMA: -ffp-contract=off),
// so every ISA variant gives the twin's bytes.
// ---------------------------------------------------------------------------------------
//
//   resize   (RB1) the taps of each output row i (y1, y2, dy1, dy2) and column j (x1, x2,
//            dx1, dx2), computed by the caller with the twin's ort_bilinear_axis
//            (ResizeTaps; indices inside the input, checked by the binding)
//            (RB2) w22 = f32(dx2_j · dy2_i), w12 = f32(dx1_j · dy2_i),
//                  w21 = f32(dx2_j · dy1_i), w11 = f32(dx1_j · dy1_i)
//            (RB3) y = f32(f32(f32(f32(w22 · a) + f32(w12 · b)) + f32(w21 · c)) + f32(w11 · d)),
//                  a = x[y1, x1], b = x[y1, x2], c = x[y2, x1], d = x[y2, x2]
//   average  (AP-M2) the vector order of a 2-D pool: per window column, its rows summed
//            from the first row's value (a row in the padding is −0), then the column sums
//            from the first column's (a column in the padding is +0, every row of it)
//            (AP-M3) the generic order: m = +0, then m = f32(m + x) over the window's
//            positions inside the input, row-major (a padded position is skipped: the twin
//            adds −0 there, which changes no sum that starts from +0)
//            (AP-M4) y = f32(m / count): count = f32(Π kernel) (count_include_pad), else
//            the float32 product over the axes, in order, of each axis's positions inside
//            the input, min(start + k, size) − max(start, 0) (exact small integers)
//
// Vectorisation without reordering: the resize gathers the (RB1) columns of each input row
// once (c1[j] = x[r, x1_j], c2[j] = x[r, x2_j]; AVX2: vgatherdps) into one of two row slots
// (y1 and y2 never decrease from one output row to the next, so two slots hold what the
// next row reads or one of its rows), then runs (RB2)-(RB3) over contiguous rows, each
// column its own sequence. The generic average keeps 8 planes' window sums in 8
// independent chains (every plane has the same windows); the vector average sums each
// window column once per output row and the columns per output, output by output in
// vector lanes. Every sum stays one sequence in the contract's order.
//
// Threads: output rows (resize: plane × row) or blocks of 8 planes (average) are split
// into chunks; an output is computed by the same instructions whichever thread runs it,
// so the bytes do not depend on num_threads. Buffers are owned by the caller; the drivers
// allocate the average's count table per call and, per thread chunk, the resize's two
// gathered row slots and the vector average's column sums.
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {
namespace ort_spatial {

// (RB1) of both axes: n_h rows and n_w columns of taps.
struct ResizeTaps {
  int64_t n_h, n_w;
  const int32_t* y1;  // [n_h] first and second input row
  const int32_t* y2;
  const float* dy1;  // [n_h] distances (RB1)
  const float* dy2;
  const int32_t* x1;  // [n_w] first and second input column
  const int32_t* x2;
  const float* dx1;  // [n_w]
  const float* dx2;
};

// A pool of 1-3 spatial axes, stored as 3 (leading axes of size 1, kernel 1, stride 1,
// pad 0 for the missing ones, which keeps the row-major order of (AP-M3)).
struct PoolGeometry {
  int64_t planes;      // N·C
  int64_t size[3];     // input spatial sizes
  int64_t out[3];      // output spatial sizes (floor, every one >= 1)
  int64_t kernel[3];   // window extents
  int64_t strides[3];  // window strides
  int64_t pads[3];     // begin pads (end pads are implied by out)
};

// Kernels of one ISA (ort_spatial_<isa>.cc).
struct Kernels {
  // (RB1)'s columns of one input row: c1[j] = row[x1_j], c2[j] = row[x2_j], j < n_w.
  void (*resize_gather)(const float* row, const ResizeTaps& t, float* c1, float* c2);
  // (RB2)-(RB3) of one output row (n_w outputs) from the gathered rows y1 (a1, b1) and y2 (a2, b2).
  void (*resize_combine)(const float* a1, const float* b1, const float* a2, const float* b2, float dy1, float dy2,
                         const ResizeTaps& t, float* y);
  // (AP-M3) of planes [p_begin, p_end) (consecutive, in_plane floats apart): m of every
  // output position, then (AP-M4) with count[o] (o the output position, row-major).
  void (*average_planes)(const float* x, float* y, const PoolGeometry& g, const float* count, int64_t p_begin,
                         int64_t p_end);
  // (AP-M2) of a 2-D pool, the same arguments.
  void (*average_planes_vector)(const float* x, float* y, const PoolGeometry& g, const float* count, int64_t p_begin,
                                int64_t p_end);
};

extern const Kernels kKernelsPortable;
extern const Kernels kKernelsAvx2;

// x [planes, h, w] -> y [planes, n_h, n_w], (RB1)-(RB3).
void ort_resize_linear(const float* x, float* y, int64_t planes, int64_t h, int64_t w, const ResizeTaps& t,
                       int num_threads, Isa isa);

// x [planes, size...] -> y [planes, out...]: (AP-M3)-(AP-M4), or with `vector` (a 2-D pool,
// axis 0 of g of size 1) (AP-M2), (AP-M4).
void mlas_average_pool(const float* x, float* y, const PoolGeometry& g, bool count_include_pad, bool vector,
                       int num_threads, Isa isa);

}  // namespace ort_spatial
}  // namespace quanta
