"""Pair-safe int8 weights (quanta/quantize/ort_pairs.py, docs/debugger.md eq. (12m)): codes
whose pairs, in ONNX Runtime's order, no uint8 input overflows in its saturating int16
kernels, so ORT's fused QLinearConv / MatMulInteger compute the file exactly on every CPU."""

from __future__ import annotations

import itertools
import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.cli.main import main
from quanta.kernels.reference import mlas_qconv
from quanta.kernels.reference.mlas_qconv import mlas_qlinear_conv, saturation_correction
from quanta.quantize.ort_pairs import conv_partners, k_partners, pair_excess, pair_partners, project_pairs
from quanta.quantize.ort_saturation import onnxruntime_int8_saturates, saturating_weights
from quanta.quantize.recipe import Recipe, RecipeError
from quanta.quantize.rounding import (
    NARROW_GRIDS,
    gptq_round_groups,
    nearest_codes,
    refine_held_out,
    refine_rounding,
)
from tests.quantize.test_static import assert_reference_matches_ort_on_quantized_tensors

ort = pytest.importorskip("onnxruntime")

CONVS = [(3, (3, 3)), (7, (3, 3)), (17, (3, 3)), (7, (1, 5))]  # C, kernel: K = 27, 63, 153, 35
QMIN, QMAX = -127, 127


def ort_order(w: np.ndarray) -> np.ndarray:
    """A Conv weight [F, C, kernel...] as the rows MLAS multiplies, k = (kernel..., c)
    (reference/mlas_qconv.py (QC1))."""
    return w.transpose(0, *range(2, w.ndim), 1).reshape(w.shape[0], -1)


def direct_excess(rows: np.ndarray) -> np.ndarray:
    """Eq. (12m)'s excess of the pairs (2j, 2j + 1) of ``rows`` [F, K], K padded with a zero."""
    r = np.pad(rows.astype(np.int64), ((0, 0), (0, rows.shape[1] % 2)))
    a, b = r[:, 0::2], r[:, 1::2]
    pos = np.maximum(a, 0) + np.maximum(b, 0)
    neg = np.maximum(-a, 0) + np.maximum(-b, 0)
    return np.maximum(np.maximum(pos, neg) - 128, 0)


