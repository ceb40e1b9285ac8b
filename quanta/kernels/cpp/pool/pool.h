// Integer pooling kernels: com.microsoft QLinearGlobalAveragePool, QLinearAveragePool
// (2-D), and ONNX MaxPool on int8 / uint8 tensors (2-D, no Indices output).
//
// ---------------------------------------------------------------------------------------
// Contract (T uint8_t or int8_t; NumPy twins in kernels/reference/ms_qlinear.py and
// nn_pool.py; float operations are float32, one IEEE operation each, in the order written;
// rne = round half to even; sat = clamp to T's range):
// ---------------------------------------------------------------------------------------
//
//   global average   acc = int32(Σ_hw x − zx·HW)          (wraps modulo 2^32, as the twin's
//                                                          int64 sum cast to int32)
//                    y   = sat(rne(clamp(f32(float32(acc)·m), qmin − zy, qmax − zy)) + zy)
//                    m   = f32(sx / f32(sy · f32(HW))), computed by the caller; a NaN
//                    product gives qmin (requant.py::requantize, eq. (6))
//   average (2-D)    total = Σ dq(x) over the window's positions inside the input, in
//                    row-major window order, starting from 0 (the twin also adds the
//                    padding's zeros: float32 no-ops, so the sums are the same)
//                    count = kh·kw (count_include_pad) else rows_in · cols_in (int64
//                    sizes min(start + k, D) − max(start, 0), as the twin)
//                    y = sat(rne(f32(f32(f32(total / f32(count)) / sy) + zy))), NaN -> qmin
//                    dq(x) = f32(sx · float32(x − zx))
//   max (2-D)        y = max over the window's positions inside the input (dilated), qmin
//                    when there is none (the twin pads with qmin)
//
// Geometry (output sizes, resolved pads; ceil_mode already applied) comes from the caller
// — the binder computes it with the twin's own geometry functions. x is NCHW (planes =
// N·C contiguous H×W images) except for the channels_last global average, x [N, HW, C].
//
// ISA variants: pool_<isa>.cc compile the same plane kernels (pool_kernels.h) with their
// -m flags; the loops are written so that GCC vectorises them without reassociating any
// float operation (each output lane keeps its own sequence; integer sums are exact).
//
// Threads: planes (or images, channels_last) are split into chunks; a plane's bytes do
// not depend on which thread computes it. No allocation: scratch is on the stack.
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {
namespace pool {

struct Geometry2d {
  int64_t planes;  // N·C
  int64_t h, w;    // input spatial size
  int64_t out_h, out_w;
  int64_t k_h, k_w;
  int64_t s_h, s_w;      // strides
  int64_t d_h, d_w;      // dilations (MaxPool; 1 for the average)
  int64_t pad_t, pad_l;  // begin pads (end pads are implied by out_h / out_w)
};

struct AverageParams {
  float sx, sy;
  int32_t zx, zy;
  bool count_include_pad;
};

// Plane kernels of one ISA (pool_<isa>.cc).
struct Kernels {
  uint32_t (*sum_u8)(const uint8_t* x, int64_t n);  // Σ x modulo 2^32
  uint32_t (*sum_s8)(const int8_t* x, int64_t n);
  // acc[c] += Σ_p x[p·stride + c] for p < rows, c < width (modulo 2^32)
  void (*sum_channels_u8)(const uint8_t* x, int64_t rows, int64_t stride, int64_t width, uint32_t* acc);
  void (*sum_channels_s8)(const int8_t* x, int64_t rows, int64_t stride, int64_t width, uint32_t* acc);
  void (*max_plane_u8)(const uint8_t* x, uint8_t* y, const Geometry2d& g);
  void (*max_plane_s8)(const int8_t* x, int8_t* y, const Geometry2d& g);
  void (*average_plane_u8)(const uint8_t* x, uint8_t* y, const Geometry2d& g, const AverageParams& p);
  void (*average_plane_s8)(const int8_t* x, int8_t* y, const Geometry2d& g, const AverageParams& p);
  // Channels-last max of output row oy of one image: x [H, W, C] -> y [OW, C]
  // (max_pool_2d_nhwc's contract).
  void (*max_row_nhwc_u8)(const uint8_t* x, uint8_t* y, const Geometry2d& g, int64_t c, int64_t oy);
  void (*max_row_nhwc_s8)(const int8_t* x, int8_t* y, const Geometry2d& g, int64_t c, int64_t oy);
  // float MaxPool of one plane at dilation 1, pads >= 0 (max_pool_f32_simd.h; scratch:
  // 2·hp·wp + 2·wp + 2·s_w floats, hp = (out_h − 1)·s_h + k_h, wp = (out_w − 1)·s_w + k_w,
  // and at least out_w·s_w + 16·s_w for the direct form of direct_max_pool windows);
  // null: the generic loops
  void (*max_plane_f32)(const float* x, float* y, const Geometry2d& g, float* scratch);
};

// Windows of a float MaxPool that stay inside the plane (no pads, no ceil_mode overhang,
// dilation 1) and do not overlap: Kernels::max_plane_f32's direct form, no bordered copy.
inline bool direct_max_pool(const Geometry2d& g) {
  return g.d_h == 1 && g.d_w == 1 && g.pad_t == 0 && g.pad_l == 0 && g.k_h <= g.s_h && g.k_w <= g.s_w &&
         (g.out_h - 1) * g.s_h + g.k_h <= g.h && (g.out_w - 1) * g.s_w + g.k_w <= g.w;
}

extern const Kernels kKernelsPortable;
extern const Kernels kKernelsAvx2;
extern const Kernels kKernelsAvx512Vnni;

// x [N, C, HW] (or [N, HW, C] with channels_last) -> y [N, C] (or [N, C] in the same
// order: one value per (n, c)).
template <typename T>
void qlinear_global_average_pool(const T* x, T* y, int64_t n, int64_t c, int64_t hw, bool channels_last, float m,
                                 int32_t zx, int32_t zy, int num_threads, Isa isa);

template <typename T>
void max_pool_2d(const T* x, T* y, const Geometry2d& g, int num_threads, Isa isa);

template <typename T>
void qlinear_average_pool_2d(const T* x, T* y, const Geometry2d& g, const AverageParams& p, int num_threads, Isa isa);

// Channels-last max pool (com.microsoft NhwcMaxPool): x [N, H, W, C] -> y [N, OH, OW, C],
// g.planes = N; each output pixel is the lane-wise max over the window's positions
// inside the input (dilated), qmin when there is none. Each output pixel keeps its C
// contiguous channels in registers (a vector of 64 or 32 channels at a time, the tail
// masked) over the window's taps and is stored once (Kernels::max_row_nhwc_*; integer max
// is exact in any order). Threads: output rows (n, oy) split into chunks; no allocation.
template <typename T>
void max_pool_2d_nhwc(const T* x, T* y, const Geometry2d& g, int64_t channels, int num_threads, Isa isa);

// Float MaxPool (ONNX MaxPool on float32, NCHW, 2-D, no Indices output; twin
// nn_pool.max_pool): y = the maximum over the window's positions inside the input
// (dilated), −inf when there is none (the twin pads with −inf). Exact: max only selects.
// A NaN in the window gives NaN (as the twin's np.max); the sign of a zero maximum among
// +0 and −0 is not pinned. Windows that overlap vertically (k_h > s_h, k_w > 1) run
// separably: one pass per kx over every input row (its row maxima), then per output row
// one pass per valid ky over those; otherwise per output row one pass per valid (ky, kx)
// over the row's columns (a strided max the compiler vectorises). At dilation 1 the
// AVX2 and AVX-512 kernels take each plane whole (Kernels::max_plane_f32) from a
// −inf-bordered copy: at stride 1 (SPP / SPPF blocks) the row maxima as one loop over the
// flattened copy, then the column maxima per output row, so a plane narrower than a
// vector does not leave most lanes empty; at other strides with overlapping windows
// (ResNet stems' 3x3 stride 2) per output row the column maxima over its k_h rows, split
// into s_w phases so that every tap of the row's windows is a contiguous vector.
// Non-overlapping windows (2x2 stride 2) keep the generic loops. Threads take chunks of
// planes.
void max_pool_2d_f32(const float* x, float* y, const Geometry2d& g, int num_threads, Isa isa);

// Float AveragePool (ONNX AveragePool on float32, NCHW, 2-D; twin nn_pool.average_pool,
// docs/float-ops.md (AP1)-(AP3)): the window's K = k_h·k_w positions in row-major order
// are the elements of a sum16 row, (R1)-(R3): position k adds into lane k mod 16 (a pad
// or overhang position adds +0, which changes no lane: a lane starts at +0 and is never
// −0, so it is skipped), then the fixed tree; y = f32(s / f32(count)), count the window
// positions inside [−lo_pad, size + hi_pad) per axis, where the pads are the explicit
// ones with count_include_pad and 0 without. The 16 lanes are arrays over the output
// row, so each vector operation advances 8 or 16 outputs by one step of their own
// sums. pad_b, pad_r: the end pads (the count's extent). Threads take chunks of planes.
void average_pool_2d_f32(const float* x, float* y, const Geometry2d& g, int64_t pad_b, int64_t pad_r,
                         bool count_include_pad, int num_threads);

}  // namespace pool
}  // namespace quanta
