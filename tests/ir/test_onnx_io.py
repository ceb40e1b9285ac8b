"""ONNX import/export: round trips through ONNX Runtime, bad input, external data,
atomic and deterministic saving."""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import ModelLoadError, load, save, to_proto
from quanta.ir.types import F32, I8, U8, QuantType
from tests.ir import models
from tests.ort_int8 import WEIGHT_BITS  # 7-bit weights where ORT saturates full-range ones

ort = pytest.importorskip("onnxruntime")


def ort_run(path_or_bytes, feeds):
    sess = ort.InferenceSession(path_or_bytes, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def feeds_for(proto: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in proto.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else 2 for d in i.type.tensor_type.shape.dim]
        out[i.name] = rng.standard_normal(dims).astype(np.float32)
    return out


@pytest.mark.parametrize(
    "build", [models.float_cnn, models.qdq_conv, models.qoperator], ids=lambda f: f.__name__
)
def test_round_trip_gives_ort_the_same_outputs(tmp_path, build):
    proto = build()
    src = tmp_path / "in.onnx"
    onnx.save(proto, src)
    dst = tmp_path / "out.onnx"
    save(load(src), dst)
    feeds = feeds_for(proto)
    for a, b in zip(ort_run(str(src), feeds), ort_run(str(dst), feeds)):
        np.testing.assert_array_equal(a, b)  # 0: same graph, same runtime, same inputs


def test_qdq_import_gives_quantized_types_and_export_gives_back_storage_types(tmp_path):
    m = load(models.qdq_conv())
    g = m.graph
    assert g.value("xq").type.elem == QuantType(U8, F32, 0.02, 131)
    w = g.value("wq").type.elem
    assert isinstance(w, QuantType) and w.axis == 0 and w.storage == I8 and len(w.scale) == 7
    assert g.value("cq").type.elem == QuantType(U8, F32, 0.07, 119)
    proto = to_proto(m)
    vi = {v.name: v.type.tensor_type.elem_type for v in proto.graph.value_info}
    assert vi["xq"] == TensorProto.UINT8 and vi["cq"] == TensorProto.UINT8


def test_qoperator_import_types_every_operand():
    g = load(models.qoperator()).graph
    assert g.value("c").type.elem == QuantType(U8, F32, 0.09, 117)
    assert g.value("a").type.elem == QuantType(U8, F32, 0.11, 121)
    assert g.value("gp").type.elem == QuantType(U8, F32, 0.05, 126)
    assert g.value("w").type.elem.axis == 0


def test_save_is_deterministic(tmp_path):
    m = load(models.qdq_conv())
    save(m, tmp_path / "a.onnx")
    save(load(models.qdq_conv()), tmp_path / "b.onnx")
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_save_refuses_to_overwrite_the_input(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(models.float_cnn(), src)
    before = src.read_bytes()
    with pytest.raises(FileExistsError, match="refusing to overwrite the input model"):
        save(load(src), src)
    assert src.read_bytes() == before


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_save_writes_files_readable_as_open_would_make_them(tmp_path):
    """quanta's files were 0600 (mkstemp's mode, kept by the atomic rename) where ONNX
    Runtime's quantizer writes 0644: another user, a server account or a container could
    not read them. A new file gets 0666 less the umask (its external data too); an
    existing one keeps its mode. A umask other than the usual 022 and an existing mode
    other than both, so a hard-coded 0644 or a umask applied twice shows."""
    mask = os.umask(0o027)
    try:
        save(load(models.qdq_conv()), tmp_path / "new.onnx")
        save(load(models.qdq_conv()), tmp_path / "ext.onnx", external_data=True)
        (tmp_path / "old.onnx").write_bytes(b"")
        os.chmod(tmp_path / "old.onnx", 0o604)
        save(load(models.qdq_conv()), tmp_path / "old.onnx")
    finally:
        os.umask(mask)

    def mode(name: str) -> int:
        return os.stat(tmp_path / name).st_mode & 0o777

    assert mode("new.onnx") == 0o640
    assert mode("ext.onnx") == 0o640
    if (tmp_path / "ext.onnx.data").exists():
        assert mode("ext.onnx.data") == 0o640
    assert mode("old.onnx") == 0o604


def test_save_leaves_no_partial_file_when_the_model_is_invalid(tmp_path):
    m = load(models.float_cnn())
    m.graph.nodes[0].op_type = "NoSuchOp"
    with pytest.raises(ValueError, match="refusing to write an invalid model"):
        save(m, tmp_path / "out.onnx")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("opset", [13, 17, 21, onnx.defs.onnx_opset_version()])
def test_load_accepts_opsets_13_to_newest(opset):
    m = load(models.float_cnn(opset=opset))
    assert m.opset() == opset


# -- bad input: one line naming the file, node or tensor ----------------------------


def test_load_truncated_file(tmp_path):
    p = tmp_path / "t.onnx"
    p.write_bytes(models.float_cnn().SerializeToString()[:150])
    with pytest.raises(ModelLoadError) as e:
        load(p)
    assert str(e.value).startswith(f"{p}: not a valid ONNX model")
    assert "\n" not in str(e.value)


def test_load_not_onnx(tmp_path):
    p = tmp_path / "x.onnx"
    p.write_text("hello, I am not a model\n")
    with pytest.raises(ModelLoadError, match=r"x.onnx: not a valid ONNX model"):
        load(p)


def test_load_missing_initializer():
    proto = models.float_cnn()
    del proto.graph.initializer[0]  # "w"
    with pytest.raises(ModelLoadError) as e:
        load(proto)
    assert str(e.value) == (
        "model: node 'conv' (Conv) uses 'w', which is not a graph input, an initializer or the output "
        "of any node (missing initializer?)"
    )


def test_load_cyclic_graph():
    nodes = [
        helper.make_node("Relu", ["b"], ["a"], name="n1"),
        helper.make_node("Neg", ["a"], ["b"], name="n2"),
        helper.make_node("Add", ["x", "b"], ["y"], name="n3"),
    ]
    g = helper.make_graph(
        nodes,
        "cyc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    with pytest.raises(ModelLoadError, match=r"model: graph has a cycle through"):
        load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_load_unknown_operator_names_the_node():
    proto = models.float_cnn()
    proto.graph.node[1].op_type = "Relux"
    with pytest.raises(ModelLoadError) as e:
        load(proto)
    msg = str(e.value)
    assert msg.startswith("model: ONNX checker: No Op registered for Relux") and "relu" in msg
    assert "\n" not in msg


def _external_model(tmp_path, location: str):
    w = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "w")
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    for k, v in [("location", location), ("offset", "0"), ("length", "256")]:
        e = w.external_data.add()
        e.key, e.value = k, v
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [w],
    )
    path = tmp_path / "model" / "m.onnx"
    path.parent.mkdir()
    path.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    return path


def test_load_external_data_inside_the_folder(tmp_path):
    path = _external_model(tmp_path, "weights.bin")
    (path.parent / "weights.bin").write_bytes(np.arange(64, dtype=np.float32).tobytes())
    m = load(path)
    np.testing.assert_array_equal(
        m.graph.initializers["w"].const, np.arange(64, dtype=np.float32).reshape(8, 8)
    )


@pytest.mark.parametrize("location", ["../secret.bin", "sub/../../secret.bin"])
def test_load_external_data_refuses_paths_escaping_the_folder(tmp_path, location):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 256)
    path = _external_model(tmp_path, location)
    with pytest.raises(ModelLoadError) as e:
        load(path)
    assert f"tensor 'w' external data location '{location}' escapes the model's folder" in str(e.value)


