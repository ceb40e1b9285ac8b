// The loops of tensor_ops.h, written once. Each ISA file includes this header inside its
// own anonymous namespace (internal linkage: one copy per -m flag set, so the linker can
// never hand the AVX-512 instantiation to the portable table) and builds its table with
// make_kernels(). Plain loops over independent elements: the compiler vectorizes them
// for the file's ISA without reordering any operation (-ffp-contract=off, no fast-math).
// Included only by tensor_ops_<isa>.cc; needs <cmath>, <cstdint>, <cstring>, <limits>.

// numpy's np.maximum / np.minimum (tensor_ops.h "max(a, b)")
template <typename T>
inline T np_max(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
  }
  return a > b ? a : b;
}
template <typename T>
inline T np_min(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (a != a) return a;
  }
  return a < b ? a : b;
}

// np.clip(t, 0, 1) of the twins (nn.hard_sigmoid, nn.hard_swish): t itself on NaN and on
// a tie (np.clip(−0, 0, 1) is −0, where np_max(−0, 0) is +0).
inline float clip01(float t) {
  const float m = 0.0f > t ? 0.0f : t;
  return 1.0f < m ? 1.0f : m;
}

// The widest float32 vector traits this file's ISA flags enable (simd.h), for the loops
// whose NaN-aware scalar form the compiler vectorizes poorly; none on the portable build.
#if defined(__AVX512F__)
#define QUANTA_TENSOR_OPS_VECTORS 1
using VecF32 = ::quanta::simd::F32x16;
#elif defined(__AVX2__) && defined(__FMA__)
#define QUANTA_TENSOR_OPS_VECTORS 1
using VecF32 = ::quanta::simd::F32x8;
#else
#define QUANTA_TENSOR_OPS_VECTORS 0
#endif

// The gates clip01(f32(f32(alpha · x) + beta)) of HardSigmoid and, times x, HardSwish, in
// whole vectors: returns how many leading elements it wrote (0 on the portable build),
// the scalar loop does the rest. vmaxps(0, t) = (0 > t ? 0 : t) and vminps(1, m) =
// (1 < m ? 1 : m) are clip01's two selections lane by lane (x86 returns the second
// operand on NaN and on ties). The compiler vectorizes clip01 too, but with NaN tests
// and mask blends at a third of this speed.
template <bool kTimesX>
int64_t gate_vectors(const float* x, float* y, int64_t n, float alpha, float beta) {
#if QUANTA_TENSOR_OPS_VECTORS
  using V = VecF32;
  const typename V::V va = V::set1(alpha), vb = V::set1(beta), zero = V::zero(), one = V::set1(1.0f);
  int64_t i = 0;
  for (; i + V::kLanes <= n; i += V::kLanes) {
    const typename V::V v = V::loadu(x + i);
    const typename V::V g = V::min(one, V::max(zero, V::add(V::mul(va, v), vb)));
    V::storeu(y + i, kTimesX ? V::mul(v, g) : g);
  }
  return i;
#else
  (void)x, (void)y, (void)n, (void)alpha, (void)beta;
  return 0;
#endif
}

// LeakyRelu x < 0 ? f32(x · alpha) : x in whole vectors: returns how many leading
// elements it wrote (0 on the portable build), the scalar loop does the rest. The lanes
// where x < 0 (ordered: false on NaN and on −0) take the product, the others x itself.
// GCC does not vectorize the scalar form (it keeps a branch per element rather than
// form a product it would not need under -ftrapping-math), and the branch mispredicts
// on activations of random sign: 2.5 ns an element, 27 ms of oww_embedding's run.
inline int64_t leaky_vectors(const float* x, float* y, int64_t n, float alpha) {
#if QUANTA_TENSOR_OPS_VECTORS
  using V = VecF32;
  const typename V::V va = V::set1(alpha), zero = V::zero();
  int64_t i = 0;
  for (; i + V::kLanes <= n; i += V::kLanes) {
    const typename V::V v = V::loadu(x + i);
    V::storeu(y + i, V::select(V::template cmp<_CMP_LT_OQ>(v, zero), v, V::mul(v, va)));
  }
  return i;
#else
  (void)x, (void)y, (void)n, (void)alpha;
  return 0;
#endif
}

