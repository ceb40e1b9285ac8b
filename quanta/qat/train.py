"""Quantization-aware distillation (QAD) without labels.

The float model is the teacher: its outputs on the calibration data (and, optionally,
on horizontally flipped copies, and a few intermediate tensors) are computed once; the
fake-quantized student is trained to reproduce them (KL divergence of the softmax at a
temperature for classifier logits, a ``[N, C]`` output, else the mean squared error
normalised by the teacher's variance; intermediate tensors by the normalised MSE). A
held-out part of the data measures the output loss for early stopping; the best state
seen on it is the one returned. CPU only.

Determinism: ``seed`` seeds PyTorch and the shuffling; with the same data, seed and
thread count the run gives the same weights bit for bit (PyTorch's CPU kernels split
their reductions by thread, so a different ``torch.set_num_threads`` may change the
last bits, and a time budget stops after however many steps fit).
"""

from __future__ import annotations

import copy
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper

from quanta.qat.module import QatModel

__all__ = ["DistillResult", "distill", "stack_feeds"]


@dataclass
class DistillResult:
    """What a distillation run did."""

    steps: int = 0
    seconds: float = 0.0
    best_step: int = 0
    initial_holdout_loss: float = math.nan
    best_holdout_loss: float = math.nan
    stopped: str = ""
    history: list[tuple[int, float, float]] = field(default_factory=list)  # (step, train, holdout)

    def format(self) -> str:
        return (
            f"distilled {self.steps} step(s) in {self.seconds:.0f} s ({self.stopped}); held-out loss "
            f"{self.initial_holdout_loss:.4g} -> {self.best_holdout_loss:.4g} (best at step {self.best_step})"
        )


def stack_feeds(feeds: Sequence[dict[str, np.ndarray]], names: Sequence[str]) -> list[torch.Tensor]:
    """One tensor per input: the feeds concatenated along the batch axis."""
    return [torch.from_numpy(np.concatenate([np.asarray(f[n]) for f in feeds], axis=0)) for n in names]


def _teacher_fn(
    fp32_model: Any, names: Sequence[str], features: Sequence[str] = ()
) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """The teacher as a function of input tensors: its outputs, then ``features`` (tensor
    names of an ONNX teacher, made graph outputs)."""
    onnx_like = isinstance(fp32_model, (str, os.PathLike, bytes, onnx.ModelProto))
    if features and not onnx_like:
        raise ValueError("distill: features= needs the FP32 model as an ONNX file or ModelProto")
    if isinstance(fp32_model, torch.nn.Module):
        m = fp32_model.eval()

        def run(xs):
            with torch.no_grad():
                y = m(*xs)
            return list(y) if isinstance(y, (tuple, list)) else [y]

        return run
    if callable(fp32_model) and not isinstance(fp32_model, (str, os.PathLike, bytes, onnx.ModelProto)):
        return lambda xs: [torch.as_tensor(np.asarray(y)) for y in fp32_model(*xs)]
    from quanta.session import InferenceSession

    src = fp32_model.SerializeToString() if isinstance(fp32_model, onnx.ModelProto) else fp32_model
    if features:
        from quanta.ir.onnx_io import load_proto

        proto = onnx.ModelProto()
        proto.CopyFrom(fp32_model if isinstance(fp32_model, onnx.ModelProto) else load_proto(fp32_model)[0])
        known = {o for n in proto.graph.node for o in n.output}
        missing = [f for f in features if f not in known]
        if missing:
            raise ValueError(f"distill: features {missing} are not tensors computed by the FP32 model")
        for f in features:
            proto.graph.output.append(helper.make_tensor_value_info(f, onnx.TensorProto.FLOAT, None))
        src = proto.SerializeToString()
    sess = InferenceSession(src)

    def run_onnx(xs):
        outs = []
        for i in range(xs[0].shape[0]):  # one sample at a time: any declared batch size works
            outs.append(sess.run(None, {n: x[i : i + 1].numpy() for n, x in zip(names, xs)}))
        return [torch.from_numpy(np.concatenate([o[k] for o in outs])) for k in range(len(outs[0]))]

    return run_onnx


def _loss(
    student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor], kind: str, temperature: float = 1.0
) -> torch.Tensor:
    total = torch.zeros(())
    for s, t in zip(student, teacher):
        s = s.float()
        t = t.float()
        if kind == "kl" or (kind == "auto" and s.dim() == 2 and s.shape[1] > 1):
            # Hinton's distillation loss: KL of the softened distributions, times T^2 so
            # that its gradient keeps the scale of T = 1
            p = torch.log_softmax(t / temperature, dim=1)
            total = total + temperature**2 * torch.nn.functional.kl_div(
                torch.log_softmax(s / temperature, dim=1), p, log_target=True, reduction="batchmean"
            )
        else:
            total = total + _nmse(s, t)
    return total


