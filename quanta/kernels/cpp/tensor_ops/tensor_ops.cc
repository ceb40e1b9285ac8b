// Drivers of the tensor_ops kernels (contract: tensor_ops.h): thread chunks, broadcast
// iteration, ISA selection; the byte-moving kernels (take_axis, copy_strided), which need
// no ISA variant (memcpy of contiguous runs).
#include "tensor_ops/tensor_ops.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace tensor_ops {

const Kernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return kernels_avx512vnni();
    case Isa::kAvx2: return kernels_avx2();
    default: return kernels_portable();
  }
}

int64_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF64:
    case DType::kI64: return 8;
    default: return 1;
  }
}

namespace {

// Elements per thread chunk (the float_ops stream grain): a chunk costs far more than
// claiming it.
constexpr int64_t kGrain = int64_t{1} << 14;
// Bytes per chunk of the byte-moving kernels.
constexpr int64_t kByteGrain = int64_t{1} << 16;

int64_t rows_per_chunk(int64_t row_elems, int64_t grain) {
  return std::max<int64_t>(1, grain / std::max<int64_t>(row_elems, 1));
}

}  // namespace

void unary_f32(UnaryF32 op, const float* x, float* y, int64_t n, const UnaryParams& p, int num_threads, Isa isa) {
  const UnaryF32Fn run = kernels_for(isa).unary_f32[static_cast<int>(op)];
  qgemm::parallel_ranges(num_threads, n, kGrain, [&](int64_t b, int64_t e) { run(x + b, y + b, e - b, p); });
}

void clip_int(DType t, const void* x, void* y, int64_t n, int64_t lo, int64_t hi, bool has_lo, bool has_hi,
              int num_threads, Isa isa) {
  const ClipIntFn run = kernels_for(isa).clip_int[static_cast<int>(t)];
  if (run == nullptr) throw std::invalid_argument("clip: no integer kernel for this element type");
  const int64_t size = dtype_size(t);
  const auto* xb = static_cast<const uint8_t*>(x);
  auto* yb = static_cast<uint8_t*>(y);
  qgemm::parallel_ranges(num_threads, n, kGrain, [&](int64_t b, int64_t e) {
    run(xb + b * size, yb + b * size, e - b, lo, hi, has_lo, has_hi);
  });
}

void cast(DType from, DType to, const void* x, void* y, int64_t n, int num_threads, Isa isa) {
  const CastFn run = kernels_for(isa).cast[static_cast<int>(from)][static_cast<int>(to)];
  if (run == nullptr) throw std::invalid_argument("cast: no kernel for this pair of element types");
  const int64_t fs = dtype_size(from), ts = dtype_size(to);
  const auto* xb = static_cast<const uint8_t*>(x);
  auto* yb = static_cast<uint8_t*>(y);
  qgemm::parallel_ranges(num_threads, n, kGrain, [&](int64_t b, int64_t e) { run(xb + b * fs, yb + b * ts, e - b); });
}

void broadcast_op(int kind, int op, DType t, const void* a, const void* b, void* c, const broadcast::Shape& s,
                  int num_threads, Isa isa) {
  const Kernels& k = kernels_for(isa);
  RunFn run = nullptr;
  const int ti = static_cast<int>(t);
  if (kind == 0 && op >= 0 && op < kNumBinaryInt) run = k.binary_int[ti][op];
  if (kind == 1 && op >= 0 && op < 5) run = k.compare[ti][op];
  if (kind == 2 && op >= 0 && op < 3 && t == DType::kBool) run = k.logic[op];
  if (run == nullptr) throw std::invalid_argument("broadcast op: no kernel for this operation and element type");
  if (broadcast::empty(s)) return;
  const broadcast::Plan plan = broadcast::make_plan(s);
  const int64_t in_size = dtype_size(t);
  const int64_t out_size = kind == 0 ? in_size : 1;
  // for_each_run walks typed pointers; bytes with the element size folded into the
  // offsets keep one instantiation for every type
  const auto* ab = static_cast<const uint8_t*>(a);
  const auto* bb = static_cast<const uint8_t*>(b);
  auto* cb = static_cast<uint8_t*>(c);
  qgemm::parallel_ranges(num_threads, plan.total(), kGrain, [&](int64_t begin, int64_t end) {
    // element offsets, as for_each_run computes them, scaled by the element sizes
    const int64_t* none = nullptr;
    (void)none;
    int64_t o = begin / plan.inner;
    int64_t i0 = begin - o * plan.inner;
    int64_t idx[broadcast::kMaxRank];
    int64_t a_off = 0, b_off = 0;
    for (int d = plan.rank - 1; d >= 0; --d) {
      idx[d] = o % plan.n[d];
      o /= plan.n[d];
      a_off += idx[d] * plan.as[d];
      b_off += idx[d] * plan.bs[d];
    }
    int64_t pos = begin;
    while (pos < end) {
      const int64_t len = std::min(end - pos, plan.inner - i0);
      run(ab + (a_off + i0 * plan.a_step) * in_size, plan.a_step, bb + (b_off + i0 * plan.b_step) * in_size,
          plan.b_step, cb + pos * out_size, len);
      pos += len;
      i0 = 0;
      for (int d = plan.rank - 1; d >= 0; --d) {
        ++idx[d];
        a_off += plan.as[d];
        b_off += plan.bs[d];
        if (idx[d] < plan.n[d]) break;
        a_off -= idx[d] * plan.as[d];
        b_off -= idx[d] * plan.bs[d];
        idx[d] = 0;
      }
    }
  });
}

