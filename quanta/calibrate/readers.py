"""Calibration data: every form a user may hand over, turned into validated feed dicts.

Accepted (``iter_feeds``):

- an ONNX Runtime-style ``CalibrationDataReader``: ``get_next()`` returns a feed dict or
  None (``rewind()`` is called first when present, so a reader can be reused);
- any iterable of feed dicts (a list, a generator);
- a path to one ``.npz`` file (one sample: one array per input name; or, with a single
  input, several arrays that are each a sample), or a folder of ``.npz`` files (sorted
  by name);
- a folder of images with an :class:`ImagePreprocess` (resize, center crop, scale /
  offset or mean / std, NCHW or NHWC); needs Pillow (``pip install pillow``).

``.npz`` files are read with ``allow_pickle=False``. Every feed is checked against the
model's inputs (name, dtype, rank, fixed dimensions) and an error names the sample,
the input and what the model expects. Samples may differ in their symbolic dimensions
(variable sequence length).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from quanta.ir.graph import Value
from quanta.ir.types import as_string_feed

__all__ = [
    "CalibrationDataError",
    "CalibrationDataReader",
    "ImagePreprocess",
    "SampleRef",
    "iter_feeds",
    "load_sample",
    "sample_refs",
    "validate_feed",
]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


class CalibrationDataError(ValueError):
    """Calibration data that cannot be used; the message names the sample and input."""


class CalibrationDataReader(Protocol):
    """ONNX Runtime's reader protocol: ``get_next()`` -> feed dict, or None at the end."""

    def get_next(self) -> dict[str, np.ndarray] | None: ...


@dataclass(frozen=True)
class ImagePreprocess:
    """How to turn an image file into a model input (applied in this order).

    1. convert to ``color`` ("RGB" or "L");
    2. resize the shorter side to ``resize`` (bilinear), when set;
    3. center crop to ``crop`` (height, width), when set;
    4. ``x = pixels * scale + offset`` (pixels in 0..255);
    5. ``x = (x - mean) / std`` per channel, when ``mean``/``std`` are set;
    6. layout "NCHW" or "NHWC", batch of one, dtype float32.

    ImageNet-style: ``ImagePreprocess(resize=256, crop=(224, 224), scale=1/255,
    mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))``.
    """

    resize: int | None = None
    crop: tuple[int, int] | None = None
    scale: float = 1.0 / 255.0
    offset: float = 0.0
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    layout: str = "NCHW"
    color: str = "RGB"

    def __post_init__(self) -> None:
        if self.layout not in ("NCHW", "NHWC"):
            raise ValueError(f"ImagePreprocess: layout must be 'NCHW' or 'NHWC', got {self.layout!r}")
        if self.color not in ("RGB", "L"):
            raise ValueError(f"ImagePreprocess: color must be 'RGB' or 'L', got {self.color!r}")
        if (self.mean is None) != (self.std is None):
            raise ValueError("ImagePreprocess: give both mean and std, or neither")

    def __call__(self, path: Path) -> np.ndarray:
        try:
            from PIL import Image
        except ImportError:
            raise CalibrationDataError(
                f"{path}: reading images needs Pillow (pip install pillow), or give .npz files instead"
            ) from None
        try:
            with Image.open(path) as im:
                im = im.convert(self.color)
                if self.resize:
                    w, h = im.size
                    k = self.resize / min(w, h)
                    im = im.resize((max(1, round(w * k)), max(1, round(h * k))), Image.BILINEAR)
                if self.crop:
                    ch, cw = self.crop
                    w, h = im.size
                    if ch > h or cw > w:
                        raise CalibrationDataError(
                            f"{path}: image {w}x{h} is smaller than the crop {cw}x{ch}"
                        )
                    left, top = (w - cw) // 2, (h - ch) // 2
                    im = im.crop((left, top, left + cw, top + ch))
                a = np.asarray(im, dtype=np.float32)
        except OSError as e:
            raise CalibrationDataError(f"{path}: not a readable image ({e})") from None
        if a.ndim == 2:
            a = a[:, :, None]
        a = a * np.float32(self.scale) + np.float32(self.offset)
        if self.mean is not None and self.std is not None:
            a = (a - np.asarray(self.mean, np.float32)) / np.asarray(self.std, np.float32)
        if self.layout == "NCHW":
            a = a.transpose(2, 0, 1)
        return np.ascontiguousarray(a[None], dtype=np.float32)