template <int kOp>
void unary_f32_run(const float* x, float* y, int64_t n, const UnaryParams& p) {
  if constexpr (kOp == static_cast<int>(UnaryF32::kClip)) {
    const float lo = p.lo, hi = p.hi;
    if (p.has_lo && p.has_hi) {
      for (int64_t i = 0; i < n; ++i) y[i] = np_min(np_max(x[i], lo), hi);
    } else if (p.has_lo) {
      for (int64_t i = 0; i < n; ++i) y[i] = np_max(x[i], lo);
    } else if (p.has_hi) {
      for (int64_t i = 0; i < n; ++i) y[i] = np_min(x[i], hi);
    } else {
      std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
    }
  } else if constexpr (kOp == static_cast<int>(UnaryF32::kSqrt)) {
    for (int64_t i = 0; i < n; ++i) y[i] = std::sqrt(x[i]);
  } else if constexpr (kOp == static_cast<int>(UnaryF32::kNeg)) {
    for (int64_t i = 0; i < n; ++i) y[i] = -x[i];
  } else if constexpr (kOp == static_cast<int>(UnaryF32::kAbs)) {
    for (int64_t i = 0; i < n; ++i) y[i] = std::fabs(x[i]);
  } else if constexpr (kOp == static_cast<int>(UnaryF32::kReciprocal)) {
    for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / x[i];
  } else if constexpr (kOp == static_cast<int>(UnaryF32::kSquare)) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] * x[i];
  } else if constexpr (kOp == static_cast<int>(UnaryF32::kCube)) {
    for (int64_t i = 0; i < n; ++i) {
      const float s = x[i] * x[i];
      y[i] = s * x[i];
    }
  } else if constexpr (kOp == static_cast<int>(UnaryF32::kHardSigmoid)) {
    const float alpha = p.alpha, beta = p.beta;
    const int64_t done = gate_vectors<false>(x, y, n, alpha, beta);
    for (int64_t i = done; i < n; ++i) {
      const float a = alpha * x[i];
      y[i] = clip01(a + beta);
    }
  } else if constexpr (kOp == static_cast<int>(UnaryF32::kLeakyRelu)) {
    const float alpha = p.alpha;
    for (int64_t i = leaky_vectors(x, y, n, alpha); i < n; ++i) y[i] = x[i] < 0.0f ? x[i] * alpha : x[i];
  } else {  // kHardSwish
    // alpha = f32(1/6) multiplied, as ONNX's definition (HardSigmoid's alpha · x + beta)
    // and ONNX Runtime compute it; a division by 6 rounds differently for ~10 % of x
    // and costs a divide per element
    constexpr float kSixth = 1.0f / 6.0f;
    const int64_t done = gate_vectors<true>(x, y, n, kSixth, 0.5f);
    for (int64_t i = done; i < n; ++i) {
      const float a = x[i] * kSixth;
      y[i] = x[i] * clip01(a + 0.5f);
    }
  }
}

template <typename T>
void clip_int_run(const void* xv, void* yv, int64_t n, int64_t lo64, int64_t hi64, bool has_lo, bool has_hi) {
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  const T lo = static_cast<T>(lo64), hi = static_cast<T>(hi64);
  if (has_lo && has_hi) {
    for (int64_t i = 0; i < n; ++i) y[i] = np_min(np_max(x[i], lo), hi);
  } else if (has_lo) {
    for (int64_t i = 0; i < n; ++i) y[i] = np_max(x[i], lo);
  } else if (has_hi) {
    for (int64_t i = 0; i < n; ++i) y[i] = np_min(x[i], hi);
  } else {
    std::memcpy(y, x, static_cast<size_t>(n) * sizeof(T));
  }
}

template <typename From, typename To>
void cast_run(const void* xv, void* yv, int64_t n) {
  const From* x = static_cast<const From*>(xv);
  To* y = static_cast<To*>(yv);
  if constexpr (std::is_same_v<To, bool>) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i] != From(0);
  } else if constexpr (std::is_same_v<From, bool>) {
    // bool's bytes read as uint8: the compiler vectorizes a byte compare and convert, and
    // converts a bool one element at a time (a one-hot's float32 Cast: 4x faster)
    const auto* b = static_cast<const uint8_t*>(xv);
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<To>(b[i] != 0);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<To>(x[i]);
  }
}