def test_load_external_data_refuses_absolute_paths(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 256)
    path = _external_model(tmp_path, str(secret))
    with pytest.raises(ModelLoadError, match=r"is absolute; expected a path inside the model's folder"):
        load(path)


def test_load_external_data_refuses_symlink_out_of_the_folder(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 256)
    path = _external_model(tmp_path, "link.bin")
    os.symlink(secret, path.parent / "link.bin")
    with pytest.raises(ModelLoadError, match=r"escapes the model's folder"):
        load(path)


def test_load_deep_chain_does_not_hit_the_recursion_limit():
    # Failure signature: RecursionError from a recursive cycle check / toposort on a
    # 20,000-node chain (deep unrolled models), here stored in reverse order.
    n = 20000
    nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"], name=f"r{i}") for i in range(n)]
    g = helper.make_graph(
        nodes[::-1],
        "chain",
        [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info(f"v{n}", TensorProto.FLOAT, [3])],
    )
    m = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert [node.name for node in m.graph.nodes[:2]] == ["r0", "r1"]  # sorted
    m.graph.nodes.reverse()
    m.graph.toposort()
    assert m.graph.nodes[-1].name == f"r{n - 1}"


def test_load_accepts_a_graph_output_of_unknown_rank():
    # ONNX Runtime runs it; onnx.checker says "Field 'shape' of 'type' is required".
    import quanta

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    sess = quanta.InferenceSession(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), backend="reference"
    )
    np.testing.assert_array_equal(sess.run(None, {"x": np.array([1, -1], np.float32)})[0], [1, 0])
    assert sess.get_outputs()[0].shape == [2]  # shape inference fills it in


