// batched_qgemm: strided weight packing into reused buffers, and the batch loop (contract
// in batched_qgemm.h).
//
// The packed layout is the one of qgemm.h / pack.cc: panel p, k-group g, column j, lane t
//   data[((p·G + g)·nr + j)·kr + t] = w'[g·kr + t, p·nr + j],  G = Kp / kr,
// zero where k >= K or column >= N; w' = w (int8) or w − 128 (uint8). Column sums
// cs[n] = Σ_k (w[k,n] − zw[n]) wrap to int32 as pack.cc computes them; zw'[n] = zw[n] (int8)
// or zw[n] − 128 (uint8); both padded with zeros to n_panels·nr. Every byte of the layout is
// written, so a reused buffer needs no clearing.
#include "gemm/batched_qgemm.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "gemm/pack_strided.h"
#include "qgemm/kernel.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace gemm {
namespace {

using qgemm::PackedWeights;

// Sets pw's layout fields for (isa, K, N); its buffers are untouched.
void set_layout(PackedWeights& pw, Isa isa, int64_t K, int64_t N, bool w_unsigned, bool has_zero_point) {
  const qgemm::KernelFamily& f = qgemm::kernel_family(isa);
  pw.isa = isa;
  pw.narrow = false;  // kernel_family(isa)'s layout, never the avx2 7-bit one
  pw.nr = f.nr;
  pw.kr = f.kr;
  pw.storage_bytes = f.w_bytes;
  pw.K = K;
  pw.N = N;
  pw.Kp = (K + f.kr - 1) / f.kr * f.kr;
  pw.n_panels = (N + f.nr - 1) / f.nr;
  pw.weights_unsigned = w_unsigned;
  pw.has_zero_point = has_zero_point;
}

// Grows pw's buffers to what the layout `of` needs.
void grow_buffers(PackedWeights& pw, const PackedWeights& of) {
  const size_t data_bytes = static_cast<size_t>(of.n_panels * of.Kp * of.nr * of.storage_bytes);
  const size_t col_bytes = static_cast<size_t>(of.padded_n()) * sizeof(int32_t);
  if (pw.data.size() < data_bytes) pw.data.resize(data_bytes);
  if (pw.column_sums.size() < col_bytes) pw.column_sums.resize(col_bytes);
  if (pw.zero_point.size() < col_bytes) pw.zero_point.resize(col_bytes);
}

// Sets pw's layout fields for (isa, K, N) and grows its buffers when they are too small.
void prepare_layout(PackedWeights& pw, Isa isa, int64_t K, int64_t N, bool w_unsigned, bool has_zero_point) {
  set_layout(pw, isa, K, N, w_unsigned, has_zero_point);
  grow_buffers(pw, pw);
}

bool any_shifted_zero_point(const int32_t* zero_point, bool per_channel, int64_t N, bool w_unsigned) {
  const int32_t shift = w_unsigned ? 128 : 0;
  const int64_t n_values = per_channel ? N : 1;
  for (int64_t n = 0; n < n_values; ++n) {
    if (zero_point[n] - shift != 0) return true;
  }
  return false;
}

}  // namespace

PackedWeights packed_layout(Isa isa, int64_t K, int64_t N, bool w_unsigned, bool has_zero_point) {
  PackedWeights pw;
  set_layout(pw, isa, K, N, w_unsigned, has_zero_point);
  return pw;
}

void reserve_packed_weights(PackedWeights& pw, Isa isa, int64_t K, int64_t N) {
  grow_buffers(pw, packed_layout(isa, K, N, false, false));
}

void pack_strided_portable(const StridedSource& s, void* dst, int32_t* cs, int32_t* zw) {
  if (s.w_unsigned) {
    pack_strided_panels<uint8_t, int8_t, 16, 4>(s, static_cast<int8_t*>(dst), cs, zw);
  } else {
    pack_strided_panels<int8_t, int8_t, 16, 4>(s, static_cast<int8_t*>(dst), cs, zw);
  }
}