void reduce_rows(Reduce op, const float* x, int64_t rows, int64_t d, float* y, int num_threads, Isa isa) {
  const ReduceFn run = kernels_for(isa).reduce[static_cast<int>(op)];
  qgemm::parallel_ranges(num_threads, rows, rows_per_chunk(d, kGrain),
                         [&](int64_t b, int64_t e) { run(x + b * d, e - b, d, y + b); });
}

void reduce_middle(Reduce op, const float* x, int64_t outer, int64_t d, int64_t inner, float* y, int num_threads,
                   Isa isa) {
  const ReduceMiddleFn run = kernels_for(isa).reduce_middle[static_cast<int>(op)];
  // column tiles of at most kMiddleTile (one tile: the flat run over whole blocks); more
  // when the slabs are fewer than the threads and the work is worth splitting
  int64_t tiles = (inner + kMiddleTile - 1) / kMiddleTile;
  if (num_threads > 1 && outer * tiles < num_threads && outer * d * inner >= 2 * kGrain) {
    tiles = std::min<int64_t>((num_threads + outer - 1) / outer, (inner + 15) / 16);
  }
  const int64_t width = ((inner + tiles - 1) / tiles + 15) / 16 * 16;
  tiles = (inner + width - 1) / width;
  const int64_t tile_width = tiles == 1 ? inner : width;
  qgemm::parallel_ranges(num_threads, outer * tiles, rows_per_chunk(d * tile_width, kGrain), [&](int64_t b, int64_t e) {
    for (int64_t u = b; u < e; ++u) {
      const int64_t o = u / tiles, c0 = (u % tiles) * tile_width;
      run(x + o * d * inner, d, inner, c0, std::min(c0 + tile_width, inner), y + o * inner);
    }
  });
}

void reduce_rows_int(ReduceInt op, DType t, const void* x, int64_t rows, int64_t d, void* y, int num_threads, Isa isa) {
  const ReduceIntFn run = kernels_for(isa).reduce_int[static_cast<int>(t)][static_cast<int>(op)];
  if (run == nullptr) throw std::invalid_argument("reduce_rows_int: no kernel for this element type");
  const int64_t size = dtype_size(t);
  const auto* xb = static_cast<const uint8_t*>(x);
  auto* yb = static_cast<uint8_t*>(y);
  qgemm::parallel_ranges(num_threads, rows, rows_per_chunk(d, kGrain),
                         [&](int64_t b, int64_t e) { run(xb + b * d * size, e - b, d, yb + b * size); });
}

void resize_axis(const double* x, int64_t outer, int64_t n, int64_t inner, const int64_t* taps, const double* w,
                 int64_t o, int64_t t, double* y, int num_threads, Isa isa) {
  const ResizeAxisFn run = kernels_for(isa).resize_axis;
  qgemm::parallel_ranges(num_threads, outer, rows_per_chunk(o * inner * t, kGrain), [&](int64_t b, int64_t e) {
    run(x + b * n * inner, e - b, n, inner, taps, w, o, t, y + b * o * inner);
  });
}

