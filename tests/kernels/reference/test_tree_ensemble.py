"""ai.onnx.ml TreeEnsembleClassifier / TreeEnsembleRegressor (quanta/kernels/reference/
tree_ensemble.py): every row at once, the same bytes as onnx.reference's per-row walk, and
ONNX Runtime's labels and scores to float32 rounding. Forests built by code: random
trees over 7 features, every branch mode, NaN inputs with both missing-value tracks."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import quanta

ML = "ai.onnx.ml"
MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ")
#: ONNX Runtime sends a NaN down a BRANCH_NEQ node's true branch whatever its missing-value
#: track says (NaN != v holds): forests compared with it leave NEQ out
#: (test_neq_of_a_nan_follows_the_missing_track_onnxruntime_takes_true)
ORT_MODES = MODES[:-1]
FEATURES = 7


def forest(rng: np.random.Generator, trees: int, depth: int, outputs: int, modes=MODES) -> dict:
    """Node attributes of ``trees`` random trees (node ids a permutation of 0..n-1, not
    in visiting order; leaves at several depths) and per leaf one weight per output
    column (``weights``)."""
    att: dict[str, list] = {k: [] for k in ("treeids", "nodeids", "featureids", "modes", "values")}
    att.update(truenodeids=[], falsenodeids=[], missing=[])
    leaves: list[tuple[int, int]] = []

    def grow(t: int, level: int, counter: list[int]) -> int:
        nid = counter[0]
        counter[0] += 1
        slot = len(att["treeids"])
        for k in att:
            att[k].append(0)
        att["treeids"][slot], att["nodeids"][slot] = t, nid
        if level == depth or (level > 1 and rng.random() < 0.25):
            att["modes"][slot] = "LEAF"
            leaves.append((t, nid))
            return nid
        att["modes"][slot] = str(rng.choice(modes))
        att["featureids"][slot] = int(rng.integers(0, FEATURES))
        # thresholds on the grid the inputs are drawn from: EQ / NEQ branch both ways
        att["values"][slot] = float(rng.integers(-4, 5) / 2)
        att["missing"][slot] = int(rng.integers(0, 2))
        att["truenodeids"][slot] = grow(t, level + 1, counter)
        att["falsenodeids"][slot] = grow(t, level + 1, counter)
        return nid

    for t in range(trees):
        first, counter = len(att["treeids"]), [0]
        grow(t, 0, counter)
        perm = rng.permutation(counter[0]).tolist()
        for i in range(first, len(att["treeids"])):
            att["nodeids"][i] = perm[att["nodeids"][i]]
            if att["modes"][i] != "LEAF":
                att["truenodeids"][i] = perm[att["truenodeids"][i]]
                att["falsenodeids"][i] = perm[att["falsenodeids"][i]]
        leaves[:] = [(lt, perm[ln]) if lt == t else (lt, ln) for lt, ln in leaves]
    w_tree, w_node, w_col, w_val = [], [], [], []
    for t, nid in leaves:
        for c in range(outputs):
            w_tree.append(t), w_node.append(nid), w_col.append(c)
            w_val.append(float(rng.normal(0, 1)))
    nodes = {
        "nodes_treeids": att["treeids"],
        "nodes_nodeids": att["nodeids"],
        "nodes_featureids": att["featureids"],
        "nodes_modes": att["modes"],
        "nodes_values": att["values"],
        "nodes_truenodeids": att["truenodeids"],
        "nodes_falsenodeids": att["falsenodeids"],
        "nodes_missing_value_tracks_true": att["missing"],
    }
    return {"nodes": nodes, "weights": (w_tree, w_node, w_col, w_val)}


def inputs(rng: np.random.Generator, rows: int = 37) -> np.ndarray:
    x = (rng.integers(-5, 6, (rows, FEATURES)) / 2).astype(np.float32)
    x += (rng.random((rows, FEATURES)) < 0.3) * rng.normal(0, 0.1, (rows, FEATURES)).astype(np.float32)
    x[rng.random((rows, FEATURES)) < 0.08] = np.nan
    return x


def forest_attrs(f: dict, prefix: str, **extra) -> dict:
    """``forest``'s nodes and its leaves' weight entries as a regressor's (``target``) or
    a classifier's (``class``) attributes, plus ``extra``."""
    t, n, c, v = f["weights"]
    return dict(
        f["nodes"],
        **{f"{prefix}_treeids": t, f"{prefix}_nodeids": n, f"{prefix}_ids": c, f"{prefix}_weights": v},
        **extra,
    )


