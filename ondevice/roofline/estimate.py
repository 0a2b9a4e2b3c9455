"""An estimate of decode speed for a machine you do not have, fitted on published llama.cpp runs.

The bound (nameplate bandwidth / bytes read per token) is not an answer: published llama.cpp
decode speeds sit at 0.4-0.9 of it. The estimate, in two lines:

    seconds per token = bytes per token / nameplate bandwidth x (1 / eta[weight family] + h [HBM card])
                        + t0[backend]

eta: the share of the bandwidth the decode kernels of a weight family reach (float, q8_0,
legacy 4/5-bit, k-quant); h: what HBM datacenter cards (nameplate >= HBM_GBS) lose on top, since
one sequence's kernels reach a much smaller share of 2-5 TB/s than of a consumer card's GDDR; t0:
the backend's fixed cost per token (launches, synchronisation, sampling), which is why small models
on fast GPUs sit furthest below the bound. Fitted by least
squares on relative error (numpy) over data/decode_measurements.csv (each row with its source);
the coefficients ship as data/estimate_fit.json and fit() reproduces them from the table. The
range is the 10th..90th percentile of the leave-one-out ratios measured / estimated, applied to
the estimate and capped at the bound. A backend the table lacks gets the pooled fit (one t0 for
every backend), with its own, wider range, and the basis says so.

Rows marked split=score are held out: the fit never sees them, benchmarks/estimate_accuracy.py scores
the shipped fit on them. Regenerate the shipped fit after editing the table:
    python -c "from ondevice.roofline.estimate import *; write_fit(fit(fit_rows(load_measurements())))"
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from pathlib import Path

from gguf import GGMLQuantizationType

from ondevice.core.errors import EstimateDataError, InvalidParameterError
from ondevice.gguf.spec import ModelSpec
from ondevice.roofline.model import Calibration

__all__ = [
    "Measurement",
    "EstimateFit",
    "Estimate",
    "weight_family",
    "canonical_backend",
    "load_measurements",
    "fit_rows",
    "score_rows",
    "estimated_calibration",
    "fit",
    "loo_ratios",
    "loo_median_error",
    "load_fit",
    "write_fit",
    "estimate",
    "estimates_for",
    "caveats",
    "LOW_BIT",
    "FAMILIES",
    "MEASUREMENTS_FILE",
    "FIT_FILE",
]

MEASUREMENTS_FILE = "decode_measurements.csv"
FIT_FILE = "estimate_fit.json"
FIT_SCHEMA = 2
HBM_GBS = 1900.0  # nameplate bandwidth from which a device is an HBM datacenter card (A100 80GB, H100, H200, MI300)
FAMILIES = ("float", "q8_0", "legacy", "k-quant")  # weight families, each with its own eta
RANGE_PERCENTILES = (10.0, 90.0)  # of the leave-one-out ratios measured / estimated
_BACKEND_NAMES = {
    "cuda": "CUDA",
    "metal": "Metal",
    "mtl": "Metal",
    "rocm": "ROCm",
    "hip": "ROCm",
    "vulkan": "Vulkan",
    "cpu": "CPU",
}
LOW_BIT = ("Q2_K", "Q3_K", "IQ1", "IQ2", "IQ3", "TQ1", "TQ2")  # 1-3 bit file or tensor types (prefixes)
_LEGACY = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL"}
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


@dataclass(frozen=True)
class EstimateFit:
    """The fitted coefficients (data/estimate_fit.json)."""

    eta: Mapping[str, float]  # weight family -> share of the bandwidth reached, per-backend fit
    t0_s: Mapping[str, float]  # backend -> fixed seconds per token
    pooled_eta: Mapping[str, float]  # weight family -> share, pooled fit (one t0 for all backends)
    pooled_t0_s: float  # fixed seconds per token, pooled fit
    ratio_low: float  # 10th percentile of leave-one-out measured/estimated, per-backend fit
    ratio_high: float  # 90th percentile, per-backend fit
    pooled_ratio_low: float  # same for the pooled fit
    pooled_ratio_high: float
    loo_median_abs_error: float  # median |measured/estimated - 1| leaving each row out, per-backend fit
    pooled_loo_median_abs_error: float  # same for the pooled fit
    n_rows: int  # rows fitted on
    hbm_extra: float = 0.0  # h: seconds per second of the bound an HBM card adds, per-backend fit
    pooled_hbm_extra: float = 0.0  # same, pooled fit

    def to_dict(self) -> dict:
        return {
            "schema": FIT_SCHEMA,
            "model": "seconds per token = bytes_per_token / (nameplate_gbs * 1e9) * (1 / eta[family] + hbm_extra "
            "* [nameplate_gbs >= 1900]) + t0_s[backend]",
            "fitted_on": MEASUREMENTS_FILE,
            **asdict(self),
        }

    @classmethod
    def from_dict(cls, d: dict) -> EstimateFit:
        if not isinstance(d, dict) or d.get("schema") != FIT_SCHEMA:
            raise ValueError(f"schema {d.get('schema') if isinstance(d, dict) else d!r} is not {FIT_SCHEMA}")
        out = cls(**{k: d[k] for k in cls.__dataclass_fields__})
        numbers = [
            *out.eta.values(),
            *out.t0_s.values(),
            *out.pooled_eta.values(),
            out.pooled_t0_s,
            out.ratio_low,
            out.ratio_high,
            out.pooled_ratio_low,
            out.pooled_ratio_high,
            out.hbm_extra,
            out.pooled_hbm_extra,
        ]
        if set(out.eta) != set(FAMILIES) or set(out.pooled_eta) != set(FAMILIES) or not out.t0_s:
            raise ValueError(f"eta must cover {', '.join(FAMILIES)} and t0_s at least one backend")
        if not all(isinstance(x, (int, float)) and math.isfinite(x) and x >= 0 for x in numbers):
            raise ValueError("coefficients must be finite non-negative numbers")
        if not all(x > 0 for x in [*out.eta.values(), *out.pooled_eta.values()]):
            raise ValueError("eta must be positive")
        return out


@dataclass(frozen=True)
class Estimate:
    """Estimated decode speed on a machine described by its backend and nameplate bandwidth."""

    tok_s: float  # estimated decode tokens/s
    low_tok_s: float  # low end of the range (10th percentile of leave-one-out error)
    high_tok_s: float  # high end of the range (90th percentile), never above the bound
    efficiency: float  # tok_s / ceiling_tok_s
    ceiling_tok_s: float  # the bound: nameplate bandwidth / bytes per token
    basis: str  # what the estimate rests on, in a few words


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


def _data(name: str, path: Path | None):
    return Path(path) if path is not None else resources.files("ondevice.roofline") / "data" / name


def load_measurements(path: Path | None = None) -> tuple[Measurement, ...]:
    """The published-measurement table (the package's own unless path is given). EstimateDataError if unusable."""
    src = _data(MEASUREMENTS_FILE, path)
    try:
        with src.open(newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise EstimateDataError(f"cannot read the decode measurement table {src}: {exc}") from None
    if not rows or any(c not in rows[0] for c in _COLUMNS):
        raise EstimateDataError(f"{src}: not a decode measurement table (needs columns {', '.join(_COLUMNS)})")
    return tuple(_measurement(src, i, r) for i, r in enumerate(rows, start=2))


def _measurement(src, line: int, r: dict) -> Measurement:
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


def _hbm(gbs: float) -> float:
    return 1.0 if gbs >= HBM_GBS else 0.0


def _solve(rows: Sequence[Measurement], pooled: bool):
    """Least squares on relative error: (eta by family, t0 by backend or one pooled t0, h for HBM cards)."""
    import numpy as np

    backends = ["*"] if pooled else sorted({m.backend for m in rows})
    families = [f for f in FAMILIES if any(m.family == f for m in rows)]
    hbm = any(_hbm(m.nameplate_gbs) for m in rows)
    x = np.array(
        [
            [m.ceiling_s if m.family == f else 0.0 for f in families]
            + ([m.ceiling_s * _hbm(m.nameplate_gbs)] if hbm else [])
            + [1.0 if pooled or m.backend == b else 0.0 for b in backends]
            for m in rows
        ]
    )
    t = np.array([1.0 / m.tok_s for m in rows])
    beta = np.linalg.lstsq(x / t[:, None], np.ones(len(rows)), rcond=None)[0]
    inv_eta, h, t0 = beta[: len(families)], (beta[len(families)] if hbm else 0.0), beta[len(families) + hbm :]
    if not (np.all(inv_eta > 0) and np.all(np.isfinite(beta))):
        raise EstimateDataError("the decode measurements give a non-physical fit (an efficiency at or below zero)")
    eta = {f: float(1.0 / v) for f, v in zip(families, inv_eta)}
    return eta, {b: float(max(v, 0.0)) for b, v in zip(backends, t0)}, float(max(h, 0.0))


def _predict_s(m: Measurement, eta: Mapping[str, float], t0: float, h: float = 0.0) -> float:
    return m.ceiling_s * (1.0 / eta[m.family] + h * _hbm(m.nameplate_gbs)) + t0


def loo_ratios(rows: Sequence[Measurement], pooled: bool = False):
    """Measured / estimated tok/s for each row, the estimate fitted without that row (numpy array).

    A row whose backend has no other row gets the pooled fit, as the estimate for such a backend does."""
    import numpy as np

    out = []
    for k, m in enumerate(rows):
        rest = [r for i, r in enumerate(rows) if i != k]
        use_pooled = pooled or not any(r.backend == m.backend for r in rest)
        eta, t0, h = _solve(rest, use_pooled)
        out.append(m.tok_s * _predict_s(m, eta, t0["*"] if use_pooled else t0[m.backend], h))
    return np.array(out)


def loo_median_error(rows: Sequence[Measurement], pooled: bool = False) -> float:
    """Median |measured / estimated - 1| over the rows, each estimated by a fit that left it out."""
    import numpy as np

    return float(np.median(np.abs(loo_ratios(rows, pooled) - 1.0)))


def fit(rows: Sequence[Measurement]) -> EstimateFit:
    """Fit the estimate (per-backend and pooled) and its leave-one-out range on the measurements."""
    import numpy as np

    missing = [f for f in FAMILIES if not any(m.family == f for m in rows)]
    if missing:
        raise EstimateDataError(f"the decode measurements have no rows of weight family {', '.join(missing)}")
    eta, t0, h = _solve(rows, pooled=False)
    pooled_eta, pooled_t0, pooled_h = _solve(rows, pooled=True)
    ratios, pooled_ratios = loo_ratios(rows), loo_ratios(rows, pooled=True)
    lo, hi = (float(v) for v in np.percentile(ratios, RANGE_PERCENTILES))
    plo, phi = (float(v) for v in np.percentile(pooled_ratios, RANGE_PERCENTILES))
    return EstimateFit(
        eta=eta,
        t0_s=t0,
        pooled_eta=pooled_eta,
        pooled_t0_s=pooled_t0["*"],
        ratio_low=lo,
        ratio_high=hi,
        pooled_ratio_low=plo,
        pooled_ratio_high=phi,
        loo_median_abs_error=float(np.median(np.abs(ratios - 1.0))),
        pooled_loo_median_abs_error=float(np.median(np.abs(pooled_ratios - 1.0))),
        n_rows=len(rows),
        hbm_extra=h,
        pooled_hbm_extra=pooled_h,
    )


def load_fit(path: Path | None = None) -> EstimateFit:
    """The shipped fit (or the one at path). EstimateDataError if missing or malformed."""
    src = _data(FIT_FILE, path)
    try:
        return EstimateFit.from_dict(json.loads(src.read_text(encoding="utf-8")))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EstimateDataError(f"cannot read the estimate fit {src}: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EstimateDataError(f"{src}: not an estimate fit ({exc})") from None


def write_fit(f: EstimateFit, path: Path | None = None) -> Path:
    """Write a fit as JSON (default: the package's data/estimate_fit.json in this checkout)."""
    dest = Path(path) if path is not None else Path(__file__).parent / "data" / FIT_FILE
    dest.write_text(json.dumps(f.to_dict(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return dest


def estimate(
    backend: str | None, weight_type: str, bytes_per_token: float, bandwidth_gbs: float, fit: EstimateFit | None = None
) -> Estimate:
    """Estimated decode tok/s for bytes_per_token read per token at a nameplate bandwidth (GB/s) on a backend.

    A backend the fit has no rows for (or None) gets the pooled fit and its wider range; the basis says so."""
    from ondevice.roofline.spec import positive_number

    nbytes = positive_number("bytes per token", bytes_per_token, InvalidParameterError)
    gbs = positive_number("bandwidth", bandwidth_gbs, InvalidParameterError, unit="GB/s")
    f = fit if fit is not None else load_fit()
    eta, t0, lo, hi, basis = _terms(f, backend, weight_type, gbs)
    ceiling_s = nbytes / (gbs * 1e9)
    tok_s = min(1.0 / (ceiling_s / eta + t0), 1.0 / ceiling_s)
    ceiling = 1.0 / ceiling_s
    return Estimate(
        tok_s=tok_s,
        low_tok_s=min(tok_s * lo, ceiling),
        high_tok_s=min(tok_s * hi, ceiling),
        efficiency=tok_s / ceiling,
        ceiling_tok_s=ceiling,
        basis=basis,
    )


def _terms(
    f: EstimateFit, backend: str | None, weight_type: str, gbs: float = 0.0
) -> tuple[float, float, float, float, str]:
    """(eta, t0_s, range low, range high, basis) of the fit for a backend, a weight type and a bandwidth
    (an HBM card's eta has its extra loss folded in)."""
    family = weight_family(weight_type)
    name = canonical_backend(backend) or (str(backend) if backend else None)
    own = name in f.t0_s
    eta = f.eta[family] if own else f.pooled_eta[family]
    h = (f.hbm_extra if own else f.pooled_hbm_extra) * _hbm(gbs)
    eta = 1.0 / (1.0 / eta + h)
    t0 = f.t0_s[name] if own else f.pooled_t0_s
    reach = f"{family} weights reach {eta:.0%} of the bandwidth" + (" (an HBM card)" if h else "")
    if own:
        basis = f"{name} fit on {f.n_rows} published llama.cpp runs: {reach}, plus {t0 * 1e3:.1f} ms per token"
        return eta, t0, f.ratio_low, f.ratio_high, basis
    why = f"no published {name} runs" if name else "backend not given"
    basis = (
        f"{why}: pooled fit over {', '.join(sorted(f.t0_s))} ({f.n_rows} runs): {reach}, plus {t0 * 1e3:.1f} ms "
        "per token"
    )
    return eta, t0, f.pooled_ratio_low, f.pooled_ratio_high, basis


def estimated_calibration(cal: Calibration, spec: ModelSpec, fit: EstimateFit | None = None) -> Calibration:
    """A calibration whose decode step is the estimate's (bytes / (bandwidth x eta) + t0) for this
    model, on a machine with only its bandwidth measured (the host probe): source "estimate". The
    prefill terms (compute) stay as they were."""
    f = fit if fit is not None else load_fit()
    by_type = spec.decode_bytes_by_type or {}
    weight_type = spec.quant or (max(by_type, key=by_type.get) if by_type else "")
    eta, t0, _lo, _hi, _basis = _terms(f, cal.backend, weight_type, cal.ceiling_gbs)
    gbs = cal.ceiling_gbs * eta
    types = [t for t in by_type if t in GGMLQuantizationType.__members__]
    return replace(cal, type_gbs={t: gbs for t in types}, kv_gbs=gbs, t0_s=t0, source="estimate")


def estimates_for(
    predictor, contexts: Sequence[int], backend: str | None, fit: EstimateFit | None = None
) -> tuple[Estimate, ...]:
    """One estimate per context for a roofline.Predictor's model at its calibration's bandwidth.

    The weight family is the file type's (else the type holding most of the bytes read per token);
    backend None or "given" (a bare bandwidth) gets the pooled fit."""
    spec = predictor.spec
    by_type = spec.decode_bytes_by_type or {}
    weight_type = spec.quant or (max(by_type, key=by_type.get) if by_type else "")
    name = None if backend in (None, "given") else backend
    f = fit if fit is not None else load_fit()
    gbs = predictor.calibration.ceiling_gbs
    return tuple(estimate(name, weight_type, predictor.step_bytes(n), gbs, f) for n in contexts)


def caveats(spec: ModelSpec, contexts: Sequence[int], backend: str | None, gbs: float, estimates=()) -> tuple[str, ...]:
    """Where the estimate for this model and machine reaches past what its fit rests on, one line each.

    Read off the fit's own rows (load_measurements' split=fit): no MoE model, 1-3 bit weights in few
    runs, contexts of at most the longest run, bandwidths within the fastest and slowest device; and the
    backend's fixed cost per token, which bounds small models' speed whatever their size."""
    rows = fit_rows(load_measurements())
    f = load_fit()
    out = []
    if spec.n_expert:
        out.append(
            f"MoE ({spec.n_expert_used} of {spec.n_expert} experts a token): the estimate counts the experts a token "
            "uses but no routing or expert-gathering cost, and no MoE run is in the fit: expect it slower, and the "
            "range does not hold"
        )
    quant = (spec.quant or "").upper()
    if quant.startswith(LOW_BIT):
        n = sum(m.quant.upper().startswith(LOW_BIT) for m in rows)
        out.append(
            f"{quant}: {n} of the fit's {len(rows)} runs have 1-3 bit weights; their kernels unpack more per byte "
            "than the 4-6 bit k-quants the k-quant efficiency comes from: expect it slower, and the range does not hold"
        )
    longest = max(m.ctx_mean for m in rows)
    if contexts and max(contexts) > 2 * longest:
        out.append(
            f"contexts past {2 * longest} tokens: the fit's runs decode at {longest} tokens of context or less; the "
            "estimate counts the KV cache's bytes but not attention's compute, which grows with the context: expect "
            "long contexts slower"
        )
    lo, hi = min(m.nameplate_gbs for m in rows), max(m.nameplate_gbs for m in rows)
    if gbs > hi or gbs < lo:
        out.append(f"{gbs:g} GB/s is outside the fit's devices ({lo:g}-{hi:g} GB/s): extrapolated")
    name = canonical_backend(backend) or backend
    t0 = f.t0_s.get(name, f.pooled_t0_s)
    if estimates and t0 and estimates[0].tok_s > 0.6 / t0:
        out.append(
            f"{estimates[0].tok_s:.0f} tok/s is near the {1 / t0:.0f} tok/s that the fit's fixed {t0 * 1e3:.1f} ms per "
            f"token on {name or 'an unknown backend'} allows: small models are bound by it, and the fit has few of them"
        )
    return tuple(out)
