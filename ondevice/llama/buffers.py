"""llama.cpp's extra CPU buffer types, and how weights are placed in them.

A CPU build of llama.cpp can keep weights in "extra" buffer types whose matrix kernels are
faster than the plain ones: CPU_REPACK (weights re-laid out for AVX2/AVX-512/NEON kernels) and,
on Intel CPUs with AMX, AMX (tile kernels). llama.cpp picks them per tensor when
`use_extra_bufts` is on (its default). Some machines fault inside them (an AMX tile
instruction that the hypervisor does not allow), so a load can ask for one of three placements:

- "all": llama.cpp's default, every extra buffer type this build has;
- "repack": CPU_REPACK only: `use_extra_bufts` off, and each weight that CPU_REPACK can take
  placed there by name through `tensor_buft_overrides` (what llama.cpp itself would have chosen
  had AMX not been listed first);
- "none": plain CPU buffers only.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MODES", "REPACK", "AMX", "extra_buffer_types", "repack_tensors", "TensorOverrides"]

MODES = ("all", "repack", "none")
REPACK = "CPU_REPACK"  # ggml_backend_buft_name of the repack buffer type
AMX = "AMX"  # ggml_backend_buft_name of the AMX buffer type
_CPU_DEVICE = 0  # GGML_BACKEND_DEVICE_TYPE_CPU

# Weights that llama.cpp multiplies with MUL_MAT (2-D) or MUL_MAT_ID (3-D experts): the only ops
# CPU_REPACK serves. token_embd is a row gather (and, when tied, also the head): never repacked.
_MATMUL_WEIGHT = re.compile(
    r"^(?:output|blk\.\d+\.(?:attn_(?:q|k|v|qkv|output)|ffn_(?:gate|up|down)(?:_exps|_shexp)?))\.weight$"
)
# ggml's repack rule on x86 (repack.cpp, ggml_repack_get_optimal_repack_type): the weight type,
# the instruction set it needs, and rows (ne[1]) a multiple of 8. Types it does not list keep
# plain buffers; the guarded self-test checks this rule against the build before it is trusted.
_X86_REPACK = {"Q4_0": "AVX2", "Q4_K": "AVX2", "IQ4_NL": "AVX2", "MXFP4": "AVX2", "Q2_K": "AVX512"}


def _ggml() -> Any:
    import llama_cpp  # noqa: F401 - loads llama.cpp's libraries first
    from llama_cpp._ggml import libggml

    g = libggml
    g.ggml_backend_dev_by_type.restype, g.ggml_backend_dev_by_type.argtypes = ctypes.c_void_p, [ctypes.c_int]
    g.ggml_backend_dev_backend_reg.restype, g.ggml_backend_dev_backend_reg.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
    g.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    g.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    g.ggml_backend_buft_name.restype, g.ggml_backend_buft_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    return g


def extra_buffer_types() -> dict[str, int]:
    """This build's extra CPU buffer types, name -> ggml_backend_buffer_type_t (as an int), in
    llama.cpp's order of preference; {} when the build lists none or the API is missing."""
    try:
        g = _ggml()
        dev = g.ggml_backend_dev_by_type(_CPU_DEVICE)
        if not dev:
            return {}
        reg = g.ggml_backend_dev_backend_reg(dev)
        addr = g.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
        if not addr:
            return {}
        get_extra = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(addr)
        listed = get_extra(dev)
        out: dict[str, int] = {}
        for i in range(64):  # a NULL-terminated array
            buft = listed[i]
            if not buft:
                break
            out[(g.ggml_backend_buft_name(buft) or b"?").decode("utf-8", "replace")] = int(buft)
        return out
    except (ImportError, AttributeError, OSError):  # an old or unusual build: nothing extra known
        return {}


def cpu_features(system_info: str) -> set[str]:
    """Instruction-set flags that llama_print_system_info() reports as 1 ("AVX2 = 1 | ...")."""
    return {name for name, on in re.findall(r"([A-Z][A-Z0-9_]*) = (\d)", system_info) if on == "1"}


def repack_tensors(tensors: Iterable[tuple[str, str, Sequence[int]]], features: set[str]) -> list[str]:
    """Names of the weights CPU_REPACK takes, from (name, type name, GGUF shape ne0, ne1, ...)."""
    out = []
    for name, type_name, shape in tensors:
        needs = _X86_REPACK.get(type_name)
        if needs is None or needs not in features or not _MATMUL_WEIGHT.match(name):
            continue
        if len(shape) >= 2 and shape[1] % 8 == 0:
            out.append(name)
    return out


class _Override(ctypes.Structure):
    """struct llama_model_tensor_buft_override (llama.h)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass
class TensorOverrides:
    """A NULL-terminated llama_model_tensor_buft_override array placing `names` in buffer `buft`.

    One pattern per weight kind, its layers as an alternation (llama.cpp compiles every pattern
    once per tensor, so one pattern per tensor would cost tensors x patterns compilations).
    Keep this object alive until the model is loaded: llama.cpp reads the strings then.
    """

    names: list[str]
    buft: int

    def __post_init__(self) -> None:
        by_kind: dict[str, list[str]] = {}
        for name in self.names:
            m = re.match(r"^blk\.(\d+)\.(.+)$", name)
            key, layer = (m.group(2), m.group(1)) if m else (name, None)
            by_kind.setdefault(key, []).append(layer or "")
        self.patterns = [
            (f"^blk\\.({'|'.join(layers)})\\.{re.escape(kind)}$" if layers[0] else f"^{re.escape(kind)}$").encode()
            for kind, layers in by_kind.items()
        ]
        self._array = (_Override * (len(self.patterns) + 1))()
        for i, pattern in enumerate(self.patterns):
            self._array[i].pattern = pattern
            self._array[i].buft = self.buft
        self._array[len(self.patterns)].pattern = None  # terminator

    @property
    def pointer(self) -> int:
        return ctypes.addressof(self._array)