def model(op: str, attrs: dict, outputs: list):
    node = helper.make_node(op, ["x"], [o.name for o in outputs], domain=ML, **attrs)
    g = helper.make_graph(
        [node], "forest", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, FEATURES])], outputs
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 3)], ir_version=9
    )


def check(m, x: np.ndarray, against_ort: bool = True) -> None:
    ours = quanta.InferenceSession(m, backend="reference").run(None, {"x": x})
    sess = quanta.InferenceSession(m)
    assert not sess.fallbacks  # the native binder: one Forest per node, kept across runs
    sess.run(None, {"x": x[::-1].copy()})  # the first run builds it, on other rows
    native = sess.run(None, {"x": x})
    spec = ReferenceEvaluator(m).run(None, {"x": x})
    theirs = (
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
        if against_ort
        else spec
    )
    for a, n, b, c in zip(ours, native, spec, theirs):
        assert np.asarray(a).tolist() == np.asarray(b).tolist() == np.asarray(n).tolist()
        if np.asarray(c).dtype.kind == "f":
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-5)
        else:
            assert np.asarray(a).tolist() == np.asarray(c).tolist()


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_regressor_matches_the_reference_bytes_and_onnxruntime(aggregate: str) -> None:
    rng = np.random.default_rng(3)
    f = forest(rng, trees=9, depth=6, outputs=2, modes=ORT_MODES)
    attrs = forest_attrs(
        f,
        "target",
        n_targets=2,
        aggregate_function=aggregate,
        base_values=[0.25, -1.5],
    )
    check(
        model("TreeEnsembleRegressor", attrs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        inputs(rng),
    )


@pytest.mark.parametrize("post", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"])
@pytest.mark.parametrize("labels", ["int64", "string"])
def test_classifier_matches_the_reference_bytes_and_onnxruntime(post: str, labels: str) -> None:
    rng = np.random.default_rng(5)
    f = forest(rng, trees=11, depth=5, outputs=3, modes=ORT_MODES)
    names = (
        {"classlabels_int64s": [4, 0, 17]} if labels == "int64" else {"classlabels_strings": ["a", "b", "zz"]}
    )
    attrs = forest_attrs(
        f,
        "class",
        post_transform=post,
        base_values=[0.5, 0.0, -0.25],
        **names,
    )
    label = TensorProto.INT64 if labels == "int64" else TensorProto.STRING
    outs = [
        helper.make_tensor_value_info("label", label, None),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, None),
    ]
    check(model("TreeEnsembleClassifier", attrs, outs), inputs(rng))


def test_binary_classifier_of_one_class_column() -> None:
    """scikit-learn's binary gradient boosting: one class id, two labels; the first score
    is minus the second after LOGISTIC's input (both engines' convention)."""
    rng = np.random.default_rng(9)
    f = forest(rng, trees=6, depth=4, outputs=1, modes=ORT_MODES)
    attrs = forest_attrs(
        f,
        "class",
        post_transform="LOGISTIC",
        base_values=[0.3],
        classlabels_int64s=[0, 1],
    )
    outs = [
        helper.make_tensor_value_info("label", TensorProto.INT64, None),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, None),
    ]
    check(model("TreeEnsembleClassifier", attrs, outs), inputs(rng, rows=53))


