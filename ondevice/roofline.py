"""The roofline: from a ModelSpec and a machine's bandwidth, how fast decoding can go.

DESIGN.md section 5. A decode step at context s reads the weights used for one token plus
the KV cache of s tokens (sliding-window layers capped). The pure ceiling divides those
bytes by the machine's best measured read bandwidth; the calibrated prediction adds what
the runtime's own kernels reach per weight type (kernel probe) and a fixed cost t0:

    t(s) = sum_type bytes_type / bw_type + kv_bytes(s) / bw_kv + t0
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ondevice.modelspec import ModelSpec

__all__ = ["Calibration", "Predictor", "default_predictor"]

_GB = 1e9


@dataclass(frozen=True)
class Calibration:
    """What a kernel probe measured: effective bandwidths the runtime reaches, and t0."""

    backend: str  # "CPU", "Metal", "CUDA", ...
    ceiling_gbs: float  # best read bandwidth measured on this machine, GB/s (the pure bound)
    type_gbs: Mapping[str, float] = field(default_factory=dict)  # weight type -> effective GB/s in decode
    kv_gbs: float | None = None  # effective GB/s reading the KV cache (None: use ceiling_gbs)
    t0_s: float = 0.0  # fixed per-token cost, seconds (launches, sampling, Python)


class Predictor:
    """Step-time model of one model on one machine; step_s() is pure arithmetic (cheap per token)."""

    def __init__(self, spec: ModelSpec, calibration: Calibration):
        if calibration.ceiling_gbs <= 0:
            raise ValueError("ceiling bandwidth must be positive")
        self.spec = spec
        self.calibration = calibration
        ceiling_bps = calibration.ceiling_gbs * _GB
        kv_bps = (calibration.kv_gbs or calibration.ceiling_gbs) * _GB
        self._ceiling_bps = ceiling_bps
        self._kv_bps = kv_bps
        self._weight_ceiling_s = spec.decode_weight_bytes / ceiling_bps
        self._weight_calibrated_s = sum(
            b / (effective_gbs(t, calibration) * _GB) for t, b in spec.decode_bytes_by_type.items()
        )
        swa = set(spec.swa_layers) if spec.sliding_window else set()
        per_layer = spec.kv_bytes_per_token_by_layer
        self._kv_full = sum(b for i, b in enumerate(per_layer) if i not in swa)  # bytes per context token
        self._kv_window = sum(b for i, b in enumerate(per_layer) if i in swa)  # bytes per token, capped
        self._window = spec.sliding_window or 0

    def kv_read_bytes(self, n_ctx: int) -> int:
        """Same figure as ModelSpec.kv_read_bytes, from precomputed sums."""
        span = min(n_ctx, self._window) if self._window else n_ctx
        return self._kv_full * n_ctx + self._kv_window * span

    def step_bytes(self, n_ctx: int) -> int:
        return self.spec.decode_weight_bytes + self.kv_read_bytes(n_ctx)

    def step_s(self, n_ctx: int) -> tuple[float, float]:
        """(ceiling_step_s, calibrated_step_s) for one decode step at a context of n_ctx tokens."""
        kv = self.kv_read_bytes(max(0, int(n_ctx)))
        ceiling = self._weight_ceiling_s + kv / self._ceiling_bps
        calibrated = self._weight_calibrated_s + kv / self._kv_bps + self.calibration.t0_s
        return ceiling, max(calibrated, ceiling)


def effective_gbs(weight_type: str, cal: Calibration) -> float:
    """Effective bandwidth for a weight type; unprobed types borrow the closest probed one."""
    if weight_type in cal.type_gbs:
        return cal.type_gbs[weight_type]
    if not cal.type_gbs:
        return cal.ceiling_gbs
    return min(cal.type_gbs.values())


def default_predictor(spec: ModelSpec, backend: str) -> Predictor | None:
    """A Predictor from this machine's CACHED probe for `backend`; None when none is cached.

    Never runs a probe (that takes up to a minute): `ondevice probe` does.
    """
    if not spec.decode_weight_bytes:
        return None
    try:
        from ondevice.probing.cache import load_cached
    except ImportError:
        return None
    result = load_cached(backend=backend)
    if result is None:
        return None
    cal = result.calibration()
    return Predictor(spec, cal) if cal is not None else None