// int32 / int64 (wrapping, truncating division) and float64 (one IEEE operation; max /
// min as np.maximum / np.minimum: a NaN x propagates, else x > y ? x : y)
template <typename T, int kOp>
void binary_int_run(const void* av, int64_t as, const void* bv, int64_t bs, void* cv, int64_t n) {
  // wrapping arithmetic without signed overflow
  using U = typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>, std::common_type<T>>::type;
  const T* a = static_cast<const T*>(av);
  const T* b = static_cast<const T*>(bv);
  T* c = static_cast<T*>(cv);
  auto op = [](T x, T y) -> T {
    if constexpr (std::is_floating_point_v<T>) {
      if constexpr (kOp == 0) return x + y;
      if constexpr (kOp == 1) return x - y;
      if constexpr (kOp == 2) return x * y;
      if constexpr (kOp == 3) return x / y;
      if (x != x) return x;
      if constexpr (kOp == 4) return x > y ? x : y;
      return x < y ? x : y;
    }
    if constexpr (kOp == 0) return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
    if constexpr (kOp == 1) return static_cast<T>(static_cast<U>(x) - static_cast<U>(y));
    if constexpr (kOp == 2) return static_cast<T>(static_cast<U>(x) * static_cast<U>(y));
    if constexpr (kOp == 3) {
      // truncating division (math_ops.int_div_trunc): x / 0 is 0 and MIN / −1 wraps to
      // MIN, the twin's results, where C's division would trap
      if (y == 0) return T(0);
      if (y == T(-1)) return static_cast<T>(U(0) - static_cast<U>(x));
      return static_cast<T>(x / y);
    }
    if constexpr (kOp == 6 || kOp == 7) {
      // Mod (math_ops.mod): x mod 0 is 0 and x mod −1 is 0 (C's % would trap on both);
      // fmod (kOp 7) keeps C's sign of the dividend, mod (kOp 6) takes the divisor's
      // sign as np.mod does
      if (y == 0 || y == T(-1)) return T(0);
      const T r = static_cast<T>(x % y);
      if constexpr (kOp == 7) return r;
      return (r != 0 && ((r < 0) != (y < 0))) ? static_cast<T>(r + y) : r;
    }
    if constexpr (kOp == 4) return x > y ? x : y;
    return x < y ? x : y;
  };
  if (as == 1 && bs == 1) {
    for (int64_t i = 0; i < n; ++i) c[i] = op(a[i], b[i]);
  } else if (as == 1) {
    const T y = b[0];
    for (int64_t i = 0; i < n; ++i) c[i] = op(a[i], y);
  } else if (bs == 1) {
    const T x = a[0];
    for (int64_t i = 0; i < n; ++i) c[i] = op(x, b[i]);
  } else {
    const T v = op(a[0], b[0]);
    for (int64_t i = 0; i < n; ++i) c[i] = v;
  }
}

template <typename T, int kOp>
inline bool compare_op(T x, T y) {
  if constexpr (kOp == 0) return x == y;
  if constexpr (kOp == 1) return x < y;
  if constexpr (kOp == 2) return x <= y;
  if constexpr (kOp == 3) return x > y;
  return x >= y;
}

template <typename T, int kOp>
void compare_run(const void* av, int64_t as, const void* bv, int64_t bs, void* cv, int64_t n) {
  const T* a = static_cast<const T*>(av);
  const T* b = static_cast<const T*>(bv);
  uint8_t* c = static_cast<uint8_t*>(cv);
  if (as == 1 && bs == 1) {
    for (int64_t i = 0; i < n; ++i) c[i] = compare_op<T, kOp>(a[i], b[i]);
  } else if (as == 1) {
    const T y = b[0];
    for (int64_t i = 0; i < n; ++i) c[i] = compare_op<T, kOp>(a[i], y);
  } else if (bs == 1) {
    const T x = a[0];
    for (int64_t i = 0; i < n; ++i) c[i] = compare_op<T, kOp>(x, b[i]);
  } else {
    const uint8_t v = compare_op<T, kOp>(a[0], b[0]);
    for (int64_t i = 0; i < n; ++i) c[i] = v;
  }
}

template <int kOp>
void logic_run(const void* av, int64_t as, const void* bv, int64_t bs, void* cv, int64_t n) {
  const uint8_t* a = static_cast<const uint8_t*>(av);
  const uint8_t* b = static_cast<const uint8_t*>(bv);
  uint8_t* c = static_cast<uint8_t*>(cv);
  for (int64_t i = 0; i < n; ++i) {
    const bool x = a[i * as] != 0, y = b[i * bs] != 0;
    c[i] = kOp == 0 ? (x && y) : kOp == 1 ? (x || y) : (x != y);
  }
}

