// Packing for qgemm (see qgemm.h for the contract, docs/kernels.md for the layouts).
//
// Weights, once per model: w [K, N] -> panels of NR columns, groups of KR consecutive k,
// in the micro-kernel's storage type, together with
//   cs[n]  = Σ_k (w[k,n] − zw[n])        the column sums of eq. (5)
//   zw'[n] = zw[n] (int8 w) or zw[n] − 128 (uint8 w, stored as w' = w − 128 in int8).
// The u8 shift of int8 activations (eq. (8)) needs nothing here: x' − zx' = x − zx, and
// the driver folds zx' = zx + 128 into the column term bias[n] − zx'·cs[n] per call.
//
// Activations, per call: x -> x' rows padded with zeros to Kp (only when the kernel cannot
// read x in place: int8 x, K not a multiple of KR, or the AVX2 int16 layout), and the
// row sums Σ_k x'[m,k] when some zw' != 0.
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <vector>

#include "qgemm/kernel.h"

namespace quanta {
namespace qgemm {

void AlignedBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

void AlignedBuffer::resize(size_t bytes) {
  ptr_.reset();
  size_ = 0;
  if (bytes == 0) return;
  const size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  ptr_.reset(static_cast<uint8_t*>(p));
  size_ = bytes;
}

uint8_t* Workspace::reserve(size_t bytes) {
  if (bytes > buf_.size()) buf_.resize(bytes);
  return buf_.data();
}

namespace {

template <typename Storage>
void pack_panels(const void* w, bool w_unsigned, int64_t K, int64_t N, int64_t stride, PackedWeights& pw) {
  Storage* dst = reinterpret_cast<Storage*>(pw.data.data());
  const int nr = pw.nr, kr = pw.kr;
  const int64_t groups = pw.Kp / kr;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t g = k / kr, t = k % kr;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t p = n / nr, j = n % nr;
      const int32_t v = w_unsigned ? static_cast<int32_t>(static_cast<const uint8_t*>(w)[k * stride + n]) - 128
                                   : static_cast<int32_t>(static_cast<const int8_t*>(w)[k * stride + n]);
      dst[((p * groups + g) * nr + j) * kr + t] = static_cast<Storage>(v);
    }
  }
}

}  // namespace

std::shared_ptr<PackedWeights> pack_weights(const void* w, bool w_unsigned, int64_t K, int64_t N, int64_t w_row_stride,
                                            const int32_t* zero_point, bool zero_point_per_channel, Isa isa,
                                            bool saturating) {
  if (K < 0 || N < 0 || w_row_stride < N) throw std::invalid_argument("pack_weights: bad dimensions");
  if (saturating && (isa != Isa::kAvx2 || w_unsigned)) {
    throw std::invalid_argument("pack_weights: saturating pairs are the avx2 family's, of int8 weights");
  }
  auto pw = std::make_shared<PackedWeights>();
  pw->isa = isa;
  pw->narrow = isa == Isa::kAvx2 && (saturating || weights_pairs_fit_int16(w, w_unsigned, K, N, w_row_stride));
  const KernelFamily& li = kernel_family(*pw);
  pw->nr = li.nr;
  pw->kr = li.kr;
  pw->storage_bytes = li.w_bytes;
  pw->K = K;
  pw->N = N;
  pw->Kp = (K + li.kr - 1) / li.kr * li.kr;
  pw->n_panels = (N + li.nr - 1) / li.nr;
  pw->weights_unsigned = w_unsigned;
  pw->data.resize(static_cast<size_t>(pw->n_panels * pw->Kp * li.nr * li.w_bytes));
  pw->column_sums.resize(static_cast<size_t>(pw->padded_n()) * sizeof(int32_t));
  pw->zero_point.resize(static_cast<size_t>(pw->padded_n()) * sizeof(int32_t));

  int32_t* cs = reinterpret_cast<int32_t*>(pw->column_sums.data());
  int32_t* zw = reinterpret_cast<int32_t*>(pw->zero_point.data());
  std::vector<int64_t> sums(static_cast<size_t>(N), 0);
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      sums[n] += w_unsigned ? static_cast<int64_t>(static_cast<const uint8_t*>(w)[k * w_row_stride + n])
                            : static_cast<int64_t>(static_cast<const int8_t*>(w)[k * w_row_stride + n]);
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    const int64_t z = zero_point[zero_point_per_channel ? n : 0];
    // cs wraps to int32 like every other accumulator term (exact while K < 2^23).
    cs[n] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(sums[n] - K * z)));
    zw[n] = static_cast<int32_t>(z - (w_unsigned ? 128 : 0));
    if (zw[n] != 0) pw->has_zero_point = true;
  }
  if (li.w_bytes == 1) {
    pack_panels<int8_t>(w, w_unsigned, K, N, w_row_stride, *pw);
  } else {
    pack_panels<int16_t>(w, w_unsigned, K, N, w_row_stride, *pw);
  }
  return pw;
}

