"""Per-tensor error of a quantized model against its source: RMSE, max abs error, relative RMSE.

Tensors are read straight from the files (memory-mapped, a chunk of rows at a time) and
dequantized with the numpy reference for Q8_0/Q4_0 and gguf.quants for the other types.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants
from ondevice.quant import reference
from ondevice.quant.formats import block_format

from ondevice.core.errors import QuantError
from ondevice.gguf.reader import GGUFFile, TensorInfo, read_gguf

__all__ = ["TensorError", "tensor_errors", "read_tensor", "iter_tensor_rows"]

_CHUNK_ELEMENTS = 1 << 22  # rows are dequantized about 4M weights at a time


@dataclass(frozen=True)
class TensorError:
    """How far one tensor of a model is from the same tensor in its source."""

    name: str  # tensor name
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length
    type_name: str  # tensor type in the model
    source_type: str  # tensor type in the source
    n_elements: int  # weights in the tensor
    n_bytes: int  # bytes of the tensor in the model
    bits_per_weight: float  # 8 * n_bytes / n_elements
    rmse: float | None  # sqrt(mean((model - source)^2)), weight units; None: type not decodable
    max_abs_error: float | None  # max |model - source|, weight units
    rel_rmse: float | None  # rmse / sqrt(mean(source^2)); 0 where the source is all zeros

    def to_dict(self) -> dict:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


def _dequantize(raw: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    name = qtype.name
    if name in reference.SUPPORTED:
        return reference.dequantize(raw, name)
    try:
        return np.asarray(gguf_quants.dequantize(raw, qtype), dtype=np.float32)
    except NotImplementedError:
        raise QuantError(f"cannot dequantize tensor type {name}") from None


def iter_tensor_rows(g: GGUFFile, t: TensorInfo, chunk_elements: int = _CHUNK_ELEMENTS) -> Iterator[np.ndarray]:
    """float32 blocks of whole rows of tensor `t`, shape (rows, row_length), in order."""
    fmt = block_format(t.ggml_type)
    row_len = int(t.shape[0]) if t.shape else 1
    row_bytes = fmt.row_bytes(row_len)
    n_rows = t.n_elements // row_len
    if row_bytes * n_rows != t.n_bytes:
        raise QuantError(f"{g.path}: tensor {t.name} has {t.n_bytes} bytes, its shape needs {row_bytes * n_rows}")
    data = np.memmap(g.path, dtype=np.uint8, mode="r", offset=t.offset, shape=(n_rows, row_bytes))
    step = max(1, chunk_elements // row_len)
    for start in range(0, n_rows, step):
        yield _dequantize(np.array(data[start : start + step]), t.ggml_type).reshape(-1, row_len)


def read_tensor(path: str | Path, name: str) -> np.ndarray:
    """A whole tensor as float32, numpy shape (rows, row_length)."""
    g = read_gguf(path)
    t = _find(g, name)
    return np.concatenate(list(iter_tensor_rows(g, t)), axis=0)


def _find(g: GGUFFile, name: str) -> TensorInfo:
    for t in g.tensors:
        if t.name == name:
            return t
    raise QuantError(f"{g.path}: no tensor named {name!r}")


def _compare(gm: GGUFFile, tm: TensorInfo, gs: GGUFFile, ts: TensorInfo) -> TensorError:
    sq_err = sq_src = 0.0
    max_err = 0.0
    decodable = True
    try:
        for got, want in zip(iter_tensor_rows(gm, tm), iter_tensor_rows(gs, ts)):
            diff = got.astype(np.float64) - want
            sq_err += float(np.dot(diff.ravel(), diff.ravel()))
            sq_src += float(np.dot(want.ravel().astype(np.float64), want.ravel()))
            max_err = max(max_err, float(np.max(np.abs(diff))) if diff.size else 0.0)
    except QuantError:
        decodable = False
    n = tm.n_elements
    rmse = float(np.sqrt(sq_err / n)) if decodable and n else None
    rms_src = float(np.sqrt(sq_src / n)) if n else 0.0
    return TensorError(
        name=tm.name,
        shape=tuple(int(x) for x in tm.shape),
        type_name=tm.type_name,
        source_type=ts.type_name,
        n_elements=n,
        n_bytes=tm.n_bytes,
        bits_per_weight=8.0 * tm.n_bytes / n if n else 0.0,
        rmse=rmse,
        max_abs_error=max_err if decodable else None,
        rel_rmse=(rmse / rms_src if rms_src else 0.0) if rmse is not None else None,
    )


def tensor_errors(
    model: str | Path, source: str | Path, *, progress: Callable[[int, int], None] | None = None
) -> list[TensorError]:
    """Compare every tensor of `model` with the same-named tensor of `source`, in file order."""
    gm, gs = read_gguf(model), read_gguf(source)
    by_name = {t.name: t for t in gs.tensors}
    missing = [t.name for t in gm.tensors if t.name not in by_name]
    if missing:
        raise QuantError(
            f"{source} is not the source of {model}: it has no tensor {missing[0]!r} ({len(missing)} missing)"
        )
    out: list[TensorError] = []
    for i, tm in enumerate(gm.tensors):
        ts = by_name[tm.name]
        if tuple(ts.shape) != tuple(tm.shape):
            raise QuantError(f"tensor {tm.name}: shape {list(tm.shape)} in {model}, {list(ts.shape)} in {source}")
        out.append(_compare(gm, tm, gs, ts))
        if progress:
            progress(i + 1, len(gm.tensors))
    return out