#if QUANTA_TENSOR_OPS_VECTORS
// e where the tail mask k holds, `fill` in the other lanes.
inline VecF32::V fill_missing(VecF32::V e, VecF32::M k, float fill) {
#if defined(__AVX512F__)
  return _mm512_mask_blend_ps(k, _mm512_set1_ps(fill), e);
#else
  return _mm256_blendv_ps(_mm256_set1_ps(fill), e, _mm256_castsi256_ps(k));
#endif
}

// Whether a lane of v is not +0 / −0 (NaN included).
inline bool any_nonzero(VecF32::V v) {
#if defined(__AVX512F__)
  return _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_NEQ_UQ) != 0;
#else
  return _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_NEQ_UQ)) != 0;
#endif
}
#endif

// One step of a lane: acc = op(acc, e) of (R1) (kOp 0: sum, 1: sum of squares), (M1)
// (2: max, 3: min) and (P16) (4: prod).
template <int kOp>
inline float lane_step(float acc, float e) {
  if constexpr (kOp == 0) return acc + e;
  if constexpr (kOp == 1) return acc + e * e;
  if constexpr (kOp == 2) return np_max(acc, e);
  if constexpr (kOp == 3) return np_min(acc, e);
  return acc * e;
}

// The step of the tree (R2) / (M2) / (P16): a sum of squares adds its lanes.
constexpr int tree_op(int op) { return op == 1 ? 0 : op; }

// a[p] = op(a[p], e[p]) for p < n: independent lanes, each one step of its own sequence.
// max / min in whole vectors as vmaxps(a, e) (= a > e ? a : e, and e when either is
// NaN), kept at a where a is already NaN: np_max(a, e) exactly; the other operations are
// plain loops the compiler vectorizes without reordering.
template <int kOp>
void lane_steps(float* a, const float* e, int64_t n) {
  int64_t p = 0;
#if QUANTA_TENSOR_OPS_VECTORS
  if constexpr (kOp == 2 || kOp == 3) {
    using V = VecF32;
    for (; p + V::kLanes <= n; p += V::kLanes) {
      const typename V::V va = V::loadu(a + p), ve = V::loadu(e + p);
      const typename V::V m = kOp == 2 ? V::max(va, ve) : V::min(va, ve);
      V::storeu(a + p, V::select(V::template cmp<_CMP_UNORD_Q>(va, va), m, va));
    }
  }
#endif
  for (; p < n; ++p) a[p] = lane_step<kOp>(a[p], e[p]);
}

