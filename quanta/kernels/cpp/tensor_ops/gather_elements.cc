// GatherElements: contract in gather_elements.h. The indices are viewed as
// [outer, m, inner] around the axis; each (outer, inner) position maps to a data offset
// once, so the inner loop reads one index and copies one element.
#include "tensor_ops/gather_elements.h"

#include <algorithm>
#include <cstring>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace tensor_ops {

namespace {

template <typename T>
void copy_run(const uint8_t* data, const int64_t* idx, int64_t n, int64_t m, int64_t inner, int64_t data_base,
              int64_t axis_stride, const int64_t* inner_offsets, uint8_t* y) {
  const T* d = reinterpret_cast<const T*>(data);
  T* out = reinterpret_cast<T*>(y);
  for (int64_t j = 0; j < m; ++j) {
    for (int64_t k = 0; k < inner; ++k) {
      const int64_t i = idx[j * inner + k];
      out[j * inner + k] = d[data_base + (i < 0 ? i + n : i) * axis_stride + inner_offsets[k]];
    }
  }
}

}  // namespace

void gather_elements(const uint8_t* data, const std::vector<int64_t>& data_shape, const int64_t* idx,
                     const std::vector<int64_t>& idx_shape, int64_t axis, int64_t elem_bytes, uint8_t* y,
                     int num_threads) {
  const auto rank = static_cast<int64_t>(data_shape.size());
  std::vector<int64_t> stride(static_cast<size_t>(rank), 1);  // data's, in elements
  for (int64_t d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * data_shape[d + 1];
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= idx_shape[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= idx_shape[d];
  const int64_t m = idx_shape[axis], n = data_shape[axis];
  if (outer == 0 || inner == 0 || m == 0) return;
  // data offset of each inner position (the axes after `axis`, at indices' extents)
  std::vector<int64_t> inner_off(static_cast<size_t>(inner), 0);
  for (int64_t k = 0; k < inner; ++k) {
    int64_t rest = k, off = 0;
    for (int64_t d = rank - 1; d > axis; --d) {
      off += (rest % idx_shape[d]) * stride[d];
      rest /= idx_shape[d];
    }
    inner_off[k] = off;
  }
  const int64_t run = m * inner;
  qgemm::parallel_ranges(num_threads, outer, std::max<int64_t>(1, (int64_t{1} << 14) / run),
                         [&](int64_t o0, int64_t o1) {
                           for (int64_t o = o0; o < o1; ++o) {
                             int64_t rest = o, base = 0;
                             for (int64_t d = axis - 1; d >= 0; --d) {
                               base += (rest % idx_shape[d]) * stride[d];
                               rest /= idx_shape[d];
                             }
                             const int64_t* ix = idx + o * run;
                             uint8_t* out = y + o * run * elem_bytes;
                             switch (elem_bytes) {
                               case 1:
                                 copy_run<uint8_t>(data, ix, n, m, inner, base, stride[axis], inner_off.data(), out);
                                 break;
                               case 2:
                                 copy_run<uint16_t>(data, ix, n, m, inner, base, stride[axis], inner_off.data(), out);
                                 break;
                               case 4:
                                 copy_run<uint32_t>(data, ix, n, m, inner, base, stride[axis], inner_off.data(), out);
                                 break;
                               default:
                                 copy_run<uint64_t>(data, ix, n, m, inner, base, stride[axis], inner_off.data(), out);
                                 break;
                             }
                           }
                         });
}

}  // namespace tensor_ops
}  // namespace quanta
