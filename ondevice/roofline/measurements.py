"""The published llama.cpp decode measurements the estimate is fitted on (data/decode_measurements.csv).

Each row is one published run, with its source: device, backend, model, file type, the mean context
of its generated tokens, the measured tok/s, the maker's nameplate bandwidth and the bytes read per
token (ondevice.roofline.spec arithmetic). Rows marked split=score are held out: the fit never sees
them, benchmarks/estimate_accuracy.py scores the shipped fit on them.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from ondevice.core.errors import EstimateDataError

__all__ = [
    "Measurement",
    "weight_family",
    "canonical_backend",
    "load_measurements",
    "fit_rows",
    "score_rows",
    "data_file",
    "LOW_BIT",
    "FAMILIES",
    "MEASUREMENTS_FILE",
]

MEASUREMENTS_FILE = "decode_measurements.csv"
FAMILIES = ("float", "q8_0", "legacy", "k-quant")  # weight families, each with its own eta
LOW_BIT = ("Q2_K", "Q3_K", "IQ1", "IQ2", "IQ3", "TQ1", "TQ2")  # 1-3 bit file or tensor types (prefixes)
_LEGACY = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"}
_BACKEND_NAMES = {
    "cuda": "CUDA",
    "metal": "Metal",
    "mtl": "Metal",
    "rocm": "ROCm",
    "hip": "ROCm",
    "vulkan": "Vulkan",
    "cpu": "CPU",
}
_COLUMNS = (
    "device",
    "backend",
    "model",
    "quant",
    "test",
    "ctx_mean",
    "tok_s",
    "nameplate_gbs",
    "bytes_per_token",
    "source",
)


@dataclass(frozen=True)
class Measurement:
    """One published llama.cpp decode measurement (a row of data/decode_measurements.csv)."""

    device: str  # GPU or chip as its driver names it
    backend: str  # "CUDA", "Metal", "ROCm", "Vulkan"
    model: str  # model name
    quant: str  # file type, e.g. "Q4_K_M"
    test: str  # llama-bench test (tg128, tg512, ...) or "main1024" (llama-cli, 1023 tokens after 494)
    ctx_mean: int  # mean context of the generated tokens, tokens (KV read counted at it)
    tok_s: float  # measured decode tokens/s
    nameplate_gbs: float  # maker's memory bandwidth, GB/s
    bytes_per_token: int  # weights + KV at ctx_mean read per token (ondevice.roofline.spec arithmetic)
    source: str  # repository + discussion/issue/PR or page
    shape: Mapping[str, str] = field(default_factory=dict)  # params, layers, kv_heads, head_dim, d_model, vocab
    split: str = (
        "fit"  # "fit": the estimate is fitted on it; "score": held out, only scored (benchmarks/estimate_accuracy.py)
    )

    @property
    def ceiling_s(self) -> float:
        """Seconds per token at the nameplate bandwidth (the bound)."""
        return self.bytes_per_token / (self.nameplate_gbs * 1e9)

    @property
    def family(self) -> str:
        return weight_family(self.quant)


def weight_family(weight_type: str) -> str:
    """The family whose kernels a file type's weights run through: float, q8_0, legacy, k-quant."""
    t = str(weight_type).strip().upper()
    if t in ("F16", "BF16", "F32"):
        return "float"
    if t == "Q8_0":
        return "q8_0"
    if t in _LEGACY:
        return "legacy"
    return "k-quant"  # K-quants, IQ types, MXFP4 and anything newer: the block-quant default


def canonical_backend(name: str | None) -> str | None:
    """'cuda' -> 'CUDA', 'hip' -> 'ROCm', ...; None for None or an unknown name."""
    if name is None:
        return None
    return _BACKEND_NAMES.get(str(name).strip().lower())


def data_file(name: str, path: Path | None) -> Path | Traversable:
    """`path` if given, else the package's own data/<name>."""
    return Path(path) if path is not None else resources.files("ondevice.roofline") / "data" / name


def load_measurements(path: Path | None = None) -> tuple[Measurement, ...]:
    """The published-measurement table (the package's own unless path is given). EstimateDataError if unusable."""
    src = data_file(MEASUREMENTS_FILE, path)
    try:
        # Traversable.open takes no newline=, which csv needs: wrap the byte stream the way open() would
        with io.TextIOWrapper(src.open("rb"), encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise EstimateDataError(f"cannot read the decode measurement table {src}: {exc}") from None
    if not rows or any(c not in rows[0] for c in _COLUMNS):
        raise EstimateDataError(f"{src}: not a decode measurement table (needs columns {', '.join(_COLUMNS)})")
    return tuple(_measurement(src, i, r) for i, r in enumerate(rows, start=2))


def _measurement(src: Path | Traversable, line: int, r: dict[str, str]) -> Measurement:
    try:
        m = Measurement(
            device=r["device"],
            backend=canonical_backend(r["backend"]) or r["backend"],
            model=r["model"],
            quant=r["quant"].strip().upper(),
            test=r["test"],
            ctx_mean=int(r["ctx_mean"]),
            tok_s=float(r["tok_s"]),
            nameplate_gbs=float(r["nameplate_gbs"]),
            bytes_per_token=int(r["bytes_per_token"]),
            source=r["source"].strip(),
            shape={k: r[k] for k in ("params", "layers", "kv_heads", "head_dim", "d_model", "vocab") if k in r},
            split=(r.get("split") or "fit").strip(),
        )
    except (TypeError, ValueError, AttributeError) as exc:
        raise EstimateDataError(f"{src} line {line}: {exc}") from None
    if m.split not in ("fit", "score"):
        raise EstimateDataError(f"{src} line {line}: split must be fit or score, not {m.split!r}")
    if (
        not (m.tok_s > 0 and m.nameplate_gbs > 0 and m.bytes_per_token > 0 and m.ctx_mean >= 0)
        or not m.source
        or not all(map(math.isfinite, (m.tok_s, m.nameplate_gbs)))
    ):
        raise EstimateDataError(
            f"{src} line {line}: tok_s, nameplate_gbs and bytes_per_token must be positive and every row needs a source"
        )
    return m


def fit_rows(rows: Sequence[Measurement]) -> tuple[Measurement, ...]:
    """The rows the estimate is fitted on."""
    return tuple(m for m in rows if m.split == "fit")


def score_rows(rows: Sequence[Measurement]) -> tuple[Measurement, ...]:
    """The held-out rows it is scored on."""
    return tuple(m for m in rows if m.split == "score")