def _nmse(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Mean squared error normalised by the teacher's variance (1 = predicting its mean)."""
    return torch.mean((s.float() - t.float()) ** 2) / (torch.var(t.float()) + 1e-12)


def _rate(progress: float, schedule: str, warmup: float) -> float:
    """The learning-rate multiplier at ``progress`` (0 -> 1 of the run): a linear warm-up
    over the first ``warmup`` of it, then constant or a cosine decay to 0."""
    if warmup > 0 and progress < warmup:
        return (progress + 1e-3) / warmup
    if schedule == "cosine":
        rest = (progress - warmup) / max(1e-9, 1.0 - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, rest)))
    return 1.0


def _hflip(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1) if x.dim() == 4 else x


class _Bar:
    def __init__(
        self, total: int | None, budget: float | None, enabled: bool, clock: Callable[[], float]
    ) -> None:
        self.total, self.budget, self.enabled, self.clock = total, budget, enabled, clock
        self.t0 = clock()

    def update(self, step: int, loss: float, holdout: float) -> None:
        if not self.enabled:
            return
        el = self.clock() - self.t0
        frac = step / self.total if self.total else 0.0
        if self.budget:
            frac = max(frac, el / self.budget)
        frac = min(1.0, frac)
        bar = "#" * int(frac * 30)
        sys.stderr.write(
            f"\rqat distill [{bar:<30}] step {step} loss {loss:.4g} held-out {holdout:.4g} {el:.0f}s"
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def distill(
    prepared: QatModel,
    fp32_model: Any,
    data: Any,
    *,
    steps: int | None = None,
    time_budget: float | None = None,
    batch_size: int = 8,
    lr: float = 0.002,
    scale_lr: float | None = None,
    holdout: float = 0.2,
    eval_every: int = 10,
    patience: int = 5,
    loss: str = "auto",
    temperature: float = 1.0,
    features: Sequence[str] = (),
    feature_weight: float = 1.0,
    augment: str | None = None,
    schedule: str = "constant",
    warmup: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
    seed: int = 0,
    progress: bool = True,
) -> DistillResult:
    """Train ``prepared`` in place to match ``fp32_model`` on ``data`` (no labels).

    ``fp32_model``: the float ONNX file / ModelProto (run by quanta), an ``nn.Module``, or
    a callable on tensors. ``data``: feed dicts, or anything ``quantize_static`` accepts as
    calibration data. Stops after ``steps`` or ``time_budget`` seconds of ``clock``
    (default 100 steps when neither is given), or when the held-out loss has not
    improved for ``patience`` evaluations; the best held-out state is kept. ``lr`` is
    Adam's step in units of each parameter's quantization step
    (``QatModel.parameter_steps``: 0.002 moves a weight by about 1/500 of its LSB per
    step; Adam moves all weights of a layer coherently, so the layer output moves
    ~sqrt(K) times more); ``scale_lr`` likewise for learned scales (LSQ), default
    ``lr / 10``.

    ``temperature``: of the KL loss on logits (times T^2). ``features``: names of
    intermediate tensors of the FP32 ONNX model (Conv / Add outputs: the student's tensor
    of the same name, before its quantization) matched by the normalised MSE, each
    weighted ``feature_weight / len(features)``. ``augment="hflip"``: the training part
    (not the held-out one) also enters mirrored (4-D inputs flipped on the last axis,
    the teacher run on them once). ``schedule``: "constant" or "cosine" over the steps or
    the budget, after a linear warm-up over the first ``warmup`` fraction of it.
    """
    if steps is None and time_budget is None:
        steps = 100
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"distill: schedule must be 'constant' or 'cosine', got {schedule!r}")
    if augment not in (None, "hflip"):
        raise ValueError(f"distill: augment must be None or 'hflip', got {augment!r}")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    names = prepared.input_names
    feeds = _feeds(data, fp32_model, names)
    if len(feeds) < 2:
        raise ValueError(f"distill: needs at least 2 samples (one held out), got {len(feeds)}")
    features = list(features)
    computed = {o for node in prepared.nodes for o in node.output}
    missing = [f for f in features if f not in computed]
    if missing:
        raise ValueError(f"distill: features {missing} are not tensors of the prepared model")
    xs = stack_feeds(feeds, names)
    n = xs[0].shape[0]
    teacher = _teacher_fn(fp32_model, names, features)
    perm = torch.randperm(n, generator=gen)
    n_hold = max(1, round(n * holdout)) if holdout > 0 else 0
    hold, train = perm[:n_hold], perm[n_hold:]
    if augment == "hflip":
        xs = [torch.cat([x, _hflip(x[train])]) for x in xs]
        train = torch.cat([train, torch.arange(n, n + len(train))])
    t_all = [
        torch.cat(parts)
        for parts in zip(*(teacher([x[i : i + 32] for x in xs]) for i in range(0, xs[0].shape[0], 32)))
    ]
    n_out = len(t_all) - len(features)
    t_out, t_feat = t_all[:n_out], t_all[n_out:]
    # Adam moves a parameter by about ``lr`` per step whatever its gradient's size, so
    # each tensor gets ``lr`` times its quantization step: a fraction of an LSB per step
    opt_groups = []
    floors = []
    for kind, p, step in prepared.parameter_steps():
        rate = (scale_lr if scale_lr is not None else lr / 10) if kind == "scales" else lr
        opt_groups.append({"params": [p], "lr": rate * step, "base_lr": rate * step})
        if kind == "scales":
            # a scale must stay a positive normal float32: kept above a thousandth of
            # its calibrated value
            floors.append((p, p.detach().abs() * 1e-3))
    opt = torch.optim.Adam(opt_groups)
    exact = prepared.exact
    prepared.exact = False
    res = DistillResult()

    def holdout_loss() -> float:
        if n_hold == 0:
            return math.nan
        with torch.no_grad():
            tot = 0.0
            for i in range(0, n_hold, batch_size):
                idx = hold[i : i + batch_size]
                out = prepared(*(x[idx] for x in xs))
                out = list(out) if isinstance(out, tuple) else [out]
                tot += float(_loss(out, [t[idx] for t in t_out], loss, temperature)) * len(idx)
        return tot / n_hold

    t0 = clock()
    best = holdout_loss()
    res.initial_holdout_loss = res.best_holdout_loss = best
    best_state = copy.deepcopy(prepared.state_dict())
    bar = _Bar(steps, time_budget, progress, clock)
    since_best, step, pos, last_train = 0, 0, 0, math.nan
    res.stopped = "steps"
    while True:
        elapsed = clock() - t0
        if steps is not None and step >= steps:
            break
        if time_budget is not None and elapsed >= time_budget:
            res.stopped = "time budget"
            break
        done = max(step / steps if steps else 0.0, elapsed / time_budget if time_budget else 0.0)
        mult = _rate(done, schedule, warmup)
        for group in opt.param_groups:
            group["lr"] = group["base_lr"] * mult
        if pos + batch_size > len(train):
            train = train[torch.randperm(len(train), generator=gen)]
            pos = 0
        idx = train[pos : pos + batch_size]
        pos += batch_size
        prepared.taps = tuple(features)
        out = prepared(*(x[idx] for x in xs))
        prepared.taps = ()
        out = list(out) if isinstance(out, tuple) else [out]
        lv = _loss(out, [t[idx] for t in t_out], loss, temperature)
        if features:
            for f, t in zip(features, t_feat):
                lv = lv + feature_weight / len(features) * _nmse(prepared.tapped[f], t[idx])
            prepared.tapped = {}
        opt.zero_grad(set_to_none=True)
        lv.backward()
        opt.step()
        with torch.no_grad():
            for p, floor in floors:
                p.copy_(torch.maximum(p, floor))
        step += 1
        last_train = float(lv.detach())
        if step % eval_every == 0 or (steps is not None and step == steps):
            h = holdout_loss()
            res.history.append((step, last_train, h))
            if n_hold == 0 or h < best:
                best, since_best = h, 0
                res.best_step = step
                best_state = copy.deepcopy(prepared.state_dict())
            else:
                since_best += 1
                if since_best >= patience:
                    res.stopped = "early stopping"
                    break
            bar.update(step, last_train, h)
    bar.close()
    if n_hold and res.best_step != step:
        prepared.load_state_dict(best_state)
    res.steps = step
    res.best_holdout_loss = best
    res.seconds = clock() - t0
    prepared.exact = exact
    return res


def _feeds(data: Any, fp32_model: Any, names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    if isinstance(data, (list, tuple)) and data and isinstance(data[0], dict):
        return [{k: np.asarray(v) for k, v in d.items()} for d in data]
    from quanta.calibrate.readers import iter_feeds
    from quanta.ir.onnx_io import from_proto, load_proto

    if isinstance(fp32_model, (str, os.PathLike, bytes, onnx.ModelProto)):
        proto = fp32_model if isinstance(fp32_model, onnx.ModelProto) else load_proto(fp32_model)[0]
        inputs = from_proto(proto).graph.inputs
        return list(iter_feeds(data, inputs))
    return [{n: np.asarray(v) for n, v in zip(names, d)} for d in data]