def test_node_proto_for_kernels_writes_omitted_outputs_as_empty_like_the_saver():
    """Failure signature: a kernel reading ctx.onnx_node saw the importer's private name
    ``<node>__unused_output_0_<k>`` for an omitted Y and took Y as requested; the saved
    file has "" there. Positions are kept (Y_c stays output 2) and a delegated LSTM still
    gives Y_h / Y_c at their places."""
    import quanta
    from quanta.ir.onnx_io import node_from_proto_for_reference

    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.normal(0, 0.4, (1, 12, 5)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.normal(0, 0.4, (1, 12, 3)).astype(np.float32), "R")
    node = helper.make_node("LSTM", ["x", "W", "R"], ["", "", "yc"], name="lstm", hidden_size=3)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, 5])],
        [helper.make_tensor_value_info("yc", TensorProto.FLOAT, [1, 2, 3])],
        [w, r],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    (lstm,) = load(model).graph.nodes
    assert list(node_from_proto_for_reference(lstm).output) == ["", "", "yc"]
    assert list(to_proto(load(model)).graph.node[0].output) == ["", "", "yc"]
    x = rng.normal(0, 1, (4, 2, 5)).astype(np.float32)
    got = quanta.InferenceSession(model, backend="reference").run(None, {"x": x})[0]
    import onnxruntime as ort

    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    # 2 ulp-scale: onnx.reference's LSTM and ORT's both run float32 sigmoid/tanh, from different libm formulas
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def _bare_output_model(custom: bool = False) -> onnx.ModelProto:
    """Conv -> Relu (or a custom-domain op) -> z, z declared as a name only (no type), and
    a value_info entry without a type: onnx.checker refuses both, ONNX Runtime runs it."""
    w = np.random.default_rng(0).standard_normal((5, 3, 3, 3)).astype(np.float32)
    last = (
        helper.make_node("Mystery", ["y"], ["z"], domain="example.custom")
        if custom
        else helper.make_node("Relu", ["y"], ["z"])
    )
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]), last],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 7])],
        [onnx.ValueInfoProto(name="z")],
        [numpy_helper.from_array(w, "w")],
    )
    g.value_info.append(onnx.ValueInfoProto(name="y"))
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid("example.custom", 1)] if custom else [])
    return helper.make_model(g, opset_imports=opsets)


def test_a_graph_output_without_a_type_gets_the_inferred_one(tmp_path):
    from quanta.ir.onnx_io import load_proto

    proto, _ = load_proto(_bare_output_model())
    (z,) = proto.graph.output
    assert z.type.tensor_type.elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in z.type.tensor_type.shape.dim] == [1, 5, 8, 7]
    assert all(vi.type.WhichOneof("value") for vi in proto.graph.value_info)
    path = tmp_path / "bare.onnx"
    onnx.save(_bare_output_model(), path)
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 7)).astype(np.float32)
    ours = quanta.InferenceSession(str(path), backend="reference").run(None, {"x": x})[0]
    theirs = ort_run(str(path), {"x": x})[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)  # float conv, 27 terms


