"""Nameplate memory bandwidth of common chips: the maker's figure, never a measurement.

Every figure here is labelled "nameplate" wherever it is shown; the probe measures the
machine, and the report shows the ratio between the two. Figures are the makers' published
peak bandwidth in GB/s (1e9 bytes/s). Where one name covers binned variants with different
memory buses (M3 Max, M4 Max), the figure is the full chip's and the note says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "Nameplate",
    "lookup",
    "NAMEPLATE_GBS",
    "DeviceCompute",
    "compute_lookup",
    "NAMEPLATE_FP16_TFLOPS",
    "COMPUTE_SOURCES",
    "unified_memory",
    "default_backend",
]

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
    # NVIDIA datacenter cards (as nvidia-smi names them): HBM, beyond the consumer cards' bandwidth
    "a100 80gb pcie": (1935.0, ""),
    "a100 pcie 40gb": (1555.0, ""),
    "a100 sxm4 80gb": (2039.0, ""),
    "a100 sxm4 40gb": (1555.0, ""),
    "h100 pcie": (2000.0, ""),
    "h100 80gb hbm3": (3350.0, "the SXM card"),
    "h200": (4800.0, ""),
    "a40": (696.0, ""),
    "l40s": (864.0, ""),
    "l40": (864.0, ""),
    "l4": (300.0, ""),
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

# Normalised name -> (peak dense FP16 TFLOPS, key into COMPUTE_SOURCES). The TTFT floor on a GPU
# backend divides prefill FLOPs by this: a maker's peak that prefill never reaches, so the floor
# stays a floor. Tensor/matrix units where the device has them (llama.cpp prefills through them).
NAMEPLATE_FP16_TFLOPS: dict[str, tuple[float, str]] = {
    # Apple silicon (full GPU of each chip; FP16 runs at the FP32 rate on Apple GPUs)
    "m1": (2.6, "apple"),
    "m1 pro": (5.2, "apple"),
    "m1 max": (10.4, "apple"),
    "m1 ultra": (21.2, "apple"),
    "m2": (3.6, "apple"),
    "m2 pro": (6.8, "apple"),
    "m2 max": (13.6, "apple"),
    "m2 ultra": (27.2, "apple"),
    "m3": (3.5, "apple-derived"),
    "m3 pro": (6.4, "apple-derived"),
    "m3 max": (14.2, "apple-derived"),
    "m3 ultra": (28.4, "apple-derived"),
    "m4": (4.6, "apple-derived"),
    "m4 pro": (9.2, "apple-derived"),
    "m4 max": (18.4, "apple-derived"),
    # NVIDIA GeForce and workstation cards
    "rtx 5090": (419.0, "nvidia"),
    "rtx 5080": (225.1, "nvidia"),
    "rtx 5070 ti": (175.8, "nvidia"),
    "rtx 5070": (123.5, "nvidia"),
    "rtx 5060 ti": (94.8, "nvidia"),
    "rtx 5060": (76.7, "nvidia"),
    "rtx 4090": (330.3, "nvidia"),
    "rtx 4080 super": (208.9, "nvidia"),
    "rtx 4080": (194.9, "nvidia"),
    "rtx 4070 ti super": (176.4, "nvidia"),
    "rtx 4070 ti": (160.4, "nvidia"),
    "rtx 4070 super": (141.9, "nvidia"),
    "rtx 4070": (116.6, "nvidia"),
    "rtx 4060 ti": (88.3, "nvidia"),
    "rtx 4060": (60.5, "nvidia"),
    "rtx 3090 ti": (160.0, "nvidia"),
    "rtx 3090": (142.3, "nvidia"),
    "rtx 3080 ti": (136.4, "nvidia"),
    "rtx 3080": (119.1, "nvidia"),
    "a100 80gb pcie": (312.0, "nvidia-dc"),
    "a100 pcie 40gb": (312.0, "nvidia-dc"),
    "a100 sxm4 80gb": (312.0, "nvidia-dc"),
    "a100 sxm4 40gb": (312.0, "nvidia-dc"),
    "h100 pcie": (756.0, "nvidia-dc"),
    "h100 80gb hbm3": (989.0, "nvidia-dc"),
    "h200": (989.0, "nvidia-dc"),
    "a40": (149.7, "nvidia-dc"),
    "l40s": (366.0, "nvidia-dc"),
    "l40": (181.0, "nvidia-dc"),
    "l4": (121.0, "nvidia-dc"),
    "rtx 3070 ti": (87.0, "nvidia"),
    "rtx 3070": (81.3, "nvidia"),
    "rtx 3060 ti": (64.8, "nvidia"),
    "rtx 3060": (51.2, "nvidia"),
    "rtx 2080 ti": (107.6, "nvidia-turing"),
    "rtx 6000 ada generation": (364.4, "nvidia"),
    "rtx 5000 ada generation": (261.0, "nvidia"),
    "rtx 4000 ada generation": (106.8, "nvidia"),
    "rtx a6000": (154.8, "nvidia"),
    # AMD Radeon and the Strix Halo APU
    "rx 9070 xt": (194.7, "amd"),
    "rx 9070": (144.5, "amd"),
    "rx 7900 xtx": (122.8, "amd"),
    "rx 7900 xt": (103.0, "amd"),
    "rx 7900 gre": (92.0, "amd"),
    "rx 7800 xt": (74.6, "amd"),
    "rx 7700 xt": (70.3, "amd"),
    "rx 7600": (43.5, "amd"),
    "rx 6950 xt": (47.3, "amd"),
    "rx 6900 xt": (46.1, "amd"),
    "rx 6800 xt": (41.5, "amd"),
    "rx 6800": (32.3, "amd"),
    "rx 6700 xt": (26.4, "amd"),
    "rx 5700 xt": (19.5, "amd"),
    "8060s": (59.4, "amd-derived"),
}
COMPUTE_SOURCES = {
    "apple": "Apple's launch figures (newsroom), GPU TFLOPS of the full chip",
    "apple-derived": "derived: GPU cores x 128 ALUs x 2 FLOP x peak clock (Apple publishes no figure)",
    "nvidia": "NVIDIA architecture whitepapers (Ampere GA102, Ada, Blackwell): dense FP16 tensor TFLOPS with "
    "FP16 accumulate, no sparsity (4x the card's FP32 boost TFLOPS)",
    "nvidia-dc": "NVIDIA datasheets (A100, H100, H200, A40, L40/L40S, L4): dense FP16 tensor TFLOPS, no sparsity",
    "nvidia-turing": "NVIDIA Turing whitepaper: dense FP16 tensor TFLOPS with FP16 accumulate (reference card)",
    "amd": "AMD product pages: peak half-precision (FP16) TFLOPS, dense (matrix units on RDNA 4)",
    "amd-derived": "derived: 40 CUs x 2.9 GHz x 512 FP16 FLOP per CU per clock (AMD Radeon 8060S)",
}

_NVIDIA_KEYS = ("rtx", "a100", "h100", "h200", "a40", "l40", "l4")  # normalised names of NVIDIA cards
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


@dataclass(frozen=True)
class DeviceCompute:
    """A maker's peak FP16 figure for a named GPU or chip."""

    chip: str  # the normalised name that matched
    fp16_tflops: float  # peak dense FP16 TFLOPS (tensor/matrix units where the device has them)
    source: str  # where the figure comes from (COMPUTE_SOURCES)


