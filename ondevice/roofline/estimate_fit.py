"""The estimate's coefficients, fitted on the published measurements (ondevice.roofline.measurements).

    seconds per token = bytes per token / nameplate bandwidth x (1 / eta[weight family] + h [HBM card])
                        + t0[backend]

Fitted by least squares on relative error (numpy), once with a t0 per backend and once pooled (one t0
for every backend, for a backend the table lacks). The range is the 10th..90th percentile of the
leave-one-out ratios measured / estimated. The coefficients ship as data/estimate_fit.json
(ondevice.roofline.estimate loads and writes it); fit() reproduces them from the table.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ondevice.core.errors import EstimateDataError
from ondevice.roofline.measurements import FAMILIES, MEASUREMENTS_FILE, Measurement

__all__ = ["EstimateFit", "fit", "loo_ratios", "loo_median_error", "hbm_flag", "HBM_GBS", "FIT_SCHEMA"]

FIT_SCHEMA = 2
HBM_GBS = 1900.0  # nameplate bandwidth from which a device is an HBM datacenter card (A100 80GB, H100, H200, MI300)
RANGE_PERCENTILES = (10.0, 90.0)  # of the leave-one-out ratios measured / estimated


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": FIT_SCHEMA,
            "model": "seconds per token = bytes_per_token / (nameplate_gbs * 1e9) * (1 / eta[family] + hbm_extra "
            "* [nameplate_gbs >= 1900]) + t0_s[backend]",
            "fitted_on": MEASUREMENTS_FILE,
            **asdict(self),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EstimateFit:
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


def hbm_flag(gbs: float) -> float:
    """1.0 for an HBM datacenter card's nameplate bandwidth (GB/s), else 0.0: the switch on the h term."""
    return 1.0 if gbs >= HBM_GBS else 0.0


def _solve(rows: Sequence[Measurement], pooled: bool) -> tuple[dict[str, float], dict[str, float], float]:
    """Least squares on relative error: (eta by family, t0 by backend or one pooled t0 under "*", h for HBM cards)."""
    import numpy as np

    backends = ["*"] if pooled else sorted({m.backend for m in rows})
    families = [f for f in FAMILIES if any(m.family == f for m in rows)]
    hbm = any(hbm_flag(m.nameplate_gbs) for m in rows)
    x = np.array(
        [
            [m.ceiling_s if m.family == f else 0.0 for f in families]
            + ([m.ceiling_s * hbm_flag(m.nameplate_gbs)] if hbm else [])
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
    return m.ceiling_s * (1.0 / eta[m.family] + h * hbm_flag(m.nameplate_gbs)) + t0


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
