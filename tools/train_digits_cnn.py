"""Train the demo CNN of ``quanta demo`` on scikit-learn's digits and export it to ONNX.

This is a development tool, not part of the quanta package: it needs PyTorch and
scikit-learn, which quanta does not depend on. Its outputs are committed in
``quanta/cli/assets/`` (see the README there); run it again only to change the model::

    pip install scikit-learn torch==2.13.0      # the CPU wheel
    python tools/train_digits_cnn.py            # 10-40 s on 2 cores

Data. scikit-learn's digits (1797 grayscale 8x8 images, pixel values 0..16, 10 classes)
ship inside the scikit-learn package, so nothing is downloaded. The images are split once,
stratified by class, with ``SEED``: 1200 train, 200 calibration, 397 held-out test. The
calibration and test images are saved (float32, pixel / 16, so in [0, 1]) together with
the test labels; the training images are not.

Preprocessing. The model's input is the scaled image ``x = pixel / 16`` of shape
[N, 1, 8, 8]. The normalization ``(x - MEAN) * (1 / STD)`` (MEAN and STD of the training
images, one scalar each) is the first two nodes of the ONNX graph (Sub, Mul), so a user
feeds images as they are and the quantizer sees a real-world input range.

Model (ONNX opset 17, BatchNormalization kept as separate nodes for the compiler to fold)::

    input [N,1,8,8] -> Sub -> Mul                                   normalization
      -> Conv 3x3 1->12 -> BN -> Relu                              stem        [N,12,8,8]
      -> [Conv dw 3x3 (group 12) -> BN -> Relu -> Conv 1x1 12->12 -> BN] + skip -> Relu
      -> MaxPool 2x2                                                          [N,12,4,4]
      -> Conv 3x3 12->24 -> BN -> Relu                                        [N,24,4,4]
      -> [Conv dw 3x3 (group 24) -> BN -> Relu -> Conv 1x1 24->24 -> BN] + skip -> Relu
      -> GlobalAveragePool -> Flatten -> Gemm 24->10 (transB=1)     logits     [N,10]

Channel counts 12 and 24 are deliberately not multiples of 8 or 16, so kernels with
tiles of those sizes meet their edge cases on the demo. The convolutions have no bias
input (the BN that follows supplies it), as PyTorch exports them.

The export builds the graph with ``onnx.helper`` from the trained ``state_dict`` (no
``torch.onnx``), checks it with ``onnx.checker.check_model(full_check=True)``, and
compares ONNX Runtime's logits with PyTorch's on the test images.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn

SEED = 20240607
N_TRAIN = 1200
N_CALIB = 200
EPOCHS = 40
BATCH = 50
LR = 0.01
WEIGHT_DECAY = 1e-4
OPSET = 17
IR_VERSION = 8  # the IR version that goes with opset 17, so older onnx releases load the file
C1, C2 = 12, 24
BN_EPS = 1e-5
MIN_ACCURACY = 0.95
# float32 reassociation between PyTorch's and ONNX Runtime's conv kernels: logits are
# O(10) and each goes through ~7 float32 layers, so differences stay well below 1e-4.
MAX_LOGIT_DIFF = 1e-4

ASSETS = Path(__file__).resolve().parents[1] / "quanta" / "cli" / "assets"


def load_split() -> dict[str, np.ndarray]:
    """Return the stratified train / calibration / test split, images scaled to [0, 1]."""
    digits = load_digits()
    x = (digits.images.astype(np.float32) / 16.0)[:, None, :, :]  # [1797, 1, 8, 8]
    y = digits.target.astype(np.int64)
    if len(np.unique(x.reshape(len(x), -1), axis=0)) != len(x):
        raise RuntimeError("digits contains duplicate images: the split would not be disjoint")
    x_rest, test_x, y_rest, test_y = train_test_split(
        x, y, train_size=N_TRAIN + N_CALIB, stratify=y, random_state=SEED
    )
    train_x, calib_x, train_y, _ = train_test_split(
        x_rest, y_rest, train_size=N_TRAIN, stratify=y_rest, random_state=SEED
    )
    return {"train_x": train_x, "train_y": train_y, "calib_x": calib_x, "test_x": test_x, "test_y": test_y}


class Residual(nn.Module):
    """Depthwise 3x3 -> BN -> Relu -> pointwise 1x1 -> BN, added to the block's input."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.dw = nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)
        self.dw_bn = nn.BatchNorm2d(channels, eps=BN_EPS)
        self.pw = nn.Conv2d(channels, channels, 1, bias=False)
        self.pw_bn = nn.BatchNorm2d(channels, eps=BN_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.dw_bn(self.dw(x)))
        return torch.relu(x + self.pw_bn(self.pw(h)))


