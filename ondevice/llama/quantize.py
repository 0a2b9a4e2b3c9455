"""llama.cpp's quantizer: one call, llama_model_quantize (ondevice.quant.quantize does the checks,
the temporary file, the progress and the errors around it), and its dry run, which says what type
each tensor would get without reading or writing any tensor data."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

__all__ = ["supports_file_type", "quantize_file", "tensor_types", "parse_tensor_types"]

# One line per tensor: "[  1/ 75] output.weight - [ 256, 1000, 1, 1], type = f16, size = 0.49 MiB -> 0.20 MiB (q6_K)";
# a tensor kept as it is has no arrow. Fallback warnings ("... -> falling back to q5_0") carry no sizes.
_TENSOR = re.compile(r"\[\s*\d+\s*/\s*\d+\s*\]\s+(\S+)\s+-\s+\[[^\]]*\],\s*type\s*=\s*(\w+),")
_TARGET = re.compile(r"MiB\s*->\s*[\d.]+\s*MiB\s*\((\w+)\)")


def supports_file_type(name: str, value: int) -> bool:
    """This llama.cpp build knows file type `name` (e.g. "MOSTLY_Q4_K_M") with the number gguf gives it."""
    import llama_cpp

    return getattr(llama_cpp, f"LLAMA_FTYPE_{name}", None) == value


def quantize_file(src: Path, dst: Path, file_type: int, *, threads: int, allow_requantize: bool, pure: bool) -> int:
    """Quantize `src` into `dst` (blocking; the log carries per-tensor progress); returns llama.cpp's
    status, 0 = done."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = file_type
    params.nthread = threads  # 0: llama.cpp uses every hardware thread
    params.allow_requantize = allow_requantize
    params.pure = pure
    return int(llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), llama_cpp.byref(params)))


def tensor_types(src: Path, file_type: int, *, pure: bool = False) -> tuple[int, dict[str, str]]:
    """llama.cpp's dry run of quantizing `src` to `file_type`: (status, tensor name -> ggml type name,
    upper case). Only the header is read, so `src` may be a sparse file with no data written."""
    import llama_cpp

    from ondevice.llama.log import log_listener

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = file_type
    params.pure = pure
    params.dry_run = True
    pieces: list[str] = []
    with tempfile.TemporaryDirectory() as folder, log_listener(pieces.append):
        dst = Path(folder) / "dry-run.gguf"  # never written by a dry run; a folder of its own all the same
        rc = int(llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), llama_cpp.byref(params)))
    return rc, parse_tensor_types("".join(pieces))


def parse_tensor_types(log: str) -> dict[str, str]:
    """Tensor name -> the type the quantizer gives it, from its log (see _TENSOR)."""
    matches = list(_TENSOR.finditer(log))
    out = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(log)
        target = _TARGET.search(log, match.end(), end)
        out[match.group(1)] = (target.group(1) if target else match.group(2)).upper()
    return out
