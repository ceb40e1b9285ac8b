"""A weight-only MatMul (a DequantizeLinear of a constant weight feeding a float MatMul or
Gemm, no DequantizeLinear on the activation) becomes ``com.microsoft::MatMulNBits``, as
ONNX Runtime's optimizer rewrites it (1.32, ``DQMatMulToMatMulNBits``, level 2 and above)::

    %y = MatMul(%a: f32, DequantizeLinear(%q: const [K, N] (u)int4 | (u)int8, %s: const f32, %z?: const))
      -> %y = com.microsoft::MatMulNBits(%a, %B, %S, %Z) {K, N, bits, block_size, accuracy_level 4}
    %y = Gemm(%a, DequantizeLinear(...), %c?)  (alpha 1, transA 0, transB 0; beta 1, c [N])
      -> %y = com.microsoft::MatMulNBits(%a, %B, %S, %Z, , %c)

The weight's codes, scales and zero points move over unchanged in value
(docs/quantization-math.md eqs. (NB8-2), (NB8-3)): transposed to ``[N, kb, block]``
(4-bit codes two to a byte, low nibble first), signed codes and zero points shifted to
unsigned (``q + 2^(bits−1)``: the difference ``q − z`` is the same integer), a missing zero
point written out (0 for unsigned codes, ``2^(bits−1)`` for signed), one scale and zero
point per ``[block, column]``. A per-block weight keeps its ``block_size``; one per channel
(``[N]`` scales, axis 1) or per tensor (scalar scale) takes ``block_size`` 32 (ONNX
Runtime's ``session.qdq_matmulnbits_block_size`` default), its scale repeated per block.
At ``accuracy_level`` 0 the new node computes the float product of the dequantized weight
(eqs. (W1)-(W2)), bit for bit the graph as written; at 4 (ONNX Runtime's default,
``session.qdq_matmulnbits_accuracy_level``) it quantizes the activation to int8 per row and
block (eqs. (W6)-(W9)): not ONNX's semantics, ONNX Runtime's result (about a code in 254
per block of the activation), which is why only a session that follows ONNX Runtime
(``SessionOptions.float_functions`` "auto" or "ort") runs the rule.

Refused, as ONNX Runtime refuses them: a weight that is not a rank-2 constant of 4 or 8
bits, scales that are not constant (or of a float16 activation: quanta's MatMulNBits takes
float32), scales per row (``[K]``, axis 0), scales ``[N]`` whose axis attribute is -1
(ONNX Runtime compares it with 1: NNCF's ``compress_weights`` files, which write -1, keep
the float product in both), a block under 16 or not a power of 2, a
DequantizeLinear read by another node or a graph output (the engine's own refusal), an
activation that a DequantizeLinear produces (a QDQ group: the lowering takes it), a
product that a QuantizeLinear reads, a Gemm with alpha ≠ 1, a transpose, beta ≠ 1 with a
bias, or a bias that is not ``[N]``.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.op_facts import MS
from quanta.ir.types import F32
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe

__all__ = ["DQGemmToNBits", "DQMatMulToNBits", "OrtDQMatMulNBits", "nbits_operands"]

#: ONNX Runtime's defaults for a weight per channel or per tensor (its session config
#: entries ``session.qdq_matmulnbits_block_size`` and ``..._accuracy_level``)
DEFAULT_BLOCK = 32
DEFAULT_ACCURACY_LEVEL = 4

_BITS = {"int4": 4, "uint4": 4, "int8": 8, "uint8": 8}


def nbits_operands(
    q: np.ndarray, s: np.ndarray, z: np.ndarray | None, block: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Eqs. (NB8-2)-(NB8-3): a DequantizeLinear's weight ``q [K, N]``, scales ``s`` (``[kb,
    N]`` per block, ``[N]`` or scalar) and zero points ``z`` (same shape, or None) ->
    MatMulNBits' ``B`` uint8 ``[N, kb, block·bits/8]``, ``scales`` float32 ``[N·kb]``,
    ``zero_points`` uint8 (``[N·kb]`` at 8 bits, ``[N·ceil(kb/2)]`` nibbles at 4) and bits.

    >>> import ml_dtypes
    >>> b, sc, zp, bits = nbits_operands(np.array([[-1], [2]], np.int8), np.float32(0.5), None, 16)
    >>> bits, b[0, 0, :3].tolist(), sc.tolist(), zp.tolist()  # codes + 128, zero point 128
    (8, [127, 130, 0], [0.5], [128])
    """
    name = q.dtype.name
    bits = _BITS[name]
    k, n = q.shape
    kb = -(-k // block)
    shift = (1 << (bits - 1)) if name.startswith("int") else 0
    codes = np.zeros((n, kb * block), np.uint8)
    codes[:, :k] = (q.astype(np.int16).T + shift).astype(np.uint8)
    s32 = np.asarray(s, np.float32)
    zi = None if z is None else np.asarray(z).astype(np.int16) + shift
    if s32.ndim == 2:  # per block: [kb, N]
        scales = np.ascontiguousarray(s32.T)
        zps = np.full((n, kb), shift, np.uint8) if zi is None else zi.T.astype(np.uint8)
    else:  # per channel [N] or per tensor: the one scale of a column in each of its blocks
        scales = np.ascontiguousarray(np.broadcast_to(s32.reshape(-1, 1), (n, kb)))
        zcol = np.full(n, shift, np.int16) if zi is None else np.broadcast_to(zi.reshape(-1), (n,))
        zps = np.ascontiguousarray(np.broadcast_to(zcol.reshape(-1, 1), (n, kb))).astype(np.uint8)
    if bits == 4:
        packed = codes.reshape(n, kb * block // 2, 2)
        b = (packed[..., 0] | (packed[..., 1] << 4)).reshape(n, kb, block // 2)
        zpad = np.zeros((n, 2 * -(-kb // 2)), np.uint8)
        zpad[:, :kb] = zps
        zout = (zpad[:, 0::2] | (zpad[:, 1::2] << 4)).reshape(-1)
    else:
        b = codes.reshape(n, kb, block)
        zout = zps.reshape(-1)
    return np.ascontiguousarray(b), scales.reshape(-1), np.ascontiguousarray(zout), bits


def _check_weight(m: Match, block_default: int) -> Match | NoMatch:
    """ONNX Runtime's ``ValidateDQForMatMulNBits`` (1.32) on the weight's DequantizeLinear."""
    dq = m.node("w")
    if dq.domain not in ("", "ai.onnx"):
        return NoMatch(f"the weight's DequantizeLinear '{dq.name}' is the {dq.domain} op", "pattern")
    q_v, z_v = m["q"], m["z"]
    if q_v is None or not q_v.is_const:
        return NoMatch(f"the weight {describe(q_v)} is not a constant")
    if not m.all_const("s", "z"):
        return NoMatch(f"the scale or zero point of {describe(q_v)} is not a constant")
    q = np.asarray(q_v.const)
    s = np.asarray(m.const("s"))
    z = None if z_v is None else np.asarray(z_v.const)
    if q.dtype.name not in _BITS or q.ndim != 2:
        return NoMatch(f"the weight is {q.dtype.name} of rank {q.ndim}; expected a 4- or 8-bit matrix")
    if s.dtype != np.float32:
        return NoMatch(f"the scale is {s.dtype}: quanta's MatMulNBits takes a float32 activation and scales")
    k, n = q.shape
    block = int(dq.attrs.get("block_size", 0))
    if block > 0:
        if int(dq.attrs.get("axis", 1)) != 0 or "axis" not in dq.attrs:
            return NoMatch("a weight per block is quantized along an axis other than 0 (K)")
        if block < 16 or block & (block - 1):
            return NoMatch(f"block_size {block} is not a power of 2 of at least 16")
        want = (-(-k // block), n)
        if s.shape != want or (z is not None and z.shape != want):
            return NoMatch(f"the scale {list(s.shape)} is not [{want[0]}, {n}] per block of {block}")
    elif s.ndim == 0:
        if z is not None and z.ndim != 0:
            return NoMatch(f"a per-tensor scale has a zero point of shape {list(z.shape)}")
        block = block_default
    elif s.ndim == 1 and s.shape[0] == n:
        if int(dq.attrs.get("axis", 1)) != 1:
            return NoMatch(f"the scale [{n}] runs along axis {dq.attrs.get('axis')}, not 1 (N)")
        if z is not None and z.shape != (n,):
            return NoMatch(f"a per-channel scale [{n}] has a zero point of shape {list(z.shape)}")
        block = block_default
    else:
        return NoMatch(f"the scale {list(s.shape)} is neither per block, per channel [{n}] nor per tensor")
    a = m["a"]
    if a is None or a.elem != F32:
        return NoMatch(f"the activation {describe(a)} is not float32")
    if a.producer is not None and a.producer.op_type == "DequantizeLinear":
        return NoMatch("the activation is dequantized too (a QDQ group: the lowering takes it)")
    y = m.value("y")
    if any(u.op_type == "QuantizeLinear" for u in y.consumers()):
        return NoMatch("a QuantizeLinear reads the product")
    m.data.update(q=q, s=s, z=z, block=block, k=k, n=n)
    return m


def _nbits(m: Match, b: Builder, accuracy_level: int, bias: Value | None) -> Value:
    k, n, block = m.data["k"], m.data["n"], m.data["block"]
    packed, scales, zps, bits = nbits_operands(m.data["q"], m.data["s"], m.data["z"], block)
    base = m["q"].name if m["q"] is not None else "w"
    inputs: list[Value | None] = [
        m["a"],
        b.const(f"{base}_nbits", packed),
        b.const(f"{base}_nbits_scales", scales),
        b.const(f"{base}_nbits_zero_points", zps),
    ]
    if bias is not None:
        inputs += [None, bias]
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block, "accuracy_level": accuracy_level}
    return b.op(
        "MatMulNBits",
        inputs,
        attrs,
        domain=MS,
        name=m.root.name or None,
        types=result_type(shape_from=m["y"], elem_from=m["y"]),
    )


class DQMatMulToNBits(Rule):
    """%y = MatMul(a, DequantizeLinear(q: const, s, z?)) -> com.microsoft::MatMulNBits"""

    pattern = "y = MatMul(a, w = DequantizeLinear(q, s, z?))"

    def __init__(self, block_size: int = DEFAULT_BLOCK, accuracy_level: int = DEFAULT_ACCURACY_LEVEL):
        super().__init__()
        self.block_size = block_size
        self.accuracy_level = accuracy_level

    def check(self, m: Match) -> Match | NoMatch:
        return _check_weight(m, self.block_size)

    def rewrite(self, m: Match, b: Builder) -> Value:
        return _nbits(m, b, self.accuracy_level, None)


class DQGemmToNBits(DQMatMulToNBits):
    """%y = Gemm(a, DequantizeLinear(q: const, s, z?), c?) -> com.microsoft::MatMulNBits(.., c)"""

    pattern = "y = Gemm(a, w = DequantizeLinear(q, s, z?), c?)"

    def check(self, m: Match) -> Match | NoMatch:
        g = m.root
        if abs(float(g.attrs.get("alpha", 1.0)) - 1.0) > 1e-6:
            return NoMatch(f"alpha is {g.attrs.get('alpha')}, not 1")
        if int(g.attrs.get("transA", 0)) or int(g.attrs.get("transB", 0)):
            return NoMatch("the Gemm transposes an operand")
        c = m["c"]
        if c is not None:
            if abs(float(g.attrs.get("beta", 1.0)) - 1.0) > 1e-6:
                return NoMatch(f"beta is {g.attrs.get('beta')} with a bias, not 1")
            n = m.value("q").shape[1] if m.value("q").shape is not None else None
            if c.shape is None or len(c.shape) != 1 or c.shape[0] != n or c.elem != F32:
                return NoMatch(f"the bias {describe(c)} is not float32 [{n}]")
        return _check_weight(m, self.block_size)

    def rewrite(self, m: Match, b: Builder) -> Value:
        return _nbits(m, b, self.accuracy_level, m["c"])


class OrtDQMatMulNBits(RewritePass):
    """The session's ONNX Runtime semantics for weight-only MatMul and Gemm (quanta.session:
    ``float_functions`` "auto" or "ort", graph_optimization_level 2 and above, as ONNX
    Runtime fuses them at its level 2)."""

    name = "ort_dq_matmul_nbits"
    rules = (DQMatMulToNBits(), DQGemmToNBits())

    def __init__(self, block_size: int = DEFAULT_BLOCK, accuracy_level: int = DEFAULT_ACCURACY_LEVEL):
        super().__init__(
            [DQMatMulToNBits(block_size, accuracy_level), DQGemmToNBits(block_size, accuracy_level)]
        )
