"""The ``--image-*`` options of the commands that read a folder of images (``quantize``,
``qat``), and the error a folder of images gets without them.

How an image becomes the model's input (its size, its normalization) is the model's
training recipe, which the file does not record: quanta never guesses it, since a wrong
mean or scale calibrates every range on the wrong data. The error names the model's
input and its shape, and gives the options that fit it.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

__all__ = ["add_image_options", "image_preprocess", "image_size", "require_preprocess"]


def image_size(text: str) -> tuple[int, int]:
    """``224`` -> (224, 224); ``480x800`` -> (480, 800): height x width (argparse type)."""
    parts = text.lower().replace("*", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        dims = ()
    if len(dims) == 1:
        dims = (dims[0], dims[0])
    if len(dims) != 2 or min(dims) < 1:
        raise argparse.ArgumentTypeError(f"expected SIZE or HEIGHTxWIDTH (e.g. 224 or 480x800), got {text!r}")
    return dims[0], dims[1]


def add_image_options(s: argparse.ArgumentParser, what: str = "images") -> None:
    """The ``--image-*`` options (``what``: how the help names the data)."""
    s.add_argument(
        "--image-size",
        type=image_size,
        metavar="SIZE|HxW",
        help=f"{what}: center crop to SIZE x SIZE or HEIGHT x WIDTH (after --image-resize)",
    )
    s.add_argument("--image-resize", type=int, help=f"{what}: resize the shorter side to this first")
    s.add_argument(
        "--image-mean", type=float, nargs="+", help=f"{what}: per-channel mean (after scaling to 0..1)"
    )
    s.add_argument("--image-std", type=float, nargs="+", help=f"{what}: per-channel std")
    s.add_argument("--image-layout", choices=["NCHW", "NHWC"], default="NCHW")


def image_preprocess(args: argparse.Namespace):
    """The :class:`~quanta.calibrate.readers.ImagePreprocess` the options declare, or None
    when ``--image-size`` is not given."""
    from quanta.calibrate.readers import ImagePreprocess

    if not args.image_size:
        return None
    return ImagePreprocess(
        resize=args.image_resize,
        crop=args.image_size,
        mean=tuple(args.image_mean) if args.image_mean else None,
        std=tuple(args.image_std) if args.image_std else None,
        layout=args.image_layout,
    )


def require_preprocess(data: str | os.PathLike, model: str | os.PathLike) -> str | None:
    """The message for a folder of images given without ``--image-size`` (None when
    ``data`` is not such a folder): the model's image input, its shape, and the options
    for it."""
    from quanta.calibrate.readers import IMAGE_SUFFIXES

    path = Path(data)
    if not path.is_dir():
        return None
    files = [p for p in path.iterdir() if p.is_file()]
    if any(p.suffix == ".npz" for p in files) or not any(p.suffix.lower() in IMAGE_SUFFIXES for p in files):
        return None
    where = ""
    example = (
        "--image-size 224 --image-resize 256 --image-mean 0.485 0.456 0.406 --image-std 0.229 0.224 0.225"
    )
    try:
        import onnx

        proto = onnx.load(os.fspath(model), load_external_data=False)
        inits = {t.name for t in proto.graph.initializer}
        inputs = [i for i in proto.graph.input if i.name not in inits]
        if len(inputs) == 1:
            dims = [
                d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                for d in inputs[0].type.tensor_type.shape.dim
            ]
            where = f" the model's input '{inputs[0].name}' is [{', '.join(map(str, dims))}];"
            if len(dims) == 4:
                nchw = dims[1] in (1, 3)
                h, w = (dims[2], dims[3]) if nchw else (dims[1], dims[2])
                if isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0:
                    size = str(h) if h == w else f"{h}x{w}"
                    example = f"--image-size {size} --image-resize {max(h, w)}" + (
                        "" if nchw else " --image-layout NHWC"
                    )
    except Exception:  # the quantizer's own loader reports what is wrong with the file
        pass
    return (
        f"{path}: a folder of images needs its preprocessing declared;{where} say how an image "
        f"becomes it, e.g. {example} (pixels are scaled to 0..1, then --image-mean / "
        "--image-std if given: use the model's training normalization)"
    )