def heavy_weights(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Weights of one sign per filter with a heavy tail: at 127 / absmax the largest codes
    meet in pairs that overflow ORT's int16."""
    w = np.abs(rng.standard_t(3, size=shape)) + 0.5
    sign = np.where(rng.random((shape[0],) + (1,) * (len(shape) - 1)) < 0.5, -1.0, 1.0)
    return (w * sign).astype(np.float32)


@pytest.mark.parametrize(("c", "kernel"), CONVS)
def test_conv_partners_pair_as_mlas_does(c, kernel):
    """Partners in quanta's (c, taps) column order give ORT's (taps, c) pairs: the same
    excess, pair for pair (each pair counted from both of its columns)."""
    rng = np.random.default_rng(c)
    w = rng.integers(-128, 128, (5, c, *kernel)).astype(np.int8)
    partners = conv_partners(c, kernel)
    assert sorted(partners[partners >= 0].tolist()) == [i for i in range(partners.size) if partners[i] >= 0]
    got = pair_excess(w.reshape(5, -1), partners)
    want = direct_excess(ort_order(w))
    assert want.sum() > 0
    assert got.sum() == 2 * want.sum()
    np.testing.assert_array_equal(np.sort(got, axis=1)[:, ::2][:, -want.shape[1] :], np.sort(want, axis=1))


def test_k_partners_leave_an_odd_tail_alone():
    p = k_partners(301)
    assert p[-1] == -1 and p[299] == 298 and (p[p >= 0][p[p >= 0]] == np.flatnonzero(p >= 0)).all()
    assert pair_partners("Gemm", (9, 301), trans_b=True).tolist() == p.tolist()
    assert pair_partners("MatMul", (301, 9)).tolist() == p.tolist()


def test_projection_is_the_nearest_safe_pair():
    """Every pair project_pairs moves lands on the integer pair of least squared error
    among all pairs of the grid that keep eq. (12m) (brute force); pairs that keep it
    are untouched."""
    rng = np.random.default_rng(3)
    u = rng.uniform(-127.4, 127.4, (400, 2))
    u[:200] = np.abs(u[:200]) * np.sign(rng.uniform(-1, 1, (200, 1)))  # same-sign pairs
    near = np.clip(np.rint(u), QMIN, QMAX)
    got, moved = project_pairs(u, near, k_partners(2), QMIN, QMAX)
    grid = np.array(list(itertools.product(range(QMIN, QMAX + 1), repeat=2)))
    safe = grid[direct_excess(grid)[:, 0] == 0]
    bad = direct_excess(near)[:, 0] > 0
    assert bad.sum() > 20 and moved >= bad.sum()
    np.testing.assert_array_equal(got[~bad], near[~bad])
    assert (direct_excess(got) == 0).all()
    for i in np.flatnonzero(bad):
        best = ((safe - u[i]) ** 2).sum(axis=1).min()
        assert ((got[i] - u[i]) ** 2).sum() == pytest.approx(best, abs=1e-9)


def layer(rng: np.random.Generator, shape: tuple[int, ...]):
    """(W [1, rows, K], s [1, rows], H [1, K, K]): per-row absmax scales, H of ReLU-like inputs."""
    w = heavy_weights(rng, shape).astype(np.float64).reshape(shape[0], -1)
    s = np.abs(w).max(axis=1) / QMAX
    x = np.abs(rng.standard_normal((4 * w.shape[1], w.shape[1])))
    return w[None], s[None], (x.T @ x)[None]


def objective(w, s, h, q):
    d = w - s[..., None] * q
    return float(np.einsum("grk,gkl,grl->", d, h, d))


LAYERS = [("Conv", (6, c, *k)) for c, k in CONVS] + [("MatMul", (301, 9))]


@pytest.mark.parametrize(("op", "shape"), LAYERS)
def test_gptq_keeps_the_pairs_within_the_stated_bound(op, shape):
    """GPTQ with the constraint keeps eq. (12m) on every pair in ORT's order, and errs, on
    its own objective, no more than nearest rounding under the same constraint (the
    stated bound: the clamp error is fed forward like a rounding error); gptq_cd and the
    held-out steps keep eq. (12m) and never raise the objective."""
    rng = np.random.default_rng(sum(shape))
    rows_shape = (shape[1], shape[0]) if op == "MatMul" else shape
    w, s, h = layer(rng, rows_shape)
    partners = pair_partners(op, shape)
    free = gptq_round_groups(w, s, h, QMIN, QMAX)
    assert pair_excess(free[0], partners).any()  # the full-range codes overflow
    q = gptq_round_groups(w, s, h, QMIN, QMAX, partners=partners)
    near = nearest_codes(w, s, QMIN, QMAX, partners)
    assert not pair_excess(q[0], partners).any() and not pair_excess(near[0], partners).any()
    assert objective(w, s, h, q) <= objective(w, s, h, near)
    assert objective(w, s, h, free) <= objective(w, s, h, q)  # the constraint has a cost
    cd = refine_rounding(w, s, h, q, QMIN, QMAX, partners=partners)
    assert not pair_excess(cd[0], partners).any()
    assert objective(w, s, h, cd) <= objective(w, s, h, q)
    held = refine_held_out(w, s, h, h / 2, q, QMIN, QMAX, partners=partners)
    assert not pair_excess(held[0], partners).any()
    # the constrained loop without any pair to constrain is GPTQ itself (native loop)
    lone = np.full_like(partners, -1)
    np.testing.assert_array_equal(gptq_round_groups(w, s, h, QMIN, QMAX, partners=lone), free)


def adversarial_rows(wk: np.ndarray) -> np.ndarray:
    """uint8 rows that push each filter's pairs hardest: 255 where its codes are positive
    (and 0 elsewhere), 255 where negative, all 255, all 0."""
    rows = [np.where(wk > 0, 255, 0), np.where(wk < 0, 255, 0)]
    return np.concatenate([*rows, np.full((2, wk.shape[1]), 255), np.zeros((1, wk.shape[1]))]).astype(
        np.uint8
    )


def conv_case(c: int, kernel: tuple[int, int], pairs: bool):
    """QLinearConv operands of heavy float weights rounded to nearest, with eq. (12m) or
    without: x [N, C, kh, kw] whose only output position sees one adversarial row each."""
    rng = np.random.default_rng(c + len(kernel))
    f = 5
    w = heavy_weights(rng, (f, c, *kernel)).astype(np.float64)
    sw = (np.abs(w).reshape(f, -1).max(axis=1) / QMAX).astype(np.float32)
    partners = conv_partners(c, kernel) if pairs else None
    q = nearest_codes(w.reshape(1, f, -1), sw[None].astype(np.float64), QMIN, QMAX, partners)[0]
    wq = q.reshape(w.shape).astype(np.int8)
    wk = ort_order(wq)
    rows = adversarial_rows(wk)
    # row (kernel..., c) back to an image [C, kernel...]
    x = rows.reshape(-1, *kernel, c).transpose(0, 3, 1, 2).copy()
    b = rng.integers(-3000, 3000, f).astype(np.int32)
    args = (
        x,
        np.array(0.02, np.float32),
        np.array(121, np.uint8),
        wq,
        sw,
        np.zeros(f, np.int8),
        # the output step from the accumulator's reach (255 · Σ|w| per filter), so no output clips
        np.array(0.02 * (255 * np.abs(wk.astype(np.float64)).sum(axis=1) * sw).max() / 100, np.float32),
        np.array(117, np.uint8),
        b,
    )
    return args, rows, wk


def ort_qlinear_conv(args, kernel) -> np.ndarray:
    x, sx, zx, w, sw, zw, sy, zy, b = args
    values = dict(sx=sx, zx=zx, w=w, sw=sw, zw=zw, sy=sy, zy=zy, b=b)
    node = helper.make_node("QLinearConv", ["x", *values], ["y"], kernel_shape=list(kernel))
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in values.items()],
    )
    return _run(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), x)