def test_a_node_naming_a_missing_child_names_itself() -> None:
    attrs = dict(
        nodes_treeids=[0, 0],
        nodes_nodeids=[0, 1],
        nodes_featureids=[0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF"],
        nodes_values=[0.0, 0.0],
        nodes_truenodeids=[1, 0],
        nodes_falsenodeids=[5, 0],
        target_treeids=[0],
        target_nodeids=[1],
        target_ids=[0],
        target_weights=[1.0],
        n_targets=1,
    )
    m = model("TreeEnsembleRegressor", attrs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    with pytest.raises(Exception, match="tree 0 has no node 5"):
        quanta.InferenceSession(m, backend="reference").run(None, {"x": np.zeros((2, FEATURES), np.float32)})


def test_every_branch_mode_with_nans_gives_the_reference_bytes() -> None:
    rng = np.random.default_rng(21)
    f = forest(rng, trees=13, depth=7, outputs=3)
    attrs = forest_attrs(f, "target", n_targets=3)
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    check(model("TreeEnsembleRegressor", attrs, outs), inputs(rng, rows=101), against_ort=False)


def test_neq_of_a_nan_follows_the_missing_track_onnxruntime_takes_true() -> None:
    """The spec: a missing value (NaN) takes the branch nodes_missing_value_tracks_true
    names, whatever the mode (onnx.reference, and quanta). ONNX Runtime tests
    ``x CMP v or (track and isnan(x))``, and NaN != v holds: a NaN at a BRANCH_NEQ node
    whose track is 0 goes true there, false here."""
    attrs = dict(
        nodes_treeids=[0, 0, 0],
        nodes_nodeids=[0, 1, 2],
        nodes_featureids=[3, 0, 0],
        nodes_modes=["BRANCH_NEQ", "LEAF", "LEAF"],
        nodes_values=[1.5, 0, 0],
        nodes_truenodeids=[1, 0, 0],
        nodes_falsenodeids=[2, 0, 0],
        nodes_missing_value_tracks_true=[0, 0, 0],
        target_treeids=[0, 0],
        target_nodeids=[1, 2],
        target_ids=[0, 0],
        target_weights=[10.0, -7.0],
        n_targets=1,
    )
    m = model("TreeEnsembleRegressor", attrs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    x = np.zeros((3, FEATURES), np.float32)
    x[:, 3] = [np.nan, 1.5, 2.0]
    ours = quanta.InferenceSession(m).run(None, {"x": x})[0]
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert ours.ravel().tolist() == [-7.0, -7.0, 10.0]  # NaN: the false branch its track names
    assert theirs.ravel().tolist() == [10.0, -7.0, 10.0]


def test_an_input_narrower_than_the_features_read_names_itself() -> None:
    rng = np.random.default_rng(4)
    f = forest(rng, trees=3, depth=3, outputs=1, modes=ORT_MODES)
    attrs = forest_attrs(f, "target", n_targets=1)
    m = model("TreeEnsembleRegressor", attrs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m.graph.input[0].type.tensor_type.shape.dim[1].Clear()  # no declared width: the op checks it
    widest = max(fid for fid, mode in zip(attrs["nodes_featureids"], attrs["nodes_modes"]) if mode != "LEAF")
    for backend in ("reference", "native"):
        with pytest.raises(Exception, match=f"reads feature {widest} of an input of {widest}"):
            quanta.InferenceSession(m, backend=backend).run(None, {"x": np.zeros((2, widest), np.float32)})


@pytest.mark.parametrize("far", [False, True])
def test_sparse_unordered_tree_and_node_ids_find_the_same_nodes(far: bool) -> None:
    """Tree ids out of order and not from 0, node ids sparse and large (a LightGBM-style
    export numbers them per tree): the children and the leaves' weight entries are found
    by the (tree, node) pair as the reference finds them. ``far``: ids so far apart that
    no single integer key holds both (the table falls back to pairs). Against
    onnx.reference alone: ONNX Runtime refuses a node id past its tree's node count."""
    rng = np.random.default_rng(11)
    f = forest(rng, trees=5, depth=4, outputs=3, modes=ORT_MODES)
    tree_ids = [40, 3, 17, 9, 25] if not far else [2**40 + 3, 7, 2**41, 11, 5]
    remap_t = dict(enumerate(tree_ids))
    step = 1000 if not far else 2**30

    def node_id(t: int, n: int) -> int:
        return n * step + 7 + t  # per tree sparse, never 0

    nodes = dict(f["nodes"])
    old_t = list(nodes["nodes_treeids"])
    nodes["nodes_treeids"] = [remap_t[t] for t in old_t]
    for k in ("nodes_nodeids", "nodes_truenodeids", "nodes_falsenodeids"):
        nodes[k] = [node_id(t, n) for t, n in zip(old_t, nodes[k], strict=True)]
    w_t, w_n, w_c, w_v = f["weights"]
    g = {
        "nodes": nodes,
        "weights": (
            [remap_t[t] for t in w_t],
            [node_id(t, n) for t, n in zip(w_t, w_n, strict=True)],
            w_c,
            w_v,
        ),
    }
    m = model(
        "TreeEnsembleRegressor",
        forest_attrs(g, "target", n_targets=3, aggregate_function="SUM", base_values=[0.25, -1.5, 0.125]),
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 3])],
    )
    check(m, inputs(rng), against_ort=False)