// docs/kernels.md eq. (K1)-(K2): with x' in [0, 255], the pair (w'[2j, n], w'[2j + 1, n])
// sums to at most 255·P and at least −255·Q in vpmaddubsw's int16 (P: its positive w',
// Q: its negative w' magnitudes), so it is exact iff P <= 128 and Q <= 128. Pairs are
// k = 2j, 2j + 1 of w's own K order: the packed groups of 4 k hold two pairs each, every
// K chunk, tap chunk and the one-row kernel start on a group, and k = K (K odd) is the
// packing's zero (a lone w' is always safe: |w'| <= 128).
bool weights_pairs_fit_int16(const void* w, bool w_unsigned, int64_t K, int64_t N, int64_t stride) {
  const auto at = [&](int64_t k, int64_t n) {
    return w_unsigned ? static_cast<int32_t>(static_cast<const uint8_t*>(w)[k * stride + n]) - 128
                      : static_cast<int32_t>(static_cast<const int8_t*>(w)[k * stride + n]);
  };
  for (int64_t k = 0; k + 1 < K; k += 2) {
    for (int64_t n = 0; n < N; ++n) {
      const int32_t a = at(k, n), b = at(k + 1, n);
      const int32_t positive = (a > 0 ? a : 0) + (b > 0 ? b : 0);
      const int32_t negative = (a < 0 ? -a : 0) + (b < 0 ? -b : 0);
      if (positive > kPairCodeBound || negative > kPairCodeBound) return false;
    }
  }
  return true;
}

void pack_activations_u8(const void* x, int64_t x_row_stride, bool x_signed, int64_t K, int64_t Kp, int64_t m_begin,
                         int64_t m_end, uint8_t* dst) {
  const uint8_t flip = x_signed ? 0x80 : 0x00;  // int8 -> x + 128 as uint8
  const uint8_t* src = static_cast<const uint8_t*>(x);
  for (int64_t m = m_begin; m < m_end; ++m) {
    const uint8_t* s = src + m * x_row_stride;
    uint8_t* d = dst + m * Kp;
    for (int64_t k = 0; k < K; ++k) d[k] = static_cast<uint8_t>(s[k] ^ flip);
    for (int64_t k = K; k < Kp; ++k) d[k] = 0;
  }
}

void pack_activations_s16(const void* x, int64_t x_row_stride, bool x_signed, int64_t K, int64_t Kp, int64_t m_begin,
                          int64_t m_end, int16_t* dst) {
  const uint8_t flip = x_signed ? 0x80 : 0x00;
  const uint8_t* src = static_cast<const uint8_t*>(x);
  for (int64_t m = m_begin; m < m_end; ++m) {
    const uint8_t* s = src + m * x_row_stride;
    int16_t* d = dst + m * Kp;
    for (int64_t k = 0; k < K; ++k) d[k] = static_cast<int16_t>(static_cast<uint8_t>(s[k] ^ flip));
    for (int64_t k = K; k < Kp; ++k) d[k] = 0;
  }
}

void activation_row_sums(const void* x, int64_t x_row_stride, bool x_signed, int64_t K, int64_t m_begin, int64_t m_end,
                         int32_t* rowsum) {
  const uint8_t flip = x_signed ? 0x80 : 0x00;
  const uint8_t* src = static_cast<const uint8_t*>(x);
  for (int64_t m = m_begin; m < m_end; ++m) {
    const uint8_t* s = src + m * x_row_stride;
    uint32_t sum = 0;  // Σ x' <= 255·K: exact below K = 2^24, wraps (mod 2^32) beyond
    for (int64_t k = 0; k < K; ++k) sum += static_cast<uint8_t>(s[k] ^ flip);
    rowsum[m] = static_cast<int32_t>(sum);
  }
}

}  // namespace qgemm
}  // namespace quanta
