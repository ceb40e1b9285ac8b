// Integer-only kernels (intonly.h); the numbered equations are docs/passes.md's (IO*).
#include "intonly/intonly.h"

#include <cmath>
#include <cstdlib>
#include <vector>

namespace quanta {
namespace intonly {

namespace {

// gemmlowp SaturatingRoundingDoublingHighMul: round(a·b / 2^31), ties up; C++ division
// truncates toward zero as the golden's does.
int32_t srdhm(int32_t a, int32_t b) {
  if (a == INT32_MIN && b == INT32_MIN) return INT32_MAX;
  const int64_t ab = static_cast<int64_t>(a) * static_cast<int64_t>(b);
  const int64_t nudge = ab >= 0 ? (int64_t{1} << 30) : (1 - (int64_t{1} << 30));
  return static_cast<int32_t>((ab + nudge) / (int64_t{1} << 31));
}

// gemmlowp RoundingDivideByPOT: ties away from zero.
int32_t rdbpot(int32_t x, int32_t e) {
  const int64_t mask = (int64_t{1} << e) - 1;
  const int64_t rem = static_cast<int64_t>(x) & mask;
  const int64_t thr = (mask >> 1) + (x < 0 ? 1 : 0);
  return static_cast<int32_t>((static_cast<int64_t>(x) >> e) + (rem > thr ? 1 : 0));
}

int32_t param(const int32_t* p, int64_t n_params, int64_t i) { return n_params == 1 ? p[0] : p[i]; }

}  // namespace

int64_t apply_scale(int64_t acc, int32_t multiplier, int32_t shift, Rounding r) {
  if (r == Rounding::kDouble) {
    const int32_t left = shift > 0 ? shift : 0;
    const int32_t right = shift > 0 ? 0 : -shift;
    const int32_t shifted = wrap32(static_cast<int64_t>(static_cast<uint64_t>(acc) << left));
    return rdbpot(srdhm(shifted, multiplier), right);
  }
  const int64_t total = 31 - static_cast<int64_t>(shift);  // [1, 62]
  int64_t rnd = int64_t{1} << (total - 1);
  if (r == Rounding::kTosa && total > 31) rnd += acc >= 0 ? (int64_t{1} << 30) : -(int64_t{1} << 30);
  return (acc * static_cast<int64_t>(multiplier) + rnd) >> total;
}

void requantize(const int32_t* acc, int64_t outer, int64_t channels, int64_t inner, const int32_t* mult,
                const int32_t* shift, int64_t n_params, int32_t zy, int32_t lo, int32_t hi, Rounding r, int32_t* y) {
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t c = 0; c < channels; ++c) {
      const int32_t m = param(mult, n_params, c), s = param(shift, n_params, c);
      const int64_t base = (o * channels + c) * inner;
      for (int64_t i = 0; i < inner; ++i) y[base + i] = clamp(apply_scale(acc[base + i], m, s, r) + zy, lo, hi);
    }
  }
}

void matmul(const int32_t* a, const int32_t* b, const int32_t* c, int64_t batch, int64_t batch_b, int64_t m, int64_t k,
            int64_t n, int32_t za, int32_t zb, int32_t zy, const int32_t* mult, const int32_t* shift, int64_t n_params,
            int32_t lo, int32_t hi, Rounding r, int32_t* y) {
  std::vector<int32_t> bt(static_cast<size_t>(k * n));
  std::vector<int64_t> colsum(static_cast<size_t>(n));
  for (int64_t bi = 0; bi < batch; ++bi) {
    const int32_t* bb = b + (batch_b == 1 ? 0 : bi) * k * n;
    if (bi == 0 || batch_b != 1) {
      for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t j = 0; j < n; ++j) bt[j * k + kk] = bb[kk * n + j];
      for (int64_t j = 0; j < n; ++j) {
        int64_t s = 0;
        for (int64_t kk = 0; kk < k; ++kk) s += bt[j * k + kk];
        colsum[j] = s;
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      const int32_t* ar = a + (bi * m + i) * k;
      int64_t rowsum = 0;
      for (int64_t kk = 0; kk < k; ++kk) rowsum += ar[kk];
      for (int64_t j = 0; j < n; ++j) {
        const int32_t* bc = bt.data() + j * k;
        int64_t acc = 0;
        for (int64_t kk = 0; kk < k; ++kk) acc += static_cast<int64_t>(ar[kk]) * bc[kk];
        acc -= static_cast<int64_t>(zb) * rowsum;  // (IO4) the terms of b's zero point
        if (c != nullptr) {
          acc += c[j];  // bias - za·Σb + K·za·zb, folded at compile time
        } else {
          acc += -static_cast<int64_t>(za) * colsum[j] + k * static_cast<int64_t>(za) * zb;
        }
        const int32_t w = wrap32(acc);
        y[(bi * m + i) * n + j] =
            clamp(apply_scale(w, param(mult, n_params, j), param(shift, n_params, j), r) + zy, lo, hi);
      }
    }
  }
}