void pack_weights_strided(const void* w_base, bool w_unsigned, int64_t K, int64_t N, int64_t k_stride, int64_t n_stride,
                          const int32_t* zero_point, bool zero_point_per_channel, Isa isa, PackedWeights& pw) {
  if (K < 0 || N < 0) throw std::invalid_argument("pack_weights_strided: bad dimensions");
  prepare_layout(pw, isa, K, N, w_unsigned, any_shifted_zero_point(zero_point, zero_point_per_channel, N, w_unsigned));
  // Each entry point is the template instance of its family's fixed layout; a family whose
  // layout changed without a matching instance is refused here, never packed wrongly.
  struct Entry {
    Isa isa;
    int nr, kr, w_bytes;
    void (*fn)(const StridedSource&, void*, int32_t*, int32_t*);
  };
  static const Entry kEntries[] = {
      {Isa::kPortable, 16, 4, 1, pack_strided_portable},
      {Isa::kAvx2, 16, 2, 1, pack_strided_avx2},
      {Isa::kAvx512Vnni, 32, 4, 1, pack_strided_avx512vnni},
  };
  const Entry* entry = nullptr;
  for (const Entry& e : kEntries) {
    if (e.isa == isa) entry = &e;
  }
  if (entry == nullptr || entry->nr != pw.nr || entry->kr != pw.kr || entry->w_bytes != pw.storage_bytes) {
    throw std::logic_error("pack_weights_strided: no strided packer for the layout of ISA " +
                           std::string(isa_name(isa)));
  }
  StridedSource src;
  src.w = w_base;
  src.w_unsigned = w_unsigned;
  src.K = K;
  src.N = N;
  src.k_stride = k_stride;
  src.n_stride = n_stride;
  src.Kp = pw.Kp;
  src.n_panels = pw.n_panels;
  src.zero_point = zero_point;
  src.zero_point_per_channel = zero_point_per_channel;
  entry->fn(src, pw.data.data(), reinterpret_cast<int32_t*>(pw.column_sums.data()),
            reinterpret_cast<int32_t*>(pw.zero_point.data()));
}

BatchedScratch::Slot& BatchedScratch::slot(int thread) { return slots_.at(static_cast<size_t>(thread)); }

void BatchedScratch::reserve(int threads) {
  if (threads > reserved()) slots_.resize(static_cast<size_t>(threads));
}

void batched_qgemm(const BatchedParams& p, BatchedScratch& scratch) {
  const int threads = std::max(1, p.gemm.num_threads);
  const bool over_batches = threads > 1 && p.batch >= threads;
  const int n_slots = over_batches ? threads : 1;
  const int per_gemm_threads = over_batches ? 1 : threads;
  scratch.reserve(n_slots);
  const bool has_zp = any_shifted_zero_point(p.zw, p.zw_per_channel, p.N, p.w_unsigned);
  // Grow every slot on this thread, so that the workers never allocate (or throw).
  for (int s = 0; s < n_slots; ++s) {
    BatchedScratch::Slot& sl = scratch.slot(s);
    prepare_layout(sl.packed, p.isa, p.K, p.N, p.w_unsigned, has_zp);
    qgemm::QGemmParams q = p.gemm;
    q.w = &sl.packed;
    q.zx_per_row = nullptr;
    q.num_threads = per_gemm_threads;
    sl.workspace.reserve(qgemm::qgemm_workspace_bytes(q));
  }
  if (p.batch == 0 || p.gemm.M == 0 || p.N == 0) return;
  const int y_bytes = p.gemm.out_type == qgemm::OutType::kU8 || p.gemm.out_type == qgemm::OutType::kS8 ? 1 : 4;
  auto run_one = [&](int64_t i, int slot_index) {
    BatchedScratch::Slot& sl = scratch.slot(slot_index);
    pack_weights_strided(static_cast<const uint8_t*>(p.w) + i * p.w_batch_stride, p.w_unsigned, p.K, p.N, p.w_k_stride,
                         p.w_n_stride, p.zw, p.zw_per_channel, p.isa, sl.packed);
    qgemm::QGemmParams q = p.gemm;
    q.w = &sl.packed;
    q.zx_per_row = nullptr;
    q.x = static_cast<const uint8_t*>(p.gemm.x) + i * p.x_batch_stride;
    q.y = static_cast<uint8_t*>(p.gemm.y) + i * p.y_batch_stride * y_bytes;
    q.num_threads = per_gemm_threads;
    qgemm::qgemm(q, sl.workspace);
  };
  if (over_batches) {
    auto chunk = [&](int64_t i, int thread) { run_one(i, thread); };
    qgemm::parallel_for(threads, p.batch, chunk);
  } else {
    for (int64_t i = 0; i < p.batch; ++i) run_one(i, 0);
  }
}

}  // namespace gemm
}  // namespace quanta