class DigitsCNN(nn.Module):
    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.mean = mean
        self.inv_std = 1.0 / std
        self.stem = nn.Conv2d(1, C1, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(C1, eps=BN_EPS)
        self.block1 = Residual(C1)
        self.pool = nn.MaxPool2d(2)
        self.expand = nn.Conv2d(C1, C2, 3, padding=1, bias=False)
        self.expand_bn = nn.BatchNorm2d(C2, eps=BN_EPS)
        self.block2 = Residual(C2)
        self.fc = nn.Linear(C2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) * self.inv_std
        x = torch.relu(self.stem_bn(self.stem(x)))
        x = self.pool(self.block1(x))
        x = torch.relu(self.expand_bn(self.expand(x)))
        x = self.block2(x)
        return self.fc(x.mean(dim=(2, 3)))


def shift_augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Translate each image by -1, 0 or +1 pixel in each direction (zero fill)."""
    padded = nn.functional.pad(x, (1, 1, 1, 1))
    dy, dx = torch.randint(0, 3, (2, len(x)), generator=generator)
    return torch.stack([padded[i, :, dy[i] : dy[i] + 8, dx[i] : dx[i] + 8] for i in range(len(x))])


def train(split: dict[str, np.ndarray]) -> DigitsCNN:
    torch.manual_seed(SEED)
    torch.use_deterministic_algorithms(True)
    generator = torch.Generator().manual_seed(SEED)
    train_x = torch.from_numpy(split["train_x"])
    train_y = torch.from_numpy(split["train_y"])
    model = DigitsCNN(mean=float(train_x.mean()), std=float(train_x.std()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    steps = EPOCHS * (len(train_x) // BATCH)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=LR, total_steps=steps)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(EPOCHS):
        model.train()
        order = torch.randperm(len(train_x), generator=generator)
        total = 0.0
        for start in range(0, len(order) - BATCH + 1, BATCH):
            idx = order[start : start + BATCH]
            loss = loss_fn(model(shift_augment(train_x[idx], generator)), train_y[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.item() * BATCH
        if epoch % 10 == 9 or epoch == EPOCHS - 1:
            print(f"epoch {epoch + 1:3d}  train loss {total / len(order):.4f}")
    model.eval()
    return model


def _const(name: str, array: np.ndarray) -> TensorProto:
    # np.array (not np.ascontiguousarray, which turns a scalar into shape [1]) keeps rank 0.
    return numpy_helper.from_array(np.array(array, dtype=np.float32, order="C"), name)


def export_onnx(model: DigitsCNN) -> onnx.ModelProto:
    """Build the ONNX graph node by node from the trained parameters (eval mode)."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = [
        _const("norm.mean", np.array(model.mean, dtype=np.float32)),
        _const("norm.inv_std", np.array(model.inv_std, dtype=np.float32)),
    ]

    def conv(x: str, prefix: str, *, pads: int, group: int = 1) -> str:
        w = sd[f"{prefix}.weight"]
        inits.append(_const(f"{prefix}.weight", w))
        kh, kw = w.shape[2:]
        nodes.append(
            helper.make_node(
                "Conv",
                [x, f"{prefix}.weight"],
                [prefix],
                name=prefix,
                kernel_shape=[kh, kw],
                pads=[pads] * 4,
                strides=[1, 1],
                dilations=[1, 1],
                group=group,
            )
        )
        return prefix

    def bn(x: str, prefix: str) -> str:
        names = [f"{prefix}.{p}" for p in ("weight", "bias", "running_mean", "running_var")]
        inits.extend(_const(n, sd[n]) for n in names)
        nodes.append(
            helper.make_node("BatchNormalization", [x, *names], [prefix], name=prefix, epsilon=BN_EPS)
        )
        return prefix

    def op(op_type: str, inputs: list[str], name: str, **attrs: object) -> str:
        nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def residual(x: str, prefix: str, channels: int) -> str:
        h = op(
            "Relu",
            [bn(conv(x, f"{prefix}.dw", pads=1, group=channels), f"{prefix}.dw_bn")],
            f"{prefix}.dw_relu",
        )
        h = bn(conv(h, f"{prefix}.pw", pads=0), f"{prefix}.pw_bn")
        return op("Relu", [op("Add", [x, h], f"{prefix}.add")], f"{prefix}.relu")

    x = op("Sub", ["input", "norm.mean"], "norm.sub")
    x = op("Mul", [x, "norm.inv_std"], "norm.mul")
    x = op("Relu", [bn(conv(x, "stem", pads=1), "stem_bn")], "stem_relu")
    x = residual(x, "block1", C1)
    x = op("MaxPool", [x], "pool", kernel_shape=[2, 2], strides=[2, 2])
    x = op("Relu", [bn(conv(x, "expand", pads=1), "expand_bn")], "expand_relu")
    x = residual(x, "block2", C2)
    x = op("GlobalAveragePool", [x], "gap")
    x = op("Flatten", [x], "flatten", axis=1)
    inits += [_const("fc.weight", sd["fc.weight"]), _const("fc.bias", sd["fc.bias"])]
    nodes.append(helper.make_node("Gemm", [x, "fc.weight", "fc.bias"], ["logits"], name="fc", transB=1))

    graph = helper.make_graph(
        nodes,
        "digits_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 10])],
        initializer=inits,
    )
    onnx_model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="quanta tools/train_digits_cnn.py",
        doc_string="Demo CNN for `quanta demo`: scikit-learn digits, input = pixel / 16 in [0, 1].",
    )
    onnx_model.ir_version = IR_VERSION
    onnx.checker.check_model(onnx_model, full_check=True)
    return onnx_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ASSETS, help=f"where to write the assets ({ASSETS})")
    parser.add_argument("--threads", type=int, default=2, help="PyTorch intra-op threads (default 2)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()

    split = load_split()
    model = train(split)
    with torch.no_grad():
        torch_logits = model(torch.from_numpy(split["test_x"])).numpy()
    onnx_model = export_onnx(model)

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        onnx_model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    ort_logits = session.run(["logits"], {"input": split["test_x"]})[0]
    diff = float(np.max(np.abs(ort_logits - torch_logits)))
    torch_acc = float(np.mean(torch_logits.argmax(1) == split["test_y"]))
    ort_acc = float(np.mean(ort_logits.argmax(1) == split["test_y"]))
    if diff >= MAX_LOGIT_DIFF:
        raise RuntimeError(
            f"ONNX Runtime logits differ from PyTorch's by {diff:.3g} (limit {MAX_LOGIT_DIFF})"
        )
    if ort_acc < MIN_ACCURACY:
        raise RuntimeError(f"test accuracy {ort_acc:.4f} is below {MIN_ACCURACY}")

    args.out_dir.mkdir(parents=True, exist_ok=True)
    model_path = args.out_dir / "digits_cnn.onnx"
    data_path = args.out_dir / "digits_data.npz"
    onnx.save(onnx_model, model_path)
    np.savez_compressed(data_path, calib_x=split["calib_x"], test_x=split["test_x"], test_y=split["test_y"])
    print(f"mean {model.mean!r}  std {1.0 / model.inv_std!r}")
    print(
        f"test accuracy: PyTorch {torch_acc:.4f}, ONNX Runtime {ort_acc:.4f} on {len(split['test_y'])} images"
    )
    print(f"max |logit difference| PyTorch vs ONNX Runtime: {diff:.3g}")
    print(
        f"wrote {model_path} ({model_path.stat().st_size} bytes), {data_path} ({data_path.stat().st_size} bytes)"
    )
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