// (R1)–(R3), (M1)–(M3) and (P16): 16 lanes in index order, then the fixed tree. Max / min
// rows take the 16 lanes as vectors (vmaxps(acc, e) is np_max(acc, e) while acc is not
// NaN: acc starts at ∓inf and turns NaN only after a NaN element; the last block's
// missing lanes are ∓inf, which leave a lane as it is), and a row holding a NaN or an
// infinity (found by OR-ing the bits of e − e, +0 for finite e) is done again by the
// scalar loop, which keeps the NaN as np.maximum does.
//
// Max / min rows of at most 12 elements take the lanes that hold an element only: lane j
// of (M1) is np_max(−inf, x_j) = x_j (NaN and −inf too), the other lanes stay ∓inf, and
// np_max(a, −inf) = a for every a, so each step of the tree (M2) that would read such a
// lane leaves its lane as it is. The same bytes with ~d operations a row instead of 16
// lane initializations and 15 tree steps (a max over a stack of 3 branches, [R, 3]);
// blocks of 16 rows go through the tree together, element j of the 16 rows in one array
// (t[j]), so each step is one vector operation (lane_steps) across the rows. (From 13
// elements on, the rows' own vectors are the faster layout: 16 elements, one AVX-512
// register, 0.12 ns an element against 0.4 transposed.)
template <int kOp>
void reduce_run(const float* x, int64_t rows, int64_t d, float* y) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float init = kOp == 2 ? -kInf : kOp == 3 ? kInf : kOp == 4 ? 1.0f : 0.0f;
  if constexpr (kOp == 2 || kOp == 3) {
    if (d >= 1 && d <= 12) {
      int64_t r = 0;
      float t[16][16];
      for (; r + 16 <= rows; r += 16) {
        const float* v = x + r * d;
        for (int64_t q = 0; q < 16; ++q) {
          for (int64_t j = 0; j < d; ++j) t[j][q] = v[q * d + j];  // lane j: np_max(∓inf, x_j) = x_j
        }
        int64_t live = d;
        for (int64_t h = 8; h >= 1; h /= 2) {
          if (live > h) {
            for (int64_t j = 0; j + h < live; ++j) lane_steps<kOp>(t[j], t[j + h], 16);
            live = h;
          }
        }
        std::memcpy(y + r, t[0], 16 * sizeof(float));
      }
      for (; r < rows; ++r) {
        const float* v = x + r * d;
        float acc[16];
        for (int64_t j = 0; j < d; ++j) acc[j] = lane_step<kOp>(init, v[j]);
        int64_t live = d;  // lanes [0, live) hold elements
        for (int64_t h = 8; h >= 1; h /= 2) {
          if (live > h) {
            for (int64_t j = 0; j + h < live; ++j) acc[j] = lane_step<kOp>(acc[j], acc[j + h]);
            live = h;
          }
        }
        y[r] = acc[0];
      }
      return;
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    const float* v = x + r * d;
    float acc[16];
    for (int j = 0; j < 16; ++j) acc[j] = init;
    int64_t i = 0;
#if QUANTA_TENSOR_OPS_VECTORS
    if constexpr (kOp == 2 || kOp == 3) {
      using V = VecF32;
      constexpr int kN = 16 / V::kLanes;  // vectors per 16-lane block
      typename V::V a[kN], bad = V::zero();
      for (int q = 0; q < kN; ++q) a[q] = V::set1(init);
      for (; i + 16 <= d; i += 16) {
        for (int q = 0; q < kN; ++q) {
          const typename V::V e = V::loadu(v + i + q * V::kLanes);
          a[q] = kOp == 2 ? V::max(a[q], e) : V::min(a[q], e);
          bad = V::or_(bad, V::sub(e, e));  // +0 for a finite e, NaN bits otherwise
        }
      }
      if (i < d) {  // the last block's missing lanes as ∓inf, which change no lane
        for (int q = 0; q < kN; ++q) {
          const typename V::M k = V::tail(d - i - q * V::kLanes);
          const typename V::V e = V::load(k, v + i + q * V::kLanes);  // +0 in the missing lanes
          a[q] = kOp == 2 ? V::max(a[q], fill_missing(e, k, init)) : V::min(a[q], fill_missing(e, k, init));
          bad = V::or_(bad, V::sub(e, e));
        }
        i = d;
      }
      if (!any_nonzero(bad)) {
        for (int q = 0; q < kN; ++q) V::storeu(acc + q * V::kLanes, a[q]);
      } else {  // a NaN or an infinity: the scalar loop (exact for both)
        for (int j = 0; j < 16; ++j) acc[j] = init;
        i = 0;
      }
    }
#endif
    for (; i + 16 <= d; i += 16) {
      for (int j = 0; j < 16; ++j) acc[j] = lane_step<kOp>(acc[j], v[i + j]);
    }
    for (int j = 0; i + j < d; ++j) acc[j] = lane_step<kOp>(acc[j], v[i + j]);
    for (int h = 8; h >= 1; h /= 2) {
      for (int j = 0; j < h; ++j) acc[j] = lane_step<tree_op(kOp)>(acc[j], acc[j + h]);
    }
    y[r] = acc[0];
  }
}

// Columns of one [d, inner] slab: y[c] for c in [c0, c1) is the reduction of the row
// x[0 … d−1, c] by the same lanes and tree as reduce_run (element k goes to lane k mod
// 16), the lanes of all columns held in acc [16, w] and advanced together — vector
// operations across columns, each column's own sequence. A whole slab of at most
// kMiddleTile columns is one flat run: the 16 consecutive rows of a block are 16·inner
// contiguous floats, element (j, c) of which is lane j of column c.
template <int kOp>
void reduce_middle_run(const float* x, int64_t d, int64_t inner, int64_t c0, int64_t c1, float* y) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float init = kOp == 2 ? -kInf : kOp == 3 ? kInf : kOp == 4 ? 1.0f : 0.0f;
  const int64_t w = c1 - c0;
  float acc[16 * kMiddleTile];
  for (int64_t p = 0; p < 16 * w; ++p) acc[p] = init;
  if (w == inner) {
    int64_t k = 0;
    for (; k + 16 <= d; k += 16) lane_steps<kOp>(acc, x + k * inner, 16 * inner);
    lane_steps<kOp>(acc, x + k * inner, (d - k) * inner);
  } else {
    for (int64_t k = 0; k < d; ++k) lane_steps<kOp>(acc + (k & 15) * w, x + k * inner + c0, w);
  }
  for (int h = 8; h >= 1; h /= 2) lane_steps<tree_op(kOp)>(acc, acc + h * w, h * w);
  std::memcpy(y + c0, acc, static_cast<size_t>(w) * sizeof(float));
}