def compute_lookup(name: str | None) -> DeviceCompute | None:
    """The peak FP16 figure for a chip or card name as the OS or driver prints it; None if unknown."""
    if not name:
        return None
    key = _normalise(name)
    hit = NAMEPLATE_FP16_TFLOPS.get(key)
    return DeviceCompute(chip=key, fp16_tflops=hit[0], source=COMPUTE_SOURCES[hit[1]]) if hit else None


def _known_key(name: str | None) -> str | None:
    key = _normalise(name) if name else ""
    return key if key in NAMEPLATE_GBS or key in NAMEPLATE_FP16_TFLOPS else None


def unified_memory(name: str | None) -> bool | None:
    """True for a chip whose GPU uses system memory (Apple silicon, Strix Halo), False for a known
    card with its own VRAM, None for a name the tables do not know."""
    key = _known_key(name)
    if key is None:
        return None
    return bool(re.fullmatch(r"m\d+( pro| max| ultra)?", key)) or key == "8060s"


def default_backend(name: str | None) -> str | None:
    """The llama.cpp backend a known chip is usually run with: Metal (Apple), CUDA (NVIDIA), ROCm (AMD)."""
    key = _known_key(name)
    if key is None:
        return None
    if re.fullmatch(r"m\d+( pro| max| ultra)?", key):
        return "Metal"
    return "CUDA" if key.startswith(_NVIDIA_KEYS) else "ROCm"