def test_a_graph_output_without_a_type_that_inference_cannot_type_is_named():
    from quanta.ir.onnx_io import ModelLoadError, load_proto

    with pytest.raises(
        ModelLoadError, match="graph output 'z' declares no type and shape inference gives it none"
    ):
        load_proto(_bare_output_model(custom=True))


def test_to_proto_with_a_data_limit_writes_large_constants_as_typed_inputs():
    """A proto for shape inference: the 7x17x3x3 weight (1071 elements) travels as a typed
    input without data, the 4-element shape tensor keeps its data, and inference gives
    the same shapes as from the full proto."""
    rng = np.random.default_rng(2)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["c", "shape"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 17, 5, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(rng.standard_normal((7, 17, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array([0, 7, 45, 1], np.int64), "shape"),
        ],
    )
    model = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    full, light = to_proto(model), to_proto(model, data_limit=1024)
    assert [i.name for i in light.graph.initializer] == ["shape"]
    w = next(i for i in light.graph.input if i.name == "w")
    assert w.type.tensor_type.elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in w.type.tensor_type.shape.dim] == [7, 17, 3, 3]
    assert light.ByteSize() < full.ByteSize() // 10
    shapes = []
    for proto in (full, light):
        del proto.graph.value_info[:]
        inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
        y = next(o for o in inferred.graph.output if o.name == "y")
        shapes.append([d.dim_param or d.dim_value for d in y.type.tensor_type.shape.dim])
    assert shapes[0] == shapes[1] == ["N", 7, 45, 1]


