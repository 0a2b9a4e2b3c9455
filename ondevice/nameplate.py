"""Nameplate memory bandwidth of common chips: the maker's figure, never a measurement.

Every figure here is labelled "nameplate" wherever it is shown; the probe measures the
machine, and the report shows the ratio between the two. Figures are the makers' published
peak bandwidth in GB/s (1e9 bytes/s). Where one name covers binned variants with different
memory buses (M3 Max, M4 Max), the figure is the full chip's and the note says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Nameplate", "lookup", "NAMEPLATE_GBS"]

SOURCE = "nameplate"

# Normalised name (see _normalise) -> (GB/s, note). Apple: unified memory; GPUs: VRAM.
NAMEPLATE_GBS: dict[str, tuple[float, str]] = {
    # Apple silicon
    "m1": (68.25, ""),
    "m1 pro": (200.0, ""),
    "m1 max": (400.0, ""),
    "m1 ultra": (800.0, ""),
    "m2": (100.0, ""),
    "m2 pro": (200.0, ""),
    "m2 max": (400.0, ""),
    "m2 ultra": (800.0, ""),
    "m3": (100.0, ""),
    "m3 pro": (150.0, ""),
    "m3 max": (400.0, "300 GB/s on the 30-core-GPU variant"),
    "m3 ultra": (819.0, ""),
    "m4": (120.0, ""),
    "m4 pro": (273.0, ""),
    "m4 max": (546.0, "410 GB/s on the 32-core-GPU variant"),
    "m5": (153.0, ""),
    "m5 pro": (307.0, ""),
    "m5 max": (614.0, "460 GB/s on the 32-core-GPU variant"),
    # NVIDIA GeForce (desktop cards)
    "rtx 5090": (1792.0, ""),
    "rtx 5080": (960.0, ""),
    "rtx 5070 ti": (896.0, ""),
    "rtx 5070": (672.0, ""),
    "rtx 5060 ti": (448.0, ""),
    "rtx 5060": (448.0, ""),
    "rtx 4090": (1008.0, ""),
    "rtx 4080 super": (736.0, ""),
    "rtx 4080": (716.8, ""),
    "rtx 4070 ti super": (672.0, ""),
    "rtx 4070 ti": (504.0, ""),
    "rtx 4070 super": (504.0, ""),
    "rtx 4070": (504.0, ""),
    "rtx 4060 ti": (288.0, ""),
    "rtx 4060": (272.0, ""),
    "rtx 3090 ti": (1008.0, ""),
    "rtx 3090": (936.2, ""),
    "rtx 3080 ti": (912.4, ""),
    "rtx 3080": (760.3, "912 GB/s on the 12 GB model"),
    "rtx 3070 ti": (608.3, ""),
    "rtx 3070": (448.0, ""),
    "rtx 3060 ti": (448.0, ""),
    "rtx 3060": (360.0, "12 GB model"),
    "rtx 2080 ti": (616.0, ""),
    "rtx 2080 super": (496.0, ""),
    "rtx 2080": (448.0, ""),
    "rtx 2070": (448.0, ""),
    "rtx 2060": (336.0, ""),
    # NVIDIA workstation cards (as the driver names them)
    "rtx 6000 ada generation": (960.0, ""),
    "rtx 5000 ada generation": (576.0, ""),
    "rtx 4000 ada generation": (360.0, ""),
    "rtx a6000": (768.0, ""),
    # AMD Radeon (desktop cards) and the Strix Halo APU
    "rx 9070 xt": (644.6, ""),
    "rx 9070": (644.6, ""),
    "rx 7900 xtx": (960.0, ""),
    "rx 7900 xt": (800.0, ""),
    "rx 7900 gre": (576.0, ""),
    "rx 7800 xt": (624.0, ""),
    "rx 7700 xt": (432.0, ""),
    "rx 7600": (288.0, ""),
    "rx 6950 xt": (576.0, ""),
    "rx 6900 xt": (512.0, ""),
    "rx 6800 xt": (512.0, ""),
    "rx 6800": (512.0, ""),
    "rx 6700 xt": (384.0, ""),
    "rx 5700 xt": (448.0, ""),
    "8060s": (256.0, "Ryzen AI Max (Strix Halo) unified LPDDR5X-8000"),
}

_VENDOR_WORDS = {"nvidia", "geforce", "amd", "radeon", "apple", "graphics", "gpu", "(tm)", "(r)"}


@dataclass(frozen=True)
class Nameplate:
    """A maker's published bandwidth for a named chip."""

    chip: str  # the normalised name that matched
    bandwidth_gbs: float  # published peak memory bandwidth, GB/s
    note: str  # caveat (binned variants), "" when none
    source: str = SOURCE  # always "nameplate": not a measurement

    def to_dict(self) -> dict:
        return {"chip": self.chip, "bandwidth_gbs": self.bandwidth_gbs, "note": self.note, "source": self.source}


def _normalise(name: str) -> str:
    words = re.sub(r"[^a-z0-9() ]+", " ", name.lower()).split()
    return " ".join(w for w in words if w not in _VENDOR_WORDS)


def lookup(name: str | None) -> Nameplate | None:
    """The nameplate for a chip or card name as the OS or driver prints it; None if unknown.

    The whole name must match (vendor words aside): "RTX 4090 Laptop GPU" is not an RTX 4090,
    and an ambiguous name ("Radeon RX 6800/6800 XT") matches nothing.
    """
    if not name:
        return None
    key = _normalise(name)
    hit = NAMEPLATE_GBS.get(key)
    if hit is None:
        return None
    return Nameplate(chip=key, bandwidth_gbs=hit[0], note=hit[1])
