"""TFLite's int16 lookup table with linear interpolation (eq. (IO14)): the golden against
float math over the whole int16 range, the npu-sim C++ kernel against the golden
(bit-exact), and the lowering of a 16-bit GELU to it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.kernels.reference import intonly as g
from quanta.passes.lower.integer_only import lut16_table
from tests.intonly.test_kernels import HAS_NATIVE, both, native, node, rand


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), saturate=st.booleans())
def test_lookup16_native_equals_golden(seed, saturate):
    rng = np.random.default_rng(seed)
    table = rand(rng, (513,), np.int16)
    if saturate:  # the steepest slopes: -32768 next to 32767
        table[::2], table[1::2] = -32768, 32767
    x = np.concatenate([rand(rng, (5, 41), np.int16).reshape(-1), [-32768, -32641, -1, 0, 127, 128, 32767]])
    x = x.astype(np.int16).reshape(4, -1)
    y = both(node("IntLookup", [x, table], "int16", function="f"), [x, table])
    u = x.astype(np.int64) + 32768
    j, o = u >> 7, u & 127
    lo = np.minimum(table[j], table[j + 1])
    hi = np.maximum(table[j], table[j + 1])
    assert np.all((y >= lo) & (y <= hi))  # between the two samples it interpolates
    np.testing.assert_array_equal(y[o == 0], table[j[o == 0]])  # exact at every sample


@pytest.mark.parametrize("sx", [2e-4, 1e-3, 3e-3])
@pytest.mark.parametrize("zx,zy", [(0, 0), (-37, 11)])
def test_gelu_table_follows_float_gelu_over_the_whole_int16_range(sx, zx, zy):
    s = float(np.float32(sx))
    x = np.arange(-32768, 32768, dtype=np.int64)
    xf = (x - zx) * s
    ref = _gelu(xf)
    sy = float(np.float32(np.abs(ref).max() / 32000))
    table = lut16_table(_gelu, sx, zx, sy, zy)
    y = g.int_lookup(x.astype(np.int16), table)
    got = (y.astype(np.float64) - zy) * sy
    # linear interpolation over a step h = 128·sx errs by at most h²/8·max|GELU''| (GELU'' =
    # φ(x)(2 - x²) <= 2φ(0) = 0.798); the samples round (1/2 step), the midpoint shift moves
    # them by at most 1/2 step more, the interpolation rounds (1/2 step)
    h = 128 * s
    err = np.abs(got - ref)
    assert err.max() <= h * h / 8 * 0.798 + 1.5 * sy
    if sx <= 1e-3:  # five times inside I-BERT's i-GELU error (0.018)
        assert err.max() <= 0.018 / 5


def test_lookup16_refuses_a_table_of_the_wrong_size():
    x = np.zeros((2, 3), np.int16)
    with pytest.raises(g.OpError, match="513 int16"):
        g.int_lookup(x, np.zeros(256, np.int16))
    if HAS_NATIVE:
        with pytest.raises(ValueError, match="513 values"):
            native.intonly_lookup16(x.astype(np.int32), np.zeros(256, np.int32))
        with pytest.raises(ValueError, match="int16 values"):
            native.intonly_lookup16(np.array([40000], np.int32), np.zeros(513, np.int32))