// Integer rows: sums and products in the unsigned type (wrapping, so the order does not
// matter and there is no signed overflow), max / min in the type.
template <typename T, int kOp>
void reduce_int_run(const void* xv, int64_t rows, int64_t d, void* yv) {
  using U = std::make_unsigned_t<T>;
  const T* x = static_cast<const T*>(xv);
  T* y = static_cast<T*>(yv);
  for (int64_t r = 0; r < rows; ++r) {
    const T* v = x + r * d;
    if constexpr (kOp == 4 || kOp == 5) {
      T acc = kOp == 4 ? std::numeric_limits<T>::min() : std::numeric_limits<T>::max();
      for (int64_t i = 0; i < d; ++i) {
        if constexpr (kOp == 4) acc = v[i] > acc ? v[i] : acc;
        if constexpr (kOp == 5) acc = v[i] < acc ? v[i] : acc;
      }
      y[r] = acc;
    } else {
      U acc = kOp == 3 ? U{1} : U{0};
      for (int64_t i = 0; i < d; ++i) {
        const U e = static_cast<U>(v[i]);
        if constexpr (kOp == 0) acc = static_cast<U>(acc + e);
        if constexpr (kOp == 1) acc = static_cast<U>(acc + static_cast<U>(e * e));
        if constexpr (kOp == 2) acc = static_cast<U>(acc + (v[i] < 0 ? static_cast<U>(U{0} - e) : e));
        if constexpr (kOp == 3) acc = static_cast<U>(acc * e);
      }
      y[r] = static_cast<T>(acc);
    }
  }
}

template <typename T>
void fill_reduce_int(Kernels& k, DType t) {
  k.reduce_int[static_cast<int>(t)][0] = &reduce_int_run<T, 0>;
  k.reduce_int[static_cast<int>(t)][1] = &reduce_int_run<T, 1>;
  k.reduce_int[static_cast<int>(t)][2] = &reduce_int_run<T, 2>;
  k.reduce_int[static_cast<int>(t)][3] = &reduce_int_run<T, 3>;
  k.reduce_int[static_cast<int>(t)][4] = &reduce_int_run<T, 4>;
  k.reduce_int[static_cast<int>(t)][5] = &reduce_int_run<T, 5>;
}

void resize_axis_run(const double* x, int64_t outer, int64_t n, int64_t inner, const int64_t* taps, const double* w,
                     int64_t o, int64_t t, double* y) {
  for (int64_t a = 0; a < outer; ++a) {
    const double* xa = x + a * n * inner;
    double* ya = y + a * o * inner;
    for (int64_t q = 0; q < o; ++q) {
      double* yq = ya + q * inner;
      const double* src0 = xa + taps[q * t] * inner;
      const double w0 = w[q * t];
      for (int64_t c = 0; c < inner; ++c) yq[c] = src0[c] * w0;
      for (int64_t k = 1; k < t; ++k) {
        const double* src = xa + taps[q * t + k] * inner;
        const double wk = w[q * t + k];
        for (int64_t c = 0; c < inner; ++c) yq[c] = yq[c] + src[c] * wk;
      }
    }
  }
}

// rows [row0, row0 + rows) of the whole tensor (the channel of row r is r mod channels)
void batch_norm_run(const float* x, float* y, int64_t rows, int64_t inner, int64_t channels, const float* m,
                    const float* d, const float* g, const float* b, int64_t row0) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = (row0 + r) % channels;
    const float mc = m[c], dc = d[c], gc = g[c], bc = b[c];
    const float* xr = x + r * inner;
    float* yr = y + r * inner;
    for (int64_t i = 0; i < inner; ++i) {
      const float t = (xr[i] - mc) / dc;
      const float u = t * gc;
      yr[i] = u + bc;
    }
  }
}