void resize_2d_f32(const float* x, int64_t planes, int64_t h, int64_t w, int64_t lanes, bool rows_first,
                   const int64_t* taps_a, const double* w_a, int64_t o_a, int64_t t_a, const int64_t* taps_b,
                   const double* w_b, int64_t o_b, int64_t t_b, float* y, int num_threads, Isa isa) {
  // `lanes` values share each (row, column) position: 1 for an NCHW plane, 16 for an
  // NCHW16c block's [H, W, 16]; each lane runs the same chain as a plane of its own
  const int64_t oh = rows_first ? o_a : o_b, ow = rows_first ? o_b : o_a, rw = w * lanes;
  const int64_t grain = rows_per_chunk(oh * ow * lanes * (t_a + t_b), kGrain);
  if (rows_first) {
    // Output row by output row: the row step (resize_axis_run's order: the first product,
    // then + each further product) into one row of doubles, then the column step of that
    // row and the rounding to float32. The conversion of x to double is exact, so reading
    // x as float here equals reading its double copy.
    qgemm::parallel_ranges(num_threads, planes, grain, [&](int64_t b, int64_t e) {
      std::vector<double> row(static_cast<size_t>(rw));
      double* r = row.data();
      for (int64_t p = b; p < e; ++p) {
        const float* xp = x + p * h * rw;
        float* yp = y + p * oh * ow * lanes;
        for (int64_t q = 0; q < oh; ++q) {
          const int64_t* tq = taps_a + q * t_a;
          const double* wq = w_a + q * t_a;
          const float* s0 = xp + tq[0] * rw;
          for (int64_t c = 0; c < rw; ++c) r[c] = static_cast<double>(s0[c]) * wq[0];
          for (int64_t k = 1; k < t_a; ++k) {
            const float* sk = xp + tq[k] * rw;
            const double wk = wq[k];
            for (int64_t c = 0; c < rw; ++c) r[c] = r[c] + static_cast<double>(sk[c]) * wk;
          }
          float* yq = yp + q * ow * lanes;
          for (int64_t j = 0; j < ow; ++j) {
            const int64_t* tj = taps_b + j * t_b;
            const double* wj = w_b + j * t_b;
            float* yj = yq + j * lanes;
            for (int64_t l = 0; l < lanes; ++l) {
              double acc = r[tj[0] * lanes + l] * wj[0];
              for (int64_t k = 1; k < t_b; ++k) acc = acc + r[tj[k] * lanes + l] * wj[k];
              yj[l] = static_cast<float>(acc);
            }
          }
        }
      }
    });
    return;
  }
  // columns first (an `axes` attribute that lists the last axis first): the plane's rows
  // resized along w into a plane of doubles, then the row step, as resize_axis would
  const ResizeAxisFn run = kernels_for(isa).resize_axis;
  qgemm::parallel_ranges(num_threads, planes, grain, [&](int64_t b, int64_t e) {
    std::vector<double> xd(static_cast<size_t>(h * rw)), md(static_cast<size_t>(h * ow * lanes)),
        yd(static_cast<size_t>(oh * ow * lanes));
    for (int64_t p = b; p < e; ++p) {
      const float* xp = x + p * h * rw;
      for (int64_t i = 0; i < h * rw; ++i) xd[i] = xp[i];
      run(xd.data(), h, w, lanes, taps_a, w_a, o_a, t_a, md.data());        // [h, w, L] -> [h, ow, L]
      run(md.data(), 1, h, o_a * lanes, taps_b, w_b, o_b, t_b, yd.data());  // [1, h, ow·L] -> [1, oh, ow·L]
      float* yp = y + p * oh * ow * lanes;
      for (int64_t i = 0; i < oh * ow * lanes; ++i) yp[i] = static_cast<float>(yd[i]);
    }
  });
}

void batch_norm(const float* x, float* y, int64_t rows, int64_t inner, int64_t channels, const float* m, const float* d,
                const float* g, const float* b, int num_threads, Isa isa) {
  const BatchNormFn run = kernels_for(isa).batch_norm;
  qgemm::parallel_ranges(num_threads, rows, rows_per_chunk(inner, kGrain), [&](int64_t lo, int64_t hi) {
    run(x + lo * inner, y + lo * inner, hi - lo, inner, channels, m, d, g, b, lo);
  });
}

void acc_to_float(const int32_t* acc, float* y, int64_t rows, int64_t inner, int64_t channels, const int32_t* bias,
                  const float* scale, const float* fbias, int num_threads, Isa isa) {
  const AccToFloatFn run = kernels_for(isa).acc_to_float;
  qgemm::parallel_ranges(num_threads, rows, rows_per_chunk(inner, kGrain), [&](int64_t lo, int64_t hi) {
    run(acc + lo * inner, y + lo * inner, hi - lo, inner, channels, bias, scale, fbias, lo);
  });
}

namespace {

// take_axis rows of one element of a fixed size: a typed load / store instead of a
// memcpy call per element (nearest Resize along the last axis).
template <typename T>
void take_elements(const uint8_t* x, int64_t n, const int64_t* idx, int64_t m, uint8_t* y, int64_t begin, int64_t end) {
  const T* xs = reinterpret_cast<const T*>(x);
  T* ys = reinterpret_cast<T*>(y);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t a = r / m;
    const T* src = xs + a * n;
    T* dst = ys + a * m;
    const int64_t q0 = r - a * m;
    const int64_t q1 = std::min(m, q0 + (end - r));
    for (int64_t q = q0; q < q1; ++q) dst[q] = src[idx[q]];
    r += q1 - q0 - 1;
  }
}

}  // namespace