void conv2d(const int32_t* x, const int32_t* w, const int32_t* c, const Conv2d& g, int32_t zx, int32_t zy,
            const int32_t* mult, const int32_t* shift, int64_t n_params, int32_t lo, int32_t hi, Rounding r,
            int32_t* y) {
  const int64_t cg = g.ci / g.group, mg = g.co / g.group;
  for (int64_t nb = 0; nb < g.n; ++nb) {
    for (int64_t mo = 0; mo < g.co; ++mo) {
      const int64_t grp = mo / mg;
      const int32_t* wm = w + mo * cg * g.kh * g.kw;
      const int32_t m = param(mult, n_params, mo), s = param(shift, n_params, mo);
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        for (int64_t ox = 0; ox < g.ow; ++ox) {
          int64_t acc = 0;
          for (int64_t ci = 0; ci < cg; ++ci) {
            const int32_t* xc = x + ((nb * g.ci) + grp * cg + ci) * g.h * g.w;
            const int32_t* wc = wm + ci * g.kh * g.kw;
            for (int64_t ky = 0; ky < g.kh; ++ky) {
              const int64_t iy = oy * g.stride[0] + ky * g.dilation[0] - g.pad[0];
              for (int64_t kx = 0; kx < g.kw; ++kx) {
                const int64_t ix = ox * g.stride[1] + kx * g.dilation[1] - g.pad[1];
                const bool in = iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
                const int64_t xv = in ? xc[iy * g.w + ix] : zx;  // padding holds the real 0
                acc += xv * wc[ky * g.kw + kx];
              }
            }
          }
          acc += c[mo];  // bias - zx·Σw (IO4)
          y[((nb * g.co + mo) * g.oh + oy) * g.ow + ox] = clamp(apply_scale(wrap32(acc), m, s, r) + zy, lo, hi);
        }
      }
    }
  }
}

void add(const int32_t* a, const int32_t* b, int64_t size, const AddParams& p, Rounding r, int32_t* y) {
  for (int64_t i = 0; i < size; ++i) {
    // times 2^left, not << left: the centred codes are negative half the time, and a left
    // shift of a negative value is undefined before C++20 (UBSan)
    const int64_t a1 = apply_scale((static_cast<int64_t>(a[i]) - p.za) * (int64_t{1} << p.left), p.am, p.as, r);
    const int64_t b1 = apply_scale((static_cast<int64_t>(b[i]) - p.zb) * (int64_t{1} << p.left), p.bm, p.bs, r);
    y[i] = clamp(apply_scale(wrap32(a1 + b1), p.m, p.s, r) + p.zy, p.lo, p.hi);  // (IO5)
  }
}

void mul(const int32_t* a, const int32_t* b, int64_t size, int32_t za, int32_t zb, int32_t zy, int32_t m, int32_t s,
         int32_t lo, int32_t hi, Rounding r, int32_t* y) {
  for (int64_t i = 0; i < size; ++i) {
    const int64_t prod = (static_cast<int64_t>(a[i]) - za) * (static_cast<int64_t>(b[i]) - zb);
    y[i] = clamp(apply_scale(wrap32(prod), m, s, r) + zy, lo, hi);  // (IO6)
  }
}

void softmax(const int32_t* x, int64_t rows, int64_t n, const int32_t* exp_table, int32_t y_shift, int32_t zy,
             int32_t lo, int32_t hi, int32_t* y) {
  for (int64_t row = 0; row < rows; ++row) {
    const int32_t* xr = x + row * n;
    int32_t mx = xr[0];
    for (int64_t i = 1; i < n; ++i) mx = xr[i] > mx ? xr[i] : mx;
    int64_t total = 0;
    for (int64_t i = 0; i < n; ++i) total += exp_table[mx - xr[i]];
    for (int64_t i = 0; i < n; ++i) {
      const int64_t num = static_cast<int64_t>(exp_table[mx - xr[i]]) << y_shift;
      y[row * n + i] = clamp((2 * num + total) / (2 * total) + zy, lo, hi);  // (IO7), half up
    }
  }
}