void acc_to_float_run(const int32_t* acc, float* y, int64_t rows, int64_t inner, int64_t channels, const int32_t* bias,
                      const float* scale, const float* fbias, int64_t row0) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t c = (row0 + r) % channels;
    // wrapping int32 sum (numpy's int32 Add), through uint32 to stay defined
    const uint32_t b = bias ? static_cast<uint32_t>(bias[c]) : 0u;
    const float s = scale[c];
    const int32_t* ar = acc + r * inner;
    float* yr = y + r * inner;
    if (fbias) {
      const float fb = fbias[c];
      for (int64_t i = 0; i < inner; ++i) {
        const float f = static_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(ar[i]) + b));
        const float t = f * s;
        yr[i] = t + fb;
      }
    } else {
      for (int64_t i = 0; i < inner; ++i) {
        const float f = static_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(ar[i]) + b));
        yr[i] = f * s;
      }
    }
  }
}

template <typename T>
constexpr int dtype_index() {
  if constexpr (std::is_same_v<T, float>) return 0;
  if constexpr (std::is_same_v<T, double>) return 1;
  if constexpr (std::is_same_v<T, int8_t>) return 2;
  if constexpr (std::is_same_v<T, uint8_t>) return 3;
  if constexpr (std::is_same_v<T, int32_t>) return 4;
  if constexpr (std::is_same_v<T, int64_t>) return 5;
  return 6;  // bool
}

template <typename From, typename... Tos>
void fill_cast_row(Kernels& k) {
  ((k.cast[dtype_index<From>()][dtype_index<Tos>()] = &cast_run<From, Tos>), ...);
}

template <typename T>
void fill_compare(Kernels& k) {
  k.compare[dtype_index<T>()][0] = &compare_run<T, 0>;
  k.compare[dtype_index<T>()][1] = &compare_run<T, 1>;
  k.compare[dtype_index<T>()][2] = &compare_run<T, 2>;
  k.compare[dtype_index<T>()][3] = &compare_run<T, 3>;
  k.compare[dtype_index<T>()][4] = &compare_run<T, 4>;
}

// tensor_ops.h ClipGateDivFn. A bound that is NaN or infinite is no bound, as in the twin
// (nn_conv.fused_gate applies max only for lo > −inf, min only for hi < inf); it becomes
// ∓inf, which max / min return the other operand against. The vector loop takes
// vmaxps(lo, t) / vminps(hi, m) for the clip, which differ from np_max(t, lo) /
// np_min(m, hi) only on ties of signed zeros: t = f32(y + b) is −0 only when b is −0 (an
// exact cancellation rounds to +0), and m = max(t, lo) is then −0 only when lo is; so
// b = −0 or a −0 bound takes the scalar loop.
void clip_gate_div_run(float* y, int64_t n, const float* p) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float b = p[0], lo = p[1] > -kInf ? p[1] : -kInf, hi = p[2] < kInf ? p[2] : kInf, d = p[3];
  int64_t i = 0;
#if QUANTA_TENSOR_OPS_VECTORS
  using V = VecF32;
  const auto negative_zero = [](float v) { return v == 0.0f && std::signbit(v); };
  if (!negative_zero(b) && !negative_zero(lo) && !negative_zero(hi)) {
    const typename V::V vb = V::set1(b), vlo = V::set1(lo), vhi = V::set1(hi), vd = V::set1(d);
    for (; i + V::kLanes <= n; i += V::kLanes) {
      const typename V::V v = V::loadu(y + i);
      const typename V::V t = V::min(vhi, V::max(vlo, V::add(v, vb)));
      V::storeu(y + i, V::div(V::mul(v, t), vd));
    }
  }
#endif
  for (; i < n; ++i) {
    const float t = np_min(np_max(y[i] + b, lo), hi);
    y[i] = (y[i] * t) / d;
  }
}