void take_axis(const uint8_t* x, int64_t outer, int64_t n, int64_t inner_bytes, const int64_t* idx, int64_t m,
               uint8_t* y, int num_threads) {
  const int64_t rows = outer * m;
  const int64_t grain = rows_per_chunk(inner_bytes, kByteGrain);
  if (inner_bytes == 1 || inner_bytes == 2 || inner_bytes == 4 || inner_bytes == 8) {
    qgemm::parallel_ranges(num_threads, rows, grain * 4, [&](int64_t b, int64_t e) {
      switch (inner_bytes) {
        case 1: take_elements<uint8_t>(x, n, idx, m, y, b, e); break;
        case 2: take_elements<uint16_t>(x, n, idx, m, y, b, e); break;
        case 4: take_elements<uint32_t>(x, n, idx, m, y, b, e); break;
        default: take_elements<uint64_t>(x, n, idx, m, y, b, e); break;
      }
    });
    return;
  }
  qgemm::parallel_ranges(num_threads, rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t a = r / m, q = r - a * m;
      std::memcpy(y + r * inner_bytes, x + (a * n + idx[q]) * inner_bytes, static_cast<size_t>(inner_bytes));
    }
  });
}

namespace {

// d[i·SW + j] = s[i] for i < w, j < SW (a compile-time factor: the 2x of YOLO necks, whose
// loop the compiler turns into unpack-and-store).
template <typename T, int SW>
void widen_row_fixed(const T* __restrict s, int64_t w, T* __restrict d) {
  for (int64_t i = 0; i < w; ++i) {
    for (int j = 0; j < SW; ++j) d[i * SW + j] = s[i];
  }
}

// An element of N bytes moved as one (an NCHW16c pixel's 16 floats: 64 bytes).
template <int N>
struct Bytes {
  uint8_t b[N];
};

template <typename T>
void widen_row(const uint8_t* src, int64_t w, int64_t sw, uint8_t* dst) {
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  if (sw == 1) return static_cast<void>(std::memcpy(d, s, static_cast<size_t>(w) * sizeof(T)));
  if (sw == 2) return widen_row_fixed<T, 2>(s, w, d);
  if (sw == 4) return widen_row_fixed<T, 4>(s, w, d);
  for (int64_t i = 0; i < w; ++i) {
    for (int64_t j = 0; j < sw; ++j) d[i * sw + j] = s[i];
  }
}

}  // namespace

void repeat_2d(const uint8_t* x, int64_t planes, int64_t h, int64_t w, int64_t elem, int64_t sh, int64_t sw, uint8_t* y,
               int num_threads) {
  const int64_t in_row = w * elem, out_row = in_row * sw;
  qgemm::parallel_ranges(num_threads, planes * h, rows_per_chunk(out_row * sh, kByteGrain), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      // input row r = (p, iy) gives output rows p·h·sh + iy·sh + k, k < sh: r·sh + k
      uint8_t* first = y + r * sh * out_row;
      const uint8_t* src = x + r * in_row;
      switch (elem) {
        case 1: widen_row<uint8_t>(src, w, sw, first); break;
        case 2: widen_row<uint16_t>(src, w, sw, first); break;
        case 4: widen_row<uint32_t>(src, w, sw, first); break;
        case 8: widen_row<uint64_t>(src, w, sw, first); break;
        case 16: widen_row<Bytes<16>>(src, w, sw, first); break;
        case 32: widen_row<Bytes<32>>(src, w, sw, first); break;
        default: widen_row<Bytes<64>>(src, w, sw, first); break;
      }
      for (int64_t k = 1; k < sh; ++k) std::memcpy(first + k * out_row, first, static_cast<size_t>(out_row));
    }
  });
}

namespace {

// dst[i] = src[i·step] for i < n, elements of type T (bytes moved, never computed).
template <typename T>
void strided_run(const uint8_t* src, int64_t step, int64_t n, uint8_t* dst) {
  const T* s = reinterpret_cast<const T*>(src);
  T* d = reinterpret_cast<T*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = s[i * step];
}

// dst[i·rows + j] = src[j·step + i] for j < rows, i < len: `rows` input rows of `len`
// elements, `step` elements apart, interleaved (elements of type T, bytes moved).
template <typename T>
void interleave_rows(const uint8_t* src, int64_t step, int64_t rows, int64_t len, uint8_t* dst) {
  const int64_t bytes = static_cast<int64_t>(sizeof(T));
  for (int64_t j = 0; j < rows; ++j) interleave_column<T>(src + j * step * bytes, len, rows, dst + j * bytes);
}

}  // namespace