def _conv_with_dq_bias(inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    g = helper.make_graph(
        [
            helper.make_node("DequantizeLinear", ["bq", "bs"], ["b"]),
            helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 0, 1, 0]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_an_initializer_repeated_with_equal_contents_loads_once(tmp_path):
    """onnx.checker refuses a name defined twice; ONNX Runtime runs the file. Equal
    copies (here of the weight, the integer bias and its scale) have one meaning."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((7, 3, 3, 3)).astype(np.float32), "w")
    bq = numpy_helper.from_array(rng.integers(-900, 900, 7).astype(np.int32), "bq")
    bs = numpy_helper.from_array(np.array(0.0037, np.float32), "bs")
    path = tmp_path / "dup.onnx"
    onnx.save(_conv_with_dq_bias([w, bq, w, bs, bq, w, bs]), path)
    x = rng.standard_normal((1, 3, 9, 5)).astype(np.float32)
    theirs = ort_run(str(path), {"x": x})[0]
    single = ort_run(_conv_with_dq_bias([w, bq, bs]).SerializeToString(), {"x": x})[0]
    np.testing.assert_array_equal(theirs, single)
    for backend in ("native", "reference"):
        ours = quanta.InferenceSession(str(path), backend=backend).run(None, {"x": x})[0]
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)  # float conv, 27 terms


def test_an_initializer_repeated_with_different_values_is_named():
    """ONNX Runtime 1.32 takes the last copy of a small tensor and the second to last of
    a large one: such a file has no one meaning and the error names the tensor."""
    rng = np.random.default_rng(4)
    ws = [
        numpy_helper.from_array(rng.standard_normal((7, 3, 3, 3)).astype(np.float32), "w") for _ in range(3)
    ]
    bq = numpy_helper.from_array(rng.integers(-900, 900, 7).astype(np.int32), "bq")
    bs = numpy_helper.from_array(np.array(0.0037, np.float32), "bs")
    with pytest.raises(ModelLoadError, match="initializer 'w' is defined 3 times with different values"):
        quanta.InferenceSession(_conv_with_dq_bias([ws[0], bq, bs, ws[1], ws[2]]))


def _opset28(nodes, extra_inputs=()) -> onnx.ModelProto:
    rng = np.random.default_rng(28)
    w = numpy_helper.from_array(rng.standard_normal((7, 17)).astype(np.float32), "W")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), *nodes],
        "o28",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7]), *extra_inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 28)])
    m.ir_version = 13
    return m


def test_a_model_above_onnx_runtimes_qdq_opsets_is_quantized_where_its_qdq_run(tmp_path):
    """Opset 28's QuantizeLinear / DequantizeLinear have no ONNX Runtime 1.32 kernel: a
    model that means the same at 27 (its Cast changed at 28 only by new float6 types) is
    quantized at 27, statically and dynamically, and ORT runs both files as quanta does."""
    ort = pytest.importorskip("onnxruntime")
    proto = _opset28(
        [helper.make_node("Cast", ["m"], ["c"], to=TensorProto.FLOAT), helper.make_node("Relu", ["c"], ["y"])]
    )
    src = tmp_path / "o28.onnx"
    onnx.save(proto, src)
    x = np.random.default_rng(1).standard_normal((3, 7)).astype(np.float32)
    quanta.quantize_static(src, tmp_path / "s.onnx", [{"x": x}, {"x": -x}], weight_bits=WEIGHT_BITS)
    quanta.quantize_dynamic(src, tmp_path / "d.onnx", weight_bits=WEIGHT_BITS)
    for name in ("s.onnx", "d.onnx"):
        q = onnx.load(tmp_path / name)
        assert q.opset_import[0].version == 27
        onnx.checker.check_model(q, full_check=True)
        (want,) = ort.InferenceSession(str(tmp_path / name), providers=["CPUExecutionProvider"]).run(
            None, {"x": x}
        )
        (got,) = quanta.InferenceSession(str(tmp_path / name)).run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "nodes",
    [
        # a type opset 28 added: type-checking inference refuses the lowered model
        [
            helper.make_node("Cast", ["m"], ["c"], to=TensorProto.FLOAT6E2M3),
            helper.make_node("Cast", ["c"], ["y"], to=TensorProto.FLOAT),
        ],
        # an op whose change at 28 is not only types (SpaceToDepth's new `mode`)
        [
            helper.make_node("Reshape", ["m", "s4"], ["r"]),
            helper.make_node("SpaceToDepth", ["r"], ["y"], blocksize=1),
        ],
    ],
    ids=["new_type", "changed_op"],
)
def test_a_model_that_means_otherwise_at_27_keeps_its_opset(nodes):
    from quanta.ir.onnx_io import lower_opset_for_qdq

    proto = _opset28(nodes)
    proto.graph.initializer.append(numpy_helper.from_array(np.array([1, 3, 1, 17], np.int64), "s4"))
    assert lower_opset_for_qdq(proto) is proto
    cast = _opset28([helper.make_node("Cast", ["m"], ["y"], to=TensorProto.FLOAT)])
    lowered = lower_opset_for_qdq(cast)
    assert lowered.opset_import[0].version == 27 and cast.opset_import[0].version == 28  # a copy


def test_an_ir3_file_whose_initializers_are_not_inputs_loads_as_onnx_runtime_reads_it():
    """IR 3 lists every initializer as a graph input; a file of IR 3 that does not (the
    checker refuses it, ONNX Runtime runs it, reading its initializers as constants)
    loads, runs, and quantizes to a file both engines run."""
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((7, 3, 3, 3)).astype(np.float32) * 0.3, "W")
    b = numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "B")
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        "ir3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 9, 11])],
        [w, b],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 7)])
    proto.ir_version = 3
    with pytest.raises(onnx.checker.ValidationError, match="not in graph input"):
        onnx.checker.check_model(proto)
    x = rng.standard_normal((1, 3, 9, 11)).astype(np.float32)
    (want,) = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    (got,) = quanta.InferenceSession(proto.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_an_ir3_file_quantizes_to_a_file_both_engines_run(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(4)
    w = numpy_helper.from_array(rng.standard_normal((17, 5)).astype(np.float32), "W")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "ir3",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])],
        [w],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 7)])
    proto.ir_version = 3
    src = tmp_path / "ir3.onnx"
    onnx.save(proto, src)
    x = rng.standard_normal((3, 17)).astype(np.float32)
    quanta.quantize_static(src, tmp_path / "q.onnx", [{"x": x}, {"x": -x}], weight_bits=WEIGHT_BITS)
    q = onnx.load(tmp_path / "q.onnx")
    onnx.checker.check_model(q, full_check=True)
    (want,) = ort.InferenceSession(str(tmp_path / "q.onnx"), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )
    (got,) = quanta.InferenceSession(str(tmp_path / "q.onnx")).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_a_graph_output_declared_without_a_shape_keeps_the_value_info_shape():
    """A value typed in value_info (as the loader's shape inference types a quanta-domain
    QuantizeMX's output) that is also a graph output declared without a shape: the
    value_info shape stays (the declaration replaced it, and the convolution that reads
    the value, of unknown rank then, was not lowered to its MX kernel)."""
    from quanta.ir.onnx_io import from_proto

    g = helper.make_graph(
        [
            helper.make_node("Opaque", ["x"], ["c"], domain="test.opaque"),
            helper.make_node("Relu", ["c"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 11])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, None),
        ],
        value_info=[helper.make_tensor_value_info("c", TensorProto.FLOAT, [1, 7, 7, 9])],
    )
    proto = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("test.opaque", 1)]
    )
    model = from_proto(proto)
    shapes = {v.name: v.type.shape for v in model.graph.values() if v.name == "c"}
    assert shapes == {"c": (1, 7, 7, 9)}


def test_to_proto_arrays_leave_the_weights_out_and_from_proto_takes_them_back():
    """``to_proto(arrays=)`` writes the initializers of a plain type and >= 4 KB with their
    type and dims but no data and hands their arrays over (not copied); ``from_proto``
    with those arrays builds the same model (its proto byte-identical to the one written
    with the data), using each array read-only; an array that does not match its
    declaration is refused by name."""
    from quanta.ir.onnx_io import from_proto

    rng = np.random.default_rng(3)
    big = (rng.standard_normal((17, 7, 3, 3)) * 0.2).astype(np.float32)  # 4284 bytes
    idx = rng.integers(-5, 9, size=(7, 73)).astype(np.int64)  # 4088 bytes: stays in the bytes
    small = rng.standard_normal(17).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("Add", ["c", "k"], ["y"], name="add"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7, 5, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 17, 5, 3])],
        [
            numpy_helper.from_array(big, "w"),
            numpy_helper.from_array(small, "b"),
            numpy_helper.from_array(idx, "i"),
            numpy_helper.from_array(np.full((1, 17, 5, 3), 0.5, np.float16).astype(np.float32), "k"),
        ],
    )
    model = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    whole = to_proto(model).SerializeToString()
    arrays: dict[str, np.ndarray] = {}
    bare = to_proto(model, arrays=arrays)
    assert list(arrays) == ["w"]  # k: 1020 bytes, i: 4088, b: 68
    assert np.shares_memory(arrays["w"], model.graph.initializers["w"].const)
    (t,) = [t for t in bare.graph.initializer if t.name == "w"]
    assert list(t.dims) == [17, 7, 3, 3] and t.data_type == TensorProto.FLOAT and not t.raw_data
    back = from_proto(bare, "job", arrays=arrays)
    assert to_proto(back).SerializeToString() == whole
    assert not back.graph.initializers["w"].const.flags.writeable
    with pytest.raises(ModelLoadError, match="initializer 'w'"):
        from_proto(bare, "job", arrays={"w": big.reshape(7, 17, 3, 3)})
    with pytest.raises(ModelLoadError, match="initializer 'w'"):
        from_proto(bare, "job", arrays={"w": big.astype(np.float64)})


def _helper_proto(model, got: onnx.ModelProto) -> onnx.ModelProto:
    """What ``to_proto`` wrote, built the way onnx.helper builds a model: every
    initializer through ``numpy_helper.from_array`` in the model's order, the graph by
    ``make_graph`` and the model by ``make_model`` (the nodes, value infos and opsets
    taken from ``got``: only how the proto is assembled is compared)."""
    g = model.graph
    inits = [numpy_helper.from_array(np.asarray(v.const), name) for name, v in g.initializers.items()]
    inits += [
        numpy_helper.from_array(np.asarray(v.const), v.name)
        for v in g.inputs
        if v.const is not None and v.name not in g.initializers
    ]
    graph = helper.make_graph(
        list(got.graph.node),
        got.graph.name,
        list(got.graph.input),
        list(got.graph.output),
        inits,
        doc_string=got.graph.doc_string or None,
        value_info=list(got.graph.value_info),
    )
    ref = helper.make_model(
        graph,
        opset_imports=list(got.opset_import),
        producer_name=got.producer_name,
        producer_version=got.producer_version,
        ir_version=got.ir_version,
    )
    ref.model_version = got.model_version
    if got.doc_string:
        ref.doc_string = got.doc_string
    ref.metadata_props.extend(got.metadata_props)
    ref.functions.extend(got.functions)
    return ref


@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
def test_to_proto_writes_the_bytes_onnx_helper_writes(named):
    """``to_proto`` builds the proto in place (each initializer's bytes written once,
    into the model's graph) and must serialize to the bytes of the model onnx.helper
    builds from the same parts: the same initializers in the same order for every
    element type (plain ones written directly, strings / bfloat16 / int4 / float8
    through ``from_array``), scalars and empty tensors, and the same fields present
    (proto2 writes a field set to its default: an empty graph name, an empty producer
    version). Also checked on a quantized model written by quantize_static."""
    import ml_dtypes

    rng = np.random.default_rng(11)
    consts = {
        "f32": (rng.standard_normal((3, 7)) * 3).astype(np.float32),
        "f16": rng.standard_normal((17,)).astype(np.float16),
        "f64": rng.standard_normal((2, 3, 5)),
        "i8": rng.integers(-128, 128, (7, 3)).astype(np.int8),
        "u8": rng.integers(0, 256, (259,)).astype(np.uint8),
        "i16": rng.integers(-30000, 30000, (5,)).astype(np.int16),
        "u16": rng.integers(0, 60000, (6,)).astype(np.uint16),
        "i32": rng.integers(-(2**31), 2**31 - 1, (3, 3)).astype(np.int32),
        "u32": rng.integers(0, 2**32 - 1, (4,)).astype(np.uint32),
        "i64": np.array(-7, np.int64),  # a scalar
        "u64": np.array([2**63 + 5], np.uint64),
        "b": np.array([True, False, True]),
        "empty": np.zeros((0, 5), np.float32),
        "bf16": rng.standard_normal((4, 3)).astype(ml_dtypes.bfloat16),
        "f8": rng.standard_normal((9,)).astype(ml_dtypes.float8_e4m3fn),
        "i4": rng.integers(-8, 8, (7,)).astype(ml_dtypes.int4),
        "s": np.array(["ab", "", "çé"], dtype=object),
    }
    inits = [numpy_helper.from_array(a, k) for k, a in consts.items()]
    nodes = [helper.make_node("Identity", [k], [f"y_{k}"], name=f"id_{k}" if named else "") for k in consts]
    outputs = [
        helper.make_tensor_value_info(f"y_{k}", t.data_type, list(t.dims)) for k, t in zip(consts, inits)
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [],
        outputs,
        inits,
        doc_string="the graph" if named else None,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    if named:
        proto.doc_string, proto.producer_version, proto.model_version = "a model", "1.2", 3
    model = load(proto.SerializeToString())
    assert set(model.graph.initializers) == set(consts)  # every type survived the load
    if not named:
        model.graph.name = ""  # the checker refuses a file without one, the IR may hold it
    got = to_proto(model)
    assert got.SerializeToString(deterministic=True) == _helper_proto(model, got).SerializeToString(
        deterministic=True
    )
    assert got.graph.HasField("name") and got.HasField("producer_version")


def test_to_proto_of_a_quantized_model_writes_the_bytes_onnx_helper_writes(tmp_path):
    proto = models.float_cnn()
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(proto, src)
    rng = np.random.default_rng(5)
    data = [feeds_for(proto, seed=int(s)) for s in rng.integers(0, 1000, 5)]
    quanta.quantize_static(str(src), str(dst), data, verbose=False)
    model = load(str(dst))
    got = to_proto(model)
    assert got.SerializeToString(deterministic=True) == _helper_proto(model, got).SerializeToString(
        deterministic=True
    )
    assert got.SerializeToString(deterministic=True) == dst.read_bytes()