Kernels make_kernels(const char* isa) {
  Kernels k{};
  k.isa = isa;
  k.unary_f32[0] = &unary_f32_run<0>;
  k.unary_f32[1] = &unary_f32_run<1>;
  k.unary_f32[2] = &unary_f32_run<2>;
  k.unary_f32[3] = &unary_f32_run<3>;
  k.unary_f32[4] = &unary_f32_run<4>;
  k.unary_f32[5] = &unary_f32_run<5>;
  k.unary_f32[6] = &unary_f32_run<6>;
  k.unary_f32[7] = &unary_f32_run<7>;
  k.unary_f32[8] = &unary_f32_run<8>;
  k.unary_f32[9] = &unary_f32_run<9>;
  k.clip_int[2] = &clip_int_run<int8_t>;
  k.clip_int[3] = &clip_int_run<uint8_t>;
  k.clip_int[4] = &clip_int_run<int32_t>;
  k.clip_int[5] = &clip_int_run<int64_t>;
  fill_cast_row<float, float, double, int8_t, uint8_t, int32_t, int64_t, bool>(k);
  fill_cast_row<double, float, double, int8_t, uint8_t, int32_t, int64_t, bool>(k);
  fill_cast_row<int8_t, float, double, int8_t, uint8_t, int32_t, int64_t, bool>(k);
  fill_cast_row<uint8_t, float, double, int8_t, uint8_t, int32_t, int64_t, bool>(k);
  fill_cast_row<int32_t, float, double, int8_t, uint8_t, int32_t, int64_t, bool>(k);
  fill_cast_row<int64_t, float, double, int8_t, uint8_t, int32_t, int64_t, bool>(k);
  fill_cast_row<bool, float, double, int8_t, uint8_t, int32_t, int64_t, bool>(k);
  k.binary_int[1][0] = &binary_int_run<double, 0>;
  k.binary_int[1][1] = &binary_int_run<double, 1>;
  k.binary_int[1][2] = &binary_int_run<double, 2>;
  k.binary_int[1][3] = &binary_int_run<double, 3>;
  k.binary_int[1][4] = &binary_int_run<double, 4>;
  k.binary_int[1][5] = &binary_int_run<double, 5>;
  k.binary_int[4][0] = &binary_int_run<int32_t, 0>;
  k.binary_int[4][1] = &binary_int_run<int32_t, 1>;
  k.binary_int[4][2] = &binary_int_run<int32_t, 2>;
  k.binary_int[4][3] = &binary_int_run<int32_t, 3>;
  k.binary_int[4][4] = &binary_int_run<int32_t, 4>;
  k.binary_int[4][5] = &binary_int_run<int32_t, 5>;
  k.binary_int[4][6] = &binary_int_run<int32_t, 6>;
  k.binary_int[4][7] = &binary_int_run<int32_t, 7>;
  k.binary_int[5][0] = &binary_int_run<int64_t, 0>;
  k.binary_int[5][1] = &binary_int_run<int64_t, 1>;
  k.binary_int[5][2] = &binary_int_run<int64_t, 2>;
  k.binary_int[5][3] = &binary_int_run<int64_t, 3>;
  k.binary_int[5][4] = &binary_int_run<int64_t, 4>;
  k.binary_int[5][5] = &binary_int_run<int64_t, 5>;
  k.binary_int[5][6] = &binary_int_run<int64_t, 6>;
  k.binary_int[5][7] = &binary_int_run<int64_t, 7>;
  fill_compare<float>(k);
  fill_compare<double>(k);
  fill_compare<int8_t>(k);
  fill_compare<uint8_t>(k);
  fill_compare<int32_t>(k);
  fill_compare<int64_t>(k);
  fill_compare<bool>(k);
  k.logic[0] = &logic_run<0>;
  k.logic[1] = &logic_run<1>;
  k.logic[2] = &logic_run<2>;
  k.reduce[0] = &reduce_run<0>;
  k.reduce[1] = &reduce_run<1>;
  k.reduce[2] = &reduce_run<2>;
  k.reduce[3] = &reduce_run<3>;
  k.reduce[4] = &reduce_run<4>;
  k.reduce_middle[0] = &reduce_middle_run<0>;
  k.reduce_middle[1] = &reduce_middle_run<1>;
  k.reduce_middle[2] = &reduce_middle_run<2>;
  k.reduce_middle[3] = &reduce_middle_run<3>;
  k.reduce_middle[4] = &reduce_middle_run<4>;
  fill_reduce_int<int32_t>(k, DType::kI32);
  fill_reduce_int<int64_t>(k, DType::kI64);
  k.resize_axis = &resize_axis_run;
  k.batch_norm = &batch_norm_run;
  k.acc_to_float = &acc_to_float_run;
  k.clip_gate_div = &clip_gate_div_run;
  return k;
}