def _load_npz(path: Path, input_names: Sequence[str]) -> list[dict[str, np.ndarray]]:
    try:
        with np.load(path, allow_pickle=False) as d:
            arrays = {k: d[k] for k in d.files}
    except ValueError as e:
        raise CalibrationDataError(f"{path}: cannot read as .npz without pickle ({e})") from None
    except OSError as e:
        raise CalibrationDataError(f"{path}: not a valid .npz file ({e})") from None
    if set(arrays) <= set(input_names) and arrays:
        return [arrays]
    if len(input_names) == 1:
        # Several arrays, one input: each array is a sample (np.savez(f, *samples)).
        return [{input_names[0]: arrays[k]} for k in sorted(arrays)]
    raise CalibrationDataError(
        f"{path}: arrays {sorted(arrays)} do not match the model's inputs {list(input_names)}"
    )


def _from_path(path: Path, input_names: Sequence[str], preprocess: ImagePreprocess | None) -> Iterator[dict]:
    if path.is_file():
        if path.suffix == ".npz":
            yield from _load_npz(path, input_names)
            return
        raise CalibrationDataError(f"{path}: expected an .npz file or a folder of .npz files or images")
    if not path.is_dir():
        raise CalibrationDataError(f"{path}: no such file or folder")
    files = sorted(p for p in path.iterdir() if p.is_file())
    npz = [p for p in files if p.suffix == ".npz"]
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    if npz:
        for p in npz:
            yield from _load_npz(p, input_names)
        return
    if images:
        if preprocess is None:
            raise CalibrationDataError(
                f"{path}: a folder of images needs a declared preprocessing (ImagePreprocess / --image-* options)"
            )
        if len(input_names) != 1:
            raise CalibrationDataError(
                f"{path}: images can feed a model with one input, this one has {len(input_names)}"
            )
        for p in images:
            yield {input_names[0]: preprocess(p)}
        return
    raise CalibrationDataError(f"{path}: the folder holds no .npz files and no images")