int64_t isqrt(int64_t v) {
  if (v <= 0) return 0;
  int bits = 0;
  for (uint64_t t = static_cast<uint64_t>(v); t; t >>= 1) ++bits;
  int64_t r = int64_t{1} << ((bits + 1) >> 1);  // >= sqrt(v)
  for (;;) {
    const int64_t next = (r + v / r) >> 1;
    if (next >= r) return r;
    r = next;
  }
}

int64_t int_exp(int64_t d, int64_t x0, int64_t b, int64_t c, int32_t exp_shift) {
  const int64_t ln2 = -x0;
  const int64_t z = d / ln2;
  const int64_t r = -(d - z * ln2);
  const int64_t p = (r + b) * (r + b) + c;
  const int64_t sh = z - exp_shift;
  if (sh >= 63) return 0;
  return sh >= 0 ? p >> sh : p << (-sh);
}

void softmax_poly(const int32_t* x, int64_t rows, int64_t n, const ExpPoly& e, int32_t y_shift, int32_t zy, int32_t lo,
                  int32_t hi, int32_t* y) {
  std::vector<int64_t> ebuf(static_cast<size_t>(n));
  for (int64_t row = 0; row < rows; ++row) {
    const int32_t* xr = x + row * n;
    int32_t mx = xr[0];
    for (int64_t i = 1; i < n; ++i) mx = xr[i] > mx ? xr[i] : mx;
    int64_t total = 0;
    for (int64_t i = 0; i < n; ++i) {
      ebuf[i] = int_exp(static_cast<int64_t>(mx) - xr[i], e.x0, e.b, e.c, e.shift);
      total += ebuf[i];
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t num = ebuf[i] << y_shift;
      y[row * n + i] = clamp((2 * num + total) / (2 * total) + zy, lo, hi);  // (IO7), half up
    }
  }
}

int64_t gelu(const int32_t* x, int64_t size, const GeluPoly& g, int32_t lo, int32_t hi, Rounding r, int32_t* y) {
  for (int64_t i = 0; i < size; ++i) {
    const int64_t d = static_cast<int64_t>(x[i]) - g.zx;
    const int64_t u = d < 0 ? (-d < g.b ? -d : g.b) : (d < g.b ? d : g.b);
    const int64_t L = g.c - (g.b - u) * (g.b - u);
    int64_t q = d * (g.c + (d > 0 ? L : (d < 0 ? -L : 0)));  // (IO13)
    if (g.pre_shift) q = (q + (int64_t{1} << (g.pre_shift - 1))) >> g.pre_shift;
    if (q < INT32_MIN || q > INT32_MAX) return i;
    y[i] = clamp(apply_scale(q, g.multiplier, g.shift, r) + g.zy, lo, hi);
  }
  return -1;
}

void layer_norm(const int32_t* x, int64_t rows, int64_t n, const int32_t* g, const int32_t* b, int32_t zx, int32_t zy,
                int64_t eps, int32_t gamma_shift, int32_t lo, int32_t hi, int32_t* y) {
  std::vector<int64_t> cbuf(static_cast<size_t>(n));
  for (int64_t row = 0; row < rows; ++row) {
    const int32_t* xr = x + row * n;
    int64_t sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<int64_t>(xr[i]) - zx;
    int64_t sq = 0;
    for (int64_t i = 0; i < n; ++i) {
      cbuf[i] = n * (static_cast<int64_t>(xr[i]) - zx) - sum;  // n·(d - mean), exact
      sq += cbuf[i] * cbuf[i];
    }
    int64_t den = isqrt((sq + eps) / n);  // (IO8)
    if (den < 1) den = 1;
    const int64_t d2 = den << gamma_shift;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t num = cbuf[i] * g[i] + static_cast<int64_t>(b[i]) * den;
      const int64_t mag = (std::llabs(num) * 2 + d2) / (2 * d2);  // ties away from zero
      y[row * n + i] = clamp((num < 0 ? -mag : mag) + zy, lo, hi);
    }
  }
}

void lookup16(const int32_t* x, int64_t size, const int32_t* table, int32_t* y) {
  for (int64_t i = 0; i < size; ++i) {
    const int32_t u = x[i] + 32768;  // [0, 65535]
    const int32_t base = table[u >> 7];
    const int32_t slope = table[(u >> 7) + 1] - base;
    y[i] = base + ((slope * (u & 127) + 64) >> 7);  // (IO14); |slope·o| < 2^23
  }
}

}  // namespace intonly
}  // namespace quanta