void copy_strided(const uint8_t* x, int rank, const int64_t* shape_in, const int64_t* strides_in, int64_t elem,
                  uint8_t* y, int num_threads) {
  // Drop size-1 dimensions and merge a dimension into the next inner one when the view
  // walks them as one (stride[d] == stride[d+1] · shape[d+1]); the innermost merged
  // dimension with stride == elem is one memcpy run.
  int64_t shape[broadcast::kMaxRank], stride[broadcast::kMaxRank];
  int r = 0;
  for (int d = 0; d < rank; ++d) {
    if (shape_in[d] == 0) return;
    if (shape_in[d] == 1) continue;
    if (r > 0 && stride[r - 1] == strides_in[d] * shape_in[d]) {
      shape[r - 1] *= shape_in[d];
      stride[r - 1] = strides_in[d];
      continue;
    }
    shape[r] = shape_in[d];
    stride[r] = strides_in[d];
    ++r;
  }
  int64_t run_elems = 1, run_bytes = elem;
  int outer_rank = r;
  // An innermost dimension with a step (a Slice with steps: YOLOv5's Focus takes every
  // other column) is one row too, copied by a typed strided loop: a memcpy call per
  // element cost ~2 ns each.
  int64_t run_step = 0;  // elements between a strided run's values; 0: a contiguous run
  if (r > 0 && stride[r - 1] == elem) {
    run_elems = shape[r - 1];
    run_bytes = run_elems * elem;
    outer_rank = r - 1;
  } else if (r > 0 && stride[r - 1] != 0 && stride[r - 1] % elem == 0 &&
             (elem == 1 || elem == 2 || elem == 4 || elem == 8)) {
    run_elems = shape[r - 1];
    run_bytes = run_elems * elem;
    run_step = stride[r - 1] / elem;
    outer_rank = r - 1;
  }
  // A short strided run (DepthToSpace's b values of one output pixel, each from another
  // channel plane) under a dimension the view walks contiguously: the two copy as one
  // block, the run's input rows read in order and interleaved into the output, instead of
  // one step of the outer loop for every few elements.
  int64_t block = 0;  // the contiguous dimension's length, when the block form applies
  if (run_step != 0 && run_elems <= 8 && outer_rank >= 1 && stride[outer_rank - 1] == elem) {
    block = shape[outer_rank - 1];
    run_bytes *= block;
    outer_rank -= 1;
  }
  int64_t outer = 1;
  for (int d = 0; d < outer_rank; ++d) outer *= shape[d];
  const auto copy_run = [&](const uint8_t* src, uint8_t* dst) {
    if (block > 0) {
      switch (elem) {
        case 1: interleave_rows<uint8_t>(src, run_step, run_elems, block, dst); break;
        case 2: interleave_rows<uint16_t>(src, run_step, run_elems, block, dst); break;
        case 4: interleave_rows<uint32_t>(src, run_step, run_elems, block, dst); break;
        default: interleave_rows<uint64_t>(src, run_step, run_elems, block, dst); break;
      }
      return;
    }
    switch (run_step == 0 ? 0 : elem) {
      case 1: strided_run<uint8_t>(src, run_step, run_elems, dst); break;
      case 2: strided_run<uint16_t>(src, run_step, run_elems, dst); break;
      case 4: strided_run<uint32_t>(src, run_step, run_elems, dst); break;
      case 8: strided_run<uint64_t>(src, run_step, run_elems, dst); break;
      default: std::memcpy(dst, src, static_cast<size_t>(run_bytes));
    }
  };
  qgemm::parallel_ranges(num_threads, outer, rows_per_chunk(run_bytes, kByteGrain), [&](int64_t b, int64_t e) {
    int64_t idx[broadcast::kMaxRank];
    int64_t off = 0, o = b;
    for (int d = outer_rank - 1; d >= 0; --d) {
      idx[d] = o % shape[d];
      o /= shape[d];
      off += idx[d] * stride[d];
    }
    for (int64_t p = b; p < e; ++p) {
      copy_run(x + off, y + p * run_bytes);
      for (int d = outer_rank - 1; d >= 0; --d) {
        ++idx[d];
        off += stride[d];
        if (idx[d] < shape[d]) break;
        off -= idx[d] * stride[d];
        idx[d] = 0;
      }
    }
  });
}

}  // namespace tensor_ops
}  // namespace quanta