def iter_feeds(
    data: Any,
    inputs: Sequence[Value],
    *,
    preprocess: ImagePreprocess | None = None,
    limit: int | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Validated feed dicts from any accepted form of calibration data (module docstring)."""
    names = [v.name for v in inputs]
    if isinstance(data, (str, os.PathLike)):
        source: Iterable[Any] = _from_path(Path(data), names, preprocess)
    elif hasattr(data, "get_next"):
        if hasattr(data, "rewind"):
            data.rewind()
        source = iter(data.get_next, None)
    elif isinstance(data, Mapping):
        source = [data]
    elif isinstance(data, Iterable):
        source = data
    else:
        raise CalibrationDataError(
            f"calibration data of type {type(data).__name__}: expected a CalibrationDataReader, an iterable of "
            "feed dicts, an .npz file or a folder"
        )
    for k, feed in enumerate(source):
        if limit is not None and k >= limit:
            return
        yield validate_feed(feed, inputs, k)


def validate_feed(feed: Any, inputs: Sequence[Value], index: int) -> dict[str, np.ndarray]:
    """Check one feed against the model's inputs; the error names sample and input."""
    expected = "; ".join(f"'{v.name}' {v.type}" for v in inputs)
    if not isinstance(feed, Mapping):
        raise CalibrationDataError(
            f"calibration sample {index}: expected a dict of input name -> array, got {type(feed).__name__}"
        )
    by_name = {v.name: v for v in inputs}
    out: dict[str, np.ndarray] = {}
    for name, value in feed.items():
        if name not in by_name:
            raise CalibrationDataError(
                f"calibration sample {index}: unknown input '{name}'; the model expects {expected}"
            )
        v = by_name[name]
        arr = np.asarray(value)
        t = v.type
        if t is not None:
            want = np.dtype(t.elem.numpy)
            if want == np.object_ and arr.dtype != want:
                arr = as_string_feed(arr)
            if arr.dtype != want:
                raise CalibrationDataError(
                    f"calibration sample {index}: input '{name}' has dtype {arr.dtype}, the model expects {want}"
                )
            if t.shape is not None:
                if arr.ndim != len(t.shape):
                    raise CalibrationDataError(
                        f"calibration sample {index}: input '{name}' has shape {list(arr.shape)} (rank {arr.ndim}), "
                        f"the model expects rank {len(t.shape)} {list(t.shape)}"
                    )
                for d, (got, exp) in enumerate(zip(arr.shape, t.shape)):
                    if isinstance(exp, int) and exp >= 0 and got != exp:
                        raise CalibrationDataError(
                            f"calibration sample {index}: input '{name}' dimension {d} is {got}, "
                            f"the model expects {exp} (shape {list(t.shape)})"
                        )
        out[name] = arr
    missing = [v.name for v in inputs if v.name not in out and v.const is None]
    if missing:
        raise CalibrationDataError(
            f"calibration sample {index}: missing input(s) {missing}; the model expects {expected}"
        )
    return out


# A sample addressed without loading it, so that a list of them can be split into shards
# and each shard read where it runs: ("feed", dict), ("npz", path, key) with key None for
# a file that is one sample, ("image", path).
SampleRef = tuple


def _npz_keys(path: Path, input_names: Sequence[str]) -> list[str | None]:
    """The samples of one .npz file, as _load_npz splits it, without reading the arrays."""
    try:
        with np.load(path, allow_pickle=False) as d:
            files = list(d.files)
    except (ValueError, OSError) as e:
        raise CalibrationDataError(f"{path}: not a valid .npz file ({e})") from None
    if set(files) <= set(input_names) and files:
        return [None]
    if len(input_names) == 1:
        return sorted(files)
    raise CalibrationDataError(
        f"{path}: arrays {sorted(files)} do not match the model's inputs {list(input_names)}"
    )


def _path_refs(path: Path, input_names: Sequence[str], preprocess: ImagePreprocess | None) -> list[SampleRef]:
    if path.is_file():
        if path.suffix == ".npz":
            return [("npz", str(path), k) for k in _npz_keys(path, input_names)]
        if path.suffix.lower() in IMAGE_SUFFIXES and preprocess is not None and len(input_names) == 1:
            return [("image", str(path))]
        raise CalibrationDataError(f"{path}: expected an .npz file or a folder of .npz files or images")
    if not path.is_dir():
        raise CalibrationDataError(f"{path}: no such file or folder")
    files = sorted(p for p in path.iterdir() if p.is_file())
    npz = [p for p in files if p.suffix == ".npz"]
    images = [p for p in files if p.suffix.lower() in IMAGE_SUFFIXES]
    if npz:
        return [ref for p in npz for ref in _path_refs(p, input_names, preprocess)]
    if images:
        if preprocess is None:
            raise CalibrationDataError(
                f"{path}: a folder of images needs a declared preprocessing (ImagePreprocess / --image-* options)"
            )
        if len(input_names) != 1:
            raise CalibrationDataError(
                f"{path}: images can feed a model with one input, this one has {len(input_names)}"
            )
        return [("image", str(p)) for p in images]
    raise CalibrationDataError(f"{path}: the folder holds no .npz files and no images")


def sample_refs(
    data: Any, inputs: Sequence[Value], *, preprocess: ImagePreprocess | None = None, limit: int | None = None
) -> list[SampleRef]:
    """The samples of ``data`` in the order :func:`iter_feeds` yields them, as references
    that :func:`load_sample` reads. Paths (a file, a folder, a list of them) stay paths;
    feed dicts are kept as they are; a reader or a generator is read into memory (it
    cannot be split otherwise)."""
    names = [v.name for v in inputs]
    if isinstance(data, (str, os.PathLike)):
        refs = _path_refs(Path(data), names, preprocess)
    elif isinstance(data, Mapping):
        refs = [("feed", data)]
    elif isinstance(data, (list, tuple)) and data and all(isinstance(d, (str, os.PathLike)) for d in data):
        refs = [ref for d in data for ref in _path_refs(Path(d), names, preprocess)]
    else:
        refs = [("feed", feed) for feed in _raw_source(data, names, preprocess, limit)]
    return refs if limit is None else refs[:limit]


def _raw_source(
    data: Any, names: Sequence[str], preprocess: ImagePreprocess | None, limit: int | None
) -> Iterator[Any]:
    if hasattr(data, "get_next"):
        if hasattr(data, "rewind"):
            data.rewind()
        source: Iterable[Any] = iter(data.get_next, None)
    elif isinstance(data, Iterable):
        source = data
    else:
        raise CalibrationDataError(
            f"calibration data of type {type(data).__name__}: expected a CalibrationDataReader, an iterable of "
            "feed dicts, an .npz file or a folder"
        )
    for k, feed in enumerate(source):
        if limit is not None and k >= limit:
            return
        yield feed


def load_sample(ref: SampleRef, input_names: Sequence[str], preprocess: ImagePreprocess | None = None) -> Any:
    """The feed a :func:`sample_refs` reference stands for (validated later, by iter_feeds)."""
    kind = ref[0]
    if kind == "feed":
        return ref[1]
    if kind == "image":
        if preprocess is None:
            raise CalibrationDataError(f"{ref[1]}: an image needs a declared preprocessing (ImagePreprocess)")
        return {input_names[0]: preprocess(Path(ref[1]))}
    if kind == "npz":
        path, key = Path(ref[1]), ref[2]
        try:
            with np.load(path, allow_pickle=False) as d:
                return {k: d[k] for k in d.files} if key is None else {input_names[0]: d[key]}
        except (ValueError, OSError) as e:
            raise CalibrationDataError(f"{path}: cannot read as .npz without pickle ({e})") from None
    raise ValueError(f"load_sample: unknown sample reference {kind!r}")
