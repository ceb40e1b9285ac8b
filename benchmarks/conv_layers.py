"""Per-layer profile in thread CPU time: every distinct Conv of a zoo model (its weights, bias,
attributes and its input shape at the zoo feed) run alone in quanta and in ONNX Runtime at
1 thread, the two sessions interleaved, medians of each side's runs. The profilers of both
engines are wall clock, which a shared machine at load 20 inflates ~10x and unevenly; thread
CPU time of one layer at a time is what separates the layers that lose.

    python benchmarks/conv_layers.py ppocrv3_det [top] [rounds]

Each layer is its own one-node model, so both engines add their layout changes around it
(NCHWc reorders in ORT, the blocked-layout pass in quanta): a layer's ratio here is not its
share inside the model, but ranks the layers.
"""

import collections
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "zoo"))
import fp32_latency as f
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx import shape_inference

import quanta

name = sys.argv[1]
top = int(sys.argv[2]) if len(sys.argv) > 2 else 12
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 7
path, feed = f.model_path(name), f.feed_for(name)
m = onnx.load(path)
for inp in m.graph.input:
    if inp.name in feed:
        d = inp.type.tensor_type.shape.dim
        for i, s in enumerate(feed[inp.name].shape):
            d[i].ClearField("dim_param")
            d[i].dim_value = s
m = shape_inference.infer_shapes(m)
shapes = {
    v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
    for v in list(m.graph.value_info) + list(m.graph.input)
}
consts = {i.name: nh.to_array(i) for i in m.graph.initializer}
for n in m.graph.node:
    if n.op_type == "Constant":
        for a in n.attribute:
            if a.name == "value":
                consts[n.output[0]] = nh.to_array(a.t)
groups = collections.OrderedDict()
for n in m.graph.node:
    if n.op_type != "Conv" or n.input[1] not in consts or n.input[0] not in shapes:
        continue
    w = consts[n.input[1]]
    xs = shapes[n.input[0]]
    attrs = tuple((a.name, tuple(a.ints) if a.ints else (a.i if a.type == 2 else a.s)) for a in n.attribute)
    key = (tuple(w.shape), tuple(xs), attrs, len(n.input) > 2)
    groups.setdefault(key, []).append(n)
rng = np.random.default_rng(0)
rows = []
for key, nodes in groups.items():
    n = nodes[0]
    w = consts[n.input[1]]
    xs = shapes[n.input[0]]
    inits = [nh.from_array(w.astype(np.float32), "w")]
    ins = ["x", "w"]
    if len(n.input) > 2 and n.input[2]:
        inits.append(nh.from_array(consts[n.input[2]].astype(np.float32), "b"))
        ins.append("b")
    node = h.make_node("Conv", ins, ["y"], **{a.name: h.get_attribute_value(a) for a in n.attribute})
    g = h.make_graph(
        [node], "g", [h.make_tensor_value_info("x", 1, xs)], [h.make_tensor_value_info("y", 1, None)], inits
    )
    mm = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    mm.ir_version = 8
    p = os.path.join(tempfile.mkdtemp(), "c.onnx")
    onnx.save(mm, p)
    qo = quanta.SessionOptions()
    qo.intra_op_num_threads = 1
    oo = ort.SessionOptions()
    oo.intra_op_num_threads = 1
    S = {
        "q": quanta.InferenceSession(p, sess_options=qo),
        "o": ort.InferenceSession(p, oo, providers=["CPUExecutionProvider"]),
    }
    x = rng.standard_normal(xs).astype(np.float32)
    T = {k: [] for k in S}
    for s in S.values():
        s.run(None, {"x": x})
    for _ in range(rounds):
        for k, s in S.items():
            time.sleep(0.003)
            for _ in range(3):
                t = time.thread_time()
                s.run(None, {"x": x})
                T[k].append(time.thread_time() - t)
    q, o = np.median(T["q"]) * 1e3, np.median(T["o"]) * 1e3
    rows.append((len(nodes) * (q - o), len(nodes), w.shape, xs, dict(key[2]), q, o))
tq = sum(r[1] * r[5] for r in rows)
to = sum(r[1] * r[6] for r in rows)
print(
    f"{name}: {sum(r[1] for r in rows)} Convs in {len(rows)} shapes; sum quanta {tq:.2f} ms ORT {to:.2f} ms ratio {tq / to:.3f}",
    flush=True,
)
for r in sorted(rows, key=lambda r: -r[0])[:top]:
    ks = r[4].get("kernel_shape", r[2][2:])
    st = r[4].get("strides", (1, 1))
    gr = r[4].get("group", 1)
    print(
        f"  x{r[1]} {r[2][1] * gr}->{r[2][0]} k{tuple(ks)} s{tuple(st)} g{gr} at {r[3][2]}x{r[3][3]}: q {r[5]:.3f} o {r[6]:.3f} ms ratio {r[5] / r[6]:.2f} excess {r[0]:+.3f} ms"
    )