def _run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def exact_conv(args, monkeypatch) -> np.ndarray:
    """(QC1)-(QC4) with the exact sum: the saturating twin with nothing taken by saturation."""
    with monkeypatch.context() as m:
        m.setattr(
            mlas_qconv, "saturation_correction", lambda a, w: np.zeros((a.shape[0], w.shape[0]), np.int64)
        )
        return mlas_qlinear_conv(*args)


@pytest.mark.parametrize(("c", "kernel"), CONVS)
def test_pair_safe_conv_is_exact_in_the_twin_and_in_onnxruntime(c, kernel, monkeypatch):
    """On adversarial uint8 inputs, full-range codes lose to MLAS's saturation (the twin
    and, on a CPU without VNNI, ORT itself differ from the exact sum); the same weights
    with eq. (12m) lose nothing: the twin's saturation takes 0 and ORT's QLinearConv gives
    the exact result, on this host whatever its CPU."""
    full, rows_full, wk_full = conv_case(c, kernel, pairs=False)
    assert saturation_correction(rows_full, wk_full).any()
    if onnxruntime_int8_saturates():
        assert (ort_qlinear_conv(full, kernel) != exact_conv(full, monkeypatch)).any()
    safe, rows, wk = conv_case(c, kernel, pairs=True)
    assert not saturation_correction(rows, wk).any()
    exact = exact_conv(safe, monkeypatch)
    np.testing.assert_array_equal(mlas_qlinear_conv(*safe), exact)
    np.testing.assert_array_equal(ort_qlinear_conv(safe, kernel), exact)


def matmul_integer(x: np.ndarray, w: np.ndarray, zx: int) -> np.ndarray:
    """ONNX Runtime's MatMulInteger (uint8 x, int8 w): int32 out, no requantization."""
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(zx, np.uint8), "zx")]
    node = helper.make_node("MatMulInteger", ["x", "w", "zx"], ["y"])
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
        initializer=inits,
    )
    return _run(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), x)


