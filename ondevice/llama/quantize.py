"""llama.cpp's quantizer: one call, llama_model_quantize (ondevice.quant.quantize does the checks,
the temporary file, the progress and the errors around it)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["supports_file_type", "quantize_file"]


def supports_file_type(name: str, value: int) -> bool:
    """This llama.cpp build knows file type `name` (e.g. "MOSTLY_Q4_K_M") with the number gguf gives it."""
    import llama_cpp

    return getattr(llama_cpp, f"LLAMA_FTYPE_{name}", None) == value


def quantize_file(src: Path, dst: Path, file_type: int, *, threads: int, allow_requantize: bool, pure: bool) -> int:
    """Quantize `src` into `dst` (blocking; the log carries per-tensor progress); returns llama.cpp's status, 0 = done."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = file_type
    params.nthread = threads  # 0: llama.cpp uses every hardware thread
    params.allow_requantize = allow_requantize
    params.pure = pure
    return int(llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), llama_cpp.byref(params)))
