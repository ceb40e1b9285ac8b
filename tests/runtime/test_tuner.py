"""The autotuner (quanta/runtime/tuner.py) and the run-time blocking of the int8 GEMM.

Every blocking the tuner may choose gives the bytes of the NumPy twin (qgemm.h Blocking:
int32 sums wrap, so K chunking and row grouping cannot change them), for every ISA the
CPU runs and 1 and 2 threads; the convolution paths built on qgemm too, through the
tuned table. The cache survives a corrupt file, a file of another format and concurrent
writers; QUANTA_TUNE=0 turns everything off.
"""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.kernels import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the native extension is not built")

if native_available():
    from quanta.kernels import _native

    ISAS = list(_native.supported_isas())
else:  # pragma: no cover
    ISAS = []

from quanta.kernels.reference import qgemm as ref  # noqa: E402
from quanta.runtime import tuner  # noqa: E402

MR = {"avx512vnni": 12, "avx2": 4, "portable": 4}


@pytest.fixture(autouse=True)
def _clean_table():
    """Each test starts and ends with an empty tuned table (it is process-wide)."""
    if native_available():
        _native.qgemm_clear_tuned()
    yield
    if native_available():
        _native.qgemm_clear_tuned()
        _native.qgemm_record_shapes(False)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """Tuning on, a cache folder of the test's own, and every measurement trusted (the
    shared machine's load would otherwise mark some "noisy"; that path has its own test)."""
    monkeypatch.setenv("QUANTA_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("QUANTA_TUNE", "1")
    monkeypatch.setattr(tuner, "MAX_SPREAD", float("inf"))
    return tmp_path


def _blockings(isa: str, M: int, N: int, K: int, threads: int) -> list[dict[str, int]]:
    """The tuner's candidates for the shape plus the extremes of each field."""
    heuristic = _native.qgemm_blocking(isa, M, N, K, threads)
    shape = tuner.GemmShape(isa, M, N, K, threads)
    out = tuner.candidates(shape, heuristic)[1:]
    out += [{"mc": MR[isa]}, {"mc": 1000}, {"nc": 1}, {"nc": 3, "mc": 2 * MR[isa]}, {"kc": 1}, {"kc": 260}]
    if isa == "avx512vnni":
        out += [{"prefetch": 0}, {"prefetch": 64}, {"prefetch": 8192, "nc": 2, "kc": 512}]
    return out


# (M, N, K, x dtype, out dtype): odd shapes, several K chunks (K > 1024 or kc set), rows
# that end in a short tile, a per-column zero point and bias
SHAPES = [
    (37, 100, 1030, np.uint8, np.int32),
    (130, 33, 4099, np.int8, np.uint8),
    (401, 1000, 1030, np.uint8, np.int8),
    (25, 7, 259, np.uint8, np.float32),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("M", "N", "K", "xdt", "odt"), SHAPES)
def test_every_blocking_candidate_is_bitexact_with_the_twin(isa, M, N, K, xdt, odt) -> None:
    """Failure signature: a blocking that loses or doubles a K chunk, a row block or a
    B block (off by a partial sum), or writes rows of another block."""
    rng = np.random.default_rng(M * 7 + N)
    lo, hi = (0, 256) if xdt == np.uint8 else (-128, 128)
    x = rng.integers(lo, hi, (M, K)).astype(xdt)
    w = rng.integers(-128, 128, (K, N), dtype=np.int8)
    zw = rng.integers(-128, 128, N).astype(np.int32)
    zx = 131 if xdt == np.uint8 else -17
    bias = rng.integers(-(2**20), 2**20, N).astype(np.int32)
    stage = {}
    if odt in (np.uint8, np.int8):
        stage = {"multiplier": rng.uniform(1e-5, 4e-5, N).astype(np.float32), "zy": 9}
    elif odt == np.float32:
        stage = {"multiplier": rng.uniform(1e-4, 3e-4, N).astype(np.float32)}
    expected = ref.qgemm(x, w, zx, zw, np.dtype(odt), bias=bias, **stage)
    packed = _native.pack_weights_s8(w, zw, isa=isa)
    for threads in (1, 2):
        for b in _blockings(isa, M, N, K, threads):
            _native.qgemm_set_tuned(isa, M, N, K, threads, b)
            assert _native.qgemm_blocking(isa, M, N, K, threads)["tuned"]
            got = _native.qgemm(x, packed, zx, np.dtype(odt).name, bias=bias, num_threads=threads, **stage)
            assert got.tobytes() == expected.tobytes(), f"{isa} threads={threads} blocking {b}"
        _native.qgemm_set_tuned(isa, M, N, K, threads, None)
        assert not _native.qgemm_blocking(isa, M, N, K, threads)["tuned"]


def test_workspace_reserved_before_tuning_still_fits() -> None:
    """A caller that sized its workspace under the heuristics (the convolution plans do,
    at compile time) still runs after the tuner installs a blocking: the partial-sum
    buffer is sized for any tuned one. Failure signature: 'workspace has N bytes'."""
    rng = np.random.default_rng(3)
    M, N, K = 300, 64, 2000
    x = rng.integers(0, 256, (M, K), dtype=np.uint8)
    w = rng.integers(-128, 128, (K, N), dtype=np.int8)
    packed = _native.pack_weights_s8(w, 0)
    ws = _native.QGemmWorkspace()
    base = _native.qgemm(x, packed, 3, "int32", workspace=ws)
    nbytes = ws.nbytes
    isa = _native.active_isa()
    for b in ({"mc": 1 << 20, "kc": 256}, {"mc": MR[isa], "kc": 300, "nc": 1}):
        _native.qgemm_set_tuned(isa, M, N, K, 1, b)
        got = _native.qgemm(x, packed, 3, "int32", workspace=ws)
        assert ws.nbytes == nbytes
        assert got.tobytes() == base.tobytes()


def _l2_bytes() -> int | None:
    """The L2 of CPU 0 as Linux reports it (from the CPU's cache descriptors, which qgemm
    reads through sysconf), or None."""
    for d in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((d / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        if level == "2" and kind in ("Unified", "Data"):
            scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
            return int(size.rstrip("KM")) * scale
    return None


@pytest.mark.skipif("avx512vnni" not in ISAS, reason="the row-tiles-outer family is the avx512vnni one")
def test_row_tiles_outer_follow_the_cores_l2() -> None:
    """docs/kernels.md (GI2): the avx512vnni tiles run their rows outer (MC = MR) while the
    task's packed B is under 3/4 of the running core's L2, and in A blocks from there on:
    the share comes from the CPU (2 MiB of L2: 48 panels of K = 1024 are over it; 1 MiB:
    24), not from a constant."""
    l2 = _l2_bytes()
    if l2 is None:
        pytest.skip("the kernel does not report its L2 cache")
    share = l2 // 4 * 3
    K, M = 1024, 200
    panel = 32 * K  # packed bytes of one 32-column panel
    under = (share - 1) // panel  # the most panels whose B is under the share
    assert _native.qgemm_blocking("avx512vnni", M, 32 * under, K, 1)["mc"] == MR["avx512vnni"]
    assert _native.qgemm_blocking("avx512vnni", M, 32 * under - 5, K, 1)["mc"] == MR["avx512vnni"]
    over = _native.qgemm_blocking("avx512vnni", M, 32 * (under + 1), K, 1)
    assert over["mc"] >= 4 * MR["avx512vnni"], over


def test_blocking_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="unknown field 'mr'"):
        _native.qgemm_set_tuned("portable", 4, 4, 4, 1, {"mr": 4})
    with pytest.raises(ValueError, match="mc: out of range"):
        _native.qgemm_set_tuned("portable", 4, 4, 4, 1, {"mc": -1})
    with pytest.raises(ValueError, match="unknown ISA 'sse9'"):
        _native.qgemm_set_tuned("sse9", 4, 4, 4, 1, {})
    with pytest.raises(ValueError, match="num_threads"):
        _native.qgemm_blocking("portable", 4, 4, 4, 0)


def test_dispatch_table_rows_name_the_kernels_the_library_runs() -> None:
    """One table: the qgemm kernel names come from it, every ISA has a qgemm row with its
    tunables, and the tuner's candidates only use listed tunables."""
    rows = _native.kernel_table()
    qg = {r["isa"]: r for r in rows if r["op"] == "qgemm" and r["dtype"] == "u8s8->s32"}
    # the AVX2 pair-safe weight family (docs/kernels.md) is its own row, named by the library too
    narrow = [r for r in rows if r["op"] == "qgemm" and r["dtype"] == "u8s8p->s32"]
    assert [r["isa"] for r in narrow] == ["avx2"] and narrow[0]["kernel"].startswith("qgemm_u8s8p_s32_")
    assert set(qg) == {"portable", "avx2", "avx512vnni"}
    for isa in ISAS:
        assert _native.qgemm_kernel_name(isa) == qg[isa]["kernel"]
        shape = tuner.GemmShape(isa, 500, 500, 2000, 1)
        for c in tuner.candidates(shape, _native.qgemm_blocking(isa, 500, 500, 2000, 1)):
            assert set(c) <= set(qg[isa]["tunables"])
    assert "prefetch" in qg["avx512vnni"]["tunables"] and "prefetch" not in qg["avx2"]["tunables"]
    assert len({(r["op"], r["dtype"], r["isa"]) for r in rows}) == len(rows)


# --------------------------------------------------------------------------------------
# models: the recorder, the session, the cache
# --------------------------------------------------------------------------------------


def _matmul_integer_model(M: int, K: int, N: int, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w = rng.integers(-128, 128, (K, N), dtype=np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["x", "w", "zx", "zw"], ["y"])],
        "mmi",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [M, K])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [M, N])],
        [
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(117, np.uint8), "zx"),
            numpy_helper.from_array(np.array(-3, np.int8), "zw"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _conv_model(C: int, M: int, H: int, W: int, k: int) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    w = rng.integers(-128, 128, (M, C, k, k), dtype=np.int8)
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "xs"),
        numpy_helper.from_array(np.array(121, np.uint8), "xz"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(rng.uniform(0.001, 0.003, M).astype(np.float32), "ws"),
        numpy_helper.from_array(np.zeros(M, np.int8), "wz"),
        numpy_helper.from_array(np.array(0.7, np.float32), "ys"),
        numpy_helper.from_array(np.array(3, np.uint8), "yz"),
        numpy_helper.from_array(rng.integers(-5000, 5000, M).astype(np.int32), "b"),
    ]
    node = helper.make_node(
        "QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], pads=[1, 1, 1, 1]
    )
    graph = helper.make_graph(
        [node],
        "qconv",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, C, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def _session(model: onnx.ModelProto, tune: bool, threads: int = 1, budget: float = 1.0):
    import quanta

    so = quanta.SessionOptions()
    so.intra_op_num_threads = threads
    so.enable_tuning = tune
    so.tuning_budget_s = budget
    return quanta.InferenceSession(model.SerializeToString(), so)


@pytest.mark.parametrize(("C", "M", "H", "k"), [(17, 200, 30, 3), (7, 300, 40, 1)])
def test_convolution_gemm_shapes_under_every_blocking_match_the_reference(C, M, H, k) -> None:
    """The convolution paths built on qgemm run each recorded GEMM shape under every
    candidate blocking with the reference backend's bytes."""
    model = _conv_model(C, M, H, H, k)
    x = np.random.default_rng(1).integers(0, 256, (1, C, H, H), dtype=np.uint8)
    expected = _session(model, False).run(None, {"x": x})[0]
    import quanta

    golden = quanta.InferenceSession(model.SerializeToString(), backend="reference").run(None, {"x": x})[0]
    np.testing.assert_array_equal(expected, golden)
    for threads in (1, 2):
        sess = _session(model, False, threads)
        shapes = tuner.recorded_shapes(lambda s=sess: s.run(None, {"x": x}))
        assert shapes, "the convolution ran no qgemm call: this test would check nothing"
        for s in shapes:
            for b in _blockings(s.isa, s.M, s.N, s.K, s.threads):
                _native.qgemm_set_tuned(s.isa, s.M, s.N, s.K, s.threads, b)
                got = sess.run(None, {"x": x})[0]
                assert got.tobytes() == expected.tobytes(), f"{s} blocking {b}"
            _native.qgemm_set_tuned(s.isa, s.M, s.N, s.K, s.threads, None)


def test_session_tunes_caches_and_reuses(cache_dir: Path) -> None:
    """A session measures its GEMM shape, writes the cache, gives the untuned bytes; a
    second session takes the choice from the cache without measuring."""
    model = _matmul_integer_model(160, 259, 130)
    x = np.random.default_rng(2).integers(0, 256, (160, 259), dtype=np.uint8)
    plain = _session(model, False).run(None, {"x": x})[0]
    assert _session(model, False).tuning is None

    sess = _session(model, True, budget=0.5)
    rep = sess.tuning
    assert rep is not None and len(rep.choices) == 1, str(rep)
    c = rep.choices[0]
    assert (c.shape.M, c.shape.N, c.shape.K, c.source) == (160, 130, 259, "measured")
    assert c.gain >= 1.0 and c.calls == 1
    assert sess.run(None, {"x": x})[0].tobytes() == plain.tobytes()
    data = json.loads((cache_dir / f"tuner-v{tuner.FORMAT}.json").read_text())
    assert data["format"] == tuner.FORMAT
    (key,) = data["entries"]
    assert tuner.cpu_model() in key and c.shape.key() in key
    assert "160x130x259" in str(rep) and "measured" in str(rep)

    _native.qgemm_clear_tuned()
    again = _session(model, True, budget=0.5).tuning
    assert again is not None and [ch.source for ch in again.choices] == ["cache"]
    assert again.choices[0].blocking == c.blocking


def test_dynamic_shapes_tune_at_the_first_run(cache_dir: Path) -> None:
    model = _matmul_integer_model(64, 300, 200)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "rows"
    model.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "rows"
    sess = _session(model, True, budget=0.3)
    assert sess.tuning is None
    x = np.random.default_rng(4).integers(0, 256, (111, 300), dtype=np.uint8)
    y = sess.run(None, {"x": x})[0]
    assert sess.tuning is not None and [(c.shape.M, c.shape.N, c.shape.K) for c in sess.tuning.choices] == [
        (111, 200, 300)
    ]
    np.testing.assert_array_equal(y, _session(model, False).run(None, {"x": x})[0])


def test_environment_switch_turns_tuning_off(cache_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("QUANTA_TUNE", "0")
    sess = _session(_matmul_integer_model(160, 259, 130), True)
    assert sess.tuning is None
    assert not list(cache_dir.iterdir())
    assert not tuner.tuning_enabled(True)
    monkeypatch.setenv("QUANTA_TUNE", "1")
    assert tuner.tuning_enabled(True) and not tuner.tuning_enabled(False)


def test_noisy_measurements_keep_the_heuristics_and_are_not_cached(cache_dir: Path, monkeypatch) -> None:
    monkeypatch.setattr(tuner, "MAX_SPREAD", 0.5)  # every baseline spreads more than this
    sess = _session(_matmul_integer_model(160, 259, 130), True, budget=0.3)
    assert sess.tuning is not None and [(c.source, c.blocking, c.gain) for c in sess.tuning.choices] == [
        ("noisy", {}, 1.0)
    ]
    assert not _native.qgemm_blocking("avx512vnni" if "avx512vnni" in ISAS else ISAS[-1], 160, 130, 259, 1)[
        "tuned"
    ]
    assert not list(cache_dir.iterdir())


def test_small_shapes_keep_the_heuristics(cache_dir: Path) -> None:
    sess = _session(_matmul_integer_model(8, 32, 16), True)
    assert sess.tuning is not None and not sess.tuning.choices and len(sess.tuning.untuned) == 1


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        json.dumps({"format": 99, "entries": {}}),
        json.dumps([1, 2]),
        "",
        json.dumps({"format": 1}),
    ],
)
def test_corrupt_or_foreign_cache_is_ignored_with_a_warning(cache_dir: Path, content: str) -> None:
    path = cache_dir / f"tuner-v{tuner.FORMAT}.json"
    path.write_text(content)
    with pytest.warns(UserWarning, match="ignoring the cache"):
        assert tuner.load_cache() == {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = _session(_matmul_integer_model(160, 259, 130), True, budget=0.3)
    assert sess.tuning is not None and [c.source for c in sess.tuning.choices] == ["measured"]
    assert json.loads(path.read_text())["format"] == tuner.FORMAT  # replaced by a good one


def test_bad_entries_are_dropped_not_applied(cache_dir: Path) -> None:
    path = cache_dir / f"tuner-v{tuner.FORMAT}.json"
    good = {"blocking": {"mc": 12}, "gain": 1.1}
    path.write_text(
        json.dumps(
            {
                "format": 1,
                "entries": {"a": good, "b": {"blocking": {"mc": "x"}}, "c": {"blocking": {"zz": 1}}, "d": 3},
            }
        )
    )
    assert tuner.load_cache() == {"a": good}


def test_concurrent_writers_leave_a_valid_cache(cache_dir: Path) -> None:
    """Eight threads merging their own entries at once: the file always parses and holds
    the format; the entries of the last writer are there (lost updates only cost a
    re-measurement)."""
    errors: list[BaseException] = []

    def writer(i: int) -> None:
        try:
            for j in range(20):
                shape = tuner.GemmShape("portable", 100 + i, 100 + j, 64, 1)
                tuner.save_choices([tuner.Choice(shape, {"mc": 4 * (j + 1)}, {}, 1.05, "measured")])
                tuner.load_cache()
        except BaseException as e:  # reported below
            errors.append(e)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a torn file would warn
        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    entries = tuner.load_cache()
    assert entries and all(e["blocking"]["mc"] % 4 == 0 for e in entries.values())
    assert not [p for p in cache_dir.iterdir() if p.name.startswith(".tuner-")]  # no temp files left


def test_quanta_bench_reports_the_tuner_choices(cache_dir: Path, tmp_path: Path) -> None:
    from quanta.cli.bench import bench_model, format_result

    path = tmp_path / "mmi.onnx"
    onnx.save(_matmul_integer_model(160, 259, 130), str(path))
    r = bench_model(path, threads=1, warmup=0, runs=2)
    text = format_result(r)
    assert r.tuning is not None and len(r.tuning.choices) == 1
    assert text.splitlines()[-2].startswith("tuner: 1 GEMM shapes tuned")
    assert "160x130x259 (" in text.splitlines()[-1] and "x vs mc " in text.splitlines()[-1]


def test_inspect_kernels_prints_the_dispatch_table(tmp_path: Path, capsys) -> None:
    from quanta.cli.main import main

    path = tmp_path / "m.onnx"
    onnx.save(_matmul_integer_model(8, 32, 16), str(path))
    assert main(["inspect", "--kernels", str(path)]) == 0
    out = capsys.readouterr().out
    for row in _native.kernel_table():
        assert f"{row['isa']:<11} {row['kernel']}" in out
    assert "qgemm_u8s8_s32_4x16c4__portable [mc, nc, kc, prefetch_a]" in out