@pytest.mark.parametrize("rounding", ["nearest", "gptq"])
def test_pair_safe_matmul_k301_is_exact_in_onnxruntime(rounding):
    """A MatMul of K = 301 (pairs across K, the odd last code alone): with eq. (12m),
    ORT's MatMulInteger equals the exact int64 product on adversarial rows; without it
    (on a CPU without VNNI) it does not."""
    rng = np.random.default_rng(301)
    w, s, h = layer(rng, (9, 301))  # rows = N
    partners = k_partners(301)
    zx = 37

    def codes(p):
        if rounding == "nearest":
            return nearest_codes(w, s, QMIN, QMAX, p)[0]
        return gptq_round_groups(w, s, h, QMIN, QMAX, partners=p)[0]

    for p in (None, partners):
        q = codes(p).astype(np.int8)  # [N, K]
        x = adversarial_rows(q)
        exact = (x.astype(np.int64) - zx) @ q.T.astype(np.int64)
        got = matmul_integer(x, np.ascontiguousarray(q.T), zx)
        if p is None:
            assert saturation_correction(x, q).any()
            if onnxruntime_int8_saturates():
                assert (got != exact).any()
        else:
            assert not saturation_correction(x, q).any()
            np.testing.assert_array_equal(got, exact)


def convs_and_matmul() -> onnx.ModelProto:
    """Conv(3->7, 3x3) -> Relu -> Conv(7->17, 3x3) -> Relu -> Conv(17->6, 3x3) -> Relu ->
    Flatten -> MatMul(K = 6·7·7 = 294 -> 5), heavy one-signed weights per filter."""
    rng = np.random.default_rng(11)
    inits, nodes, prev = [], [], "x"
    for i, (ci, co) in enumerate([(3, 7), (7, 17), (17, 6)]):
        w = heavy_weights(rng, (co, ci, 3, 3)) * np.float32(0.3 / np.sqrt(ci * 9))
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.full(co, 0.05, np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node("Conv", [prev, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"),
            helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        prev = f"r{i}"
    wm = (heavy_weights(rng, (5, 294)).T * np.float32(0.05)).copy()
    inits.append(numpy_helper.from_array(wm, "wm"))
    nodes += [
        helper.make_node("Flatten", [prev], ["f"], name="flat"),
        helper.make_node("MatMul", ["f", "wm"], ["y"], name="mm"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])],
        initializer=inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": np.abs(rng.standard_normal((1, 3, 7, 7))).astype(np.float32) * 2} for _ in range(n)]


@pytest.mark.parametrize(
    ("rounding", "mode"), [("gptq", "ort"), ("gptq_cd", "ort"), ("nearest", "ort"), ("gptq", "ort_rows")]
)
def test_quantize_static_writes_pair_safe_weights(tmp_path, rounding, mode):
    """quantize_static with weight_pairs="ort": every int8 weight of the file keeps eq.
    (12m) in the order of the op that reads it (saturating_weights names none, where the
    full-range file has some), scales unchanged and codes past the 7-bit grid's 64, and
    ONNX Runtime's fused kernels agree with quanta's reference on every quantized tensor."""
    src = tmp_path / "m.onnx"
    onnx.save(convs_and_matmul(), src)
    files = {}
    for pairs in ("off", mode):
        out = tmp_path / f"{pairs}.onnx"
        quanta.quantize_static(
            src, out, feeds(8, 1), verbose=False, weight_rounding=rounding, weight_pairs=pairs
        )
        files[pairs] = onnx.load(str(out))
    assert len(saturating_weights(files["off"])) == 4
    assert saturating_weights(files[mode]) == []
    ints = {
        t.name: numpy_helper.to_array(t)
        for t in files[mode].graph.initializer
        if t.data_type == TensorProto.INT8 and t.name.endswith("_quantized")
    }
    # the 8-bit grid stays in use: codes beyond the 7-bit grid's 64
    assert len(ints) == 4
    if mode == "ort":
        assert all(int(np.abs(w.astype(np.int32)).max()) > 100 for w in ints.values())
    weight_scales = {"w0_scale", "w1_scale", "w2_scale", "wm_scale"}
    scales = [
        {n: numpy_helper.to_array(t).tobytes() for t in f.graph.initializer if (n := t.name) in weight_scales}
        for f in files.values()
    ]
    assert len(scales[0]) == 4
    if mode == "ort":
        assert scales[0] == scales[1]
    else:  # eq. (12n): rows on a narrower grid m have their scale raised by 127/m
        moved = [
            np.frombuffer(scales[1][n], np.float32) / np.frombuffer(scales[0][n], np.float32)
            for n in scales[0]
        ]
        ratios = np.concatenate(moved)
        grids = [np.isclose(ratios, 127 / m, rtol=1e-6) for m in (127, *NARROW_GRIDS)]
        assert sum(int(g.sum()) for g in grids) == ratios.size and grids[-1].any()
    assert_reference_matches_ort_on_quantized_tensors(
        tmp_path / f"{mode}.onnx", feeds(1, 5)[0], fused_int8=True
    )


def test_narrow_rows_take_the_smaller_error():
    """Eq. (12n): each row's error on the objective is the least of the pair-constrained
    8-bit codes' and each narrower grid's (NARROW_GRIDS), and its codes keep eq. (12m)
    whichever it takes."""
    from quanta.quantize.rounding import _narrow_rows

    rng = np.random.default_rng(5)
    w, s, h = layer(rng, (12, 7, 3, 3))
    # half the rows with opposite signs in every ORT pair: nothing to constrain, 8 bits win
    ort_k = np.argsort(ort_order(np.arange(w.shape[2]).reshape(1, 7, 3, 3))[0])
    w[:, :6] = np.abs(rng.standard_normal((6, w.shape[2]))) * np.where(ort_k % 2, -1.0, 1.0)
    s = np.abs(w).max(axis=2) / QMAX
    partners = conv_partners(7, (3, 3))
    q8 = gptq_round_groups(w, s, h, QMIN, QMAX, partners=partners)
    q, sc = _narrow_rows(w, s, h, None, q8, QMAX, partners)
    assert not pair_excess(q[0], partners).any()

    def rows_loss(q, sc):
        d = w - sc[..., None] * q
        return np.einsum("grk,grk->gr", np.matmul(d, h), d)

    losses = [rows_loss(q8, s)]
    for m in NARROW_GRIDS:
        sm = (s * 127 / m).astype(np.float32).astype(np.float64)
        qm = gptq_round_groups(w, sm, h, -m, m, partners=partners if m > 64 else None)
        losses.append(rows_loss(qm, sm))
    np.testing.assert_allclose(rows_loss(q, sc), np.min(losses, axis=0), rtol=1e-6)
    narrow = ~np.isclose(sc, s)
    assert narrow.any() and (~narrow).any()
    assert (np.abs(q[narrow]) <= max(NARROW_GRIDS)).all()


def test_recipe_and_cli(tmp_path, capsys):
    with pytest.raises(RecipeError, match="weight_pairs: expected one of ort, ort_rows, off, got 'on'"):
        Recipe(weight_pairs="on")
    src = tmp_path / "m.onnx"
    onnx.save(convs_and_matmul(), src)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.abs(np.random.default_rng(2).standard_normal((1, 3, 7, 7))).astype(np.float32))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--weight-pairs", "ort"]) == 0
    proto = onnx.load(str(out))
    assert json.loads(proto.metadata_props[0].value)["weight_pairs"] == "ort"
    assert saturating_weights(proto) == []
    capsys.readouterr()


@pytest.mark.parametrize("k", [2, 7, 259])
@pytest.mark.parametrize("n", [3, 17])
def test_the_quantizer_rule_is_the_kernels_pair_check(k, n):
    """Eq. (12m) on a MatMul's K pairs and quanta's own packing check (reference/qgemm.py
    pairs_fit_int16, eq. (K2)) accept the same int8 columns: a file the quantizer makes
    pair-safe runs quanta's vpmaddubsw family. Codes drawn near the bound (|w| 50-127, both
    signs, some pairs at or past the bound of 128), columns one at a time so each verdict
    is compared."""
    from quanta.kernels.reference.qgemm import pairs_fit_int16

    rng = np.random.default_rng(k * 31 + n)
    partners = pair_partners("MatMul", (k, n))
    verdicts = set()
    for _ in range(40):
        w = rng.integers(-3, 4, (k, n)).astype(np.int8)
        for col in range(n):
            big = rng.choice(k, size=min(k, 4), replace=False)  # a few large codes, random signs
            w[big, col] = rng.integers(60, 128, big.size) * rng.choice([-1, 1], big.size)
            if k > 1 and rng.random() < 0.5:  # a pair (2j, 2j + 1) of large codes, one sign
                j, sign = 2 * int(rng.integers(k // 2)), int(rng.choice([-1, 1]))
                w[j : j + 2, col] = sign * rng.integers(50, 128, 2)
        for col in range(n):
            rows = w[:, col][None]  # [1, K]: the quantizer's rows are a MatMul's columns
            safe = not pair_excess(rows, partners).any()
            assert safe == pairs_fit_int16(w[:, col : col + 1]), (k, n, col, w[:, col].tolist())
            verdicts.add(safe)
    assert verdicts == {True, False}  # both verdicts occur: the comparison is not vacuous


def _dense(op: str) -> onnx.ModelProto:
    """x [3, 259] -> MatMul(w [259, 17]) or Gemm(w [17, 259], transB) + bias: heavy weights of
    one sign per output column, so that nearest int8 codes meet in pairs past eq. (12m)."""
    rng = np.random.default_rng(259)
    w = heavy_weights(rng, (17, 259)) * np.float32(0.05)  # [N, K]
    b = rng.standard_normal(17).astype(np.float32)
    if op == "MatMul":
        node = helper.make_node("MatMul", ["x", "w"], ["y"], name="dense")
        inits = [numpy_helper.from_array(np.ascontiguousarray(w.T), "w")]
    else:
        node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="dense", transB=1, alpha=0.75)
        inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 259])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 17])],
        initializer=inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
