"""An estimate of decode speed for a machine you do not have, fitted on published llama.cpp runs.

The bound (nameplate bandwidth / bytes read per token) is not an answer: published llama.cpp
decode speeds sit at 0.4-0.9 of it. The estimate, in two lines:

    seconds per token = bytes per token / nameplate bandwidth x (1 / eta[weight family] + h [HBM card])
                        + t0[backend]

eta: the share of the bandwidth the decode kernels of a weight family reach (float, q8_0,
legacy 4/5-bit, k-quant); h: what HBM datacenter cards (nameplate >= estimate_fit.HBM_GBS) lose on top,
since one sequence's kernels reach a much smaller share of 2-5 TB/s than of a consumer card's GDDR; t0:
the backend's fixed cost per token (launches, synchronisation, sampling), which is why small models
on fast GPUs sit furthest below the bound. The range is the fit's leave-one-out range applied to the
estimate and capped at the bound. A backend the table lacks gets the pooled fit (one t0 for every
backend), with its own, wider range, and the basis says so.

The table and its loading: ondevice.roofline.measurements; the fit: ondevice.roofline.estimate_fit;
here the shipped fit (data/estimate_fit.json) is loaded and applied. Regenerate it after editing the table:
    python -c "from ondevice.roofline.estimate import *; write_fit(fit(fit_rows(load_measurements())))"
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from gguf import GGMLQuantizationType

from ondevice.core.errors import EstimateDataError, InvalidParameterError
from ondevice.gguf.spec import ModelSpec
from ondevice.roofline.estimate_fit import EstimateFit, fit, hbm_flag, loo_median_error, loo_ratios
from ondevice.roofline.measurements import (
    FAMILIES,
    LOW_BIT,
    MEASUREMENTS_FILE,
    Measurement,
    canonical_backend,
    data_file,
    fit_rows,
    load_measurements,
    score_rows,
    weight_family,
)
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

FIT_FILE = "estimate_fit.json"


@dataclass(frozen=True)
class Estimate:
    """Estimated decode speed on a machine described by its backend and nameplate bandwidth."""

    tok_s: float  # estimated decode tokens/s
    low_tok_s: float  # low end of the range (10th percentile of leave-one-out error)
    high_tok_s: float  # high end of the range (90th percentile), never above the bound
    efficiency: float  # tok_s / ceiling_tok_s
    ceiling_tok_s: float  # the bound: nameplate bandwidth / bytes per token
    basis: str  # what the estimate rests on, in a few words


def load_fit(path: Path | None = None) -> EstimateFit:
    """The shipped fit (or the one at path). EstimateDataError if missing or malformed."""
    src = data_file(FIT_FILE, path)
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
    h = (f.hbm_extra if own else f.pooled_hbm_extra) * hbm_flag(gbs)
    eta = 1.0 / (1.0 / eta + h)
    t0 = f.t0_s[name] if name is not None and own else f.pooled_t0_s
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
    eta, t0, _lo, _hi, _basis = _terms(f, cal.backend, _weight_type(spec), cal.ceiling_gbs)
    gbs = cal.ceiling_gbs * eta
    types = [t for t in spec.decode_bytes_by_type or {} if t in GGMLQuantizationType.__members__]
    return replace(cal, type_gbs={t: gbs for t in types}, kv_gbs=gbs, t0_s=t0, source="estimate")


def estimates_for(
    predictor, contexts: Sequence[int], backend: str | None, fit: EstimateFit | None = None
) -> tuple[Estimate, ...]:
    """One estimate per context for a roofline.Predictor's model at its calibration's bandwidth.

    The weight family is the file type's (else the type holding most of the bytes read per token);
    backend None or "given" (a bare bandwidth) gets the pooled fit."""
    weight_type = _weight_type(predictor.spec)
    name = None if backend in (None, "given") else backend
    f = fit if fit is not None else load_fit()
    gbs = predictor.calibration.ceiling_gbs
    return tuple(estimate(name, weight_type, predictor.step_bytes(n), gbs, f) for n in contexts)


def _weight_type(spec: ModelSpec) -> str:
    """The type whose weight family the estimate uses: the file type, else the one holding most bytes read per token."""
    by_type = spec.decode_bytes_by_type or {}
    return spec.quant or (max(by_type, key=lambda t: by_type[t]) if by_type else "")


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
    t0 = f.t0_s.get(name, f.pooled_t0_s) if name is not None else f.pooled_t0_s
    if estimates and t0 and estimates[0].tok_s > 0.6 / t0:
        out.append(
            f"{estimates[0].tok_s:.0f} tok/s is near the {1 / t0:.0f} tok/s that the fit's fixed {t0 * 1e3:.1f} ms per "
            f"token on {name or 'an unknown backend'} allows: small models are bound by it, and the fit has few of them"
        )
    return tuple(out)