@pytest.mark.parametrize("per_channel", [True, False])
def test_quantize_dynamic_writes_pair_safe_matmul_weights(tmp_path, op, per_channel):
    """``quantize_dynamic(weight_pairs="ort")``, which the saturation note advises, kept
    eq. (12m) on DynamicQuantizeLSTM weights but wrote MatMulInteger weights at full range:
    ORT's saturating u8·s8 GEMM still clipped their pairs (resemblyzer's projection). Now
    every K-pair of a MatMul / Gemm weight keeps the bound (K = 259, the odd last code
    alone), ORT computes the file as quanta does on any CPU, and only the pairs that broke
    the bound move, each to its bound (|a + b| = 128, ort_pairs.project_pairs)."""
    src = tmp_path / "dense.onnx"
    onnx.save(_dense(op), src)
    rng = np.random.default_rng(7)
    # activations far from symmetric: DynamicQuantizeLinear's zero point is not 0 or 128
    x = (rng.standard_normal((3, 259)) * 1.3 + 0.9).astype(np.float32)
    x[:, ::2] = np.abs(x[:, ::2]) * 2.5  # large codes on both codes of many pairs
    outs, codes = {}, {}
    for pairs in ("off", "ort"):
        dst = tmp_path / f"dense.{pairs}.onnx"
        quanta.quantize_dynamic(src, dst, weight_pairs=pairs, per_channel=per_channel, verbose=False)
        model = onnx.load(str(dst))
        onnx.checker.check_model(model)
        codes[pairs] = next(
            numpy_helper.to_array(t) for t in model.graph.initializer if t.name.endswith("_quantized")
        )
        flagged = saturating_weights(model)
        assert bool(flagged) == (pairs == "off"), flagged  # the case overflows without the rule
        quanta_y = quanta.InferenceSession(str(dst)).run(None, {"x": x})[0]
        ort_y = _run_float(model, x)
        outs[pairs] = quanta_y
        if pairs == "ort":
            # no pair can saturate: ORT's integer product is quanta's, the float scaling to rounding
            np.testing.assert_allclose(ort_y, quanta_y, rtol=1e-5, atol=1e-5 * float(np.abs(quanta_y).max()))
    # [N, K] rows, pairs along K: the codes that move are exactly those of the broken pairs
    partners = k_partners(259)
    off, safe = codes["off"].T.astype(np.int64), codes["ort"].T.astype(np.int64)
    broken = pair_excess(off, partners) > 0
    assert broken.any() and not pair_excess(safe, partners).any()
    np.testing.assert_array_equal(safe[~broken], off[~broken])
    mate = safe[:, np.maximum(partners, 0)]
    np.testing.assert_array_equal(np.abs(safe + mate)[broken], 128)
    ref = _run_float(_dense(op), x)
    err = float(np.abs(outs["ort"] - ref).max() / np.abs(ref).max())
    assert err < 0.03, err  # the bound costs these one-signed heavy columns a few codes each


def _run_float(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]
