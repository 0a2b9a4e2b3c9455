"""Quantize a GGUF file through llama.cpp's own quantizer (llama_model_quantize).

The output is written to a hidden temporary name beside the destination and renamed only
once llama.cpp has finished and the result reads back as a complete GGUF: a failed run (disk
full included) leaves nothing, and a killed one a temp name that is no `.gguf` and that later
runs remove. The destination follows paths.check_destination: an existing file is never
overwritten without `force`, a directory or special file never; an already-quantized source needs
`allow_requantize` (the precision it lost cannot come back).
"""

from __future__ import annotations

import logging
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gguf import GGMLQuantizationType, LlamaFileType
from ondevice.quant.formats import block_format

from ondevice.core import paths
from ondevice.core.errors import DestinationError, GGUFFormatError, InvalidParameterError, QuantError
from ondevice.gguf.reader import GGUFFile, read_gguf

__all__ = ["quantize", "file_types", "file_type", "main_tensor_type", "is_quantized", "estimate_bytes", "Progress"]

_log = logging.getLogger(__name__)

# llama.cpp quantizes to these file types only with an importance matrix, which this tool does not make; its dry run
# picks their tensors' types without one, so a header (a twin, `predict --quant`) can still have them.
_NEEDS_IMATRIX = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "Q2_K_S"}
_TENSOR_LINE = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]")

# progress(tensors_done, tensors_total): called from the thread that called quantize()
Progress = Callable[[int, int], None]


def _label(member: LlamaFileType) -> str:
    return member.name.removeprefix("MOSTLY_").removeprefix("ALL_")


def file_types(*, header_only: bool = False) -> dict[str, LlamaFileType]:
    """Quantization targets by name ("Q4_K_M", "Q8_0", "F16", ...), from gguf's LlamaFileType. header_only: also
    the types quantizing to needs an importance matrix for (a header's tensor types need none)."""
    return {
        _label(m): m
        for m in LlamaFileType
        if m is not LlamaFileType.GUESSED and (header_only or _label(m) not in _NEEDS_IMATRIX)
    }


def file_type(name: str, *, header_only: bool = False) -> LlamaFileType:
    """The llama.cpp file type for a name (case-insensitive); QuantError lists the valid ones, or says that quantizing
    to it needs an importance matrix (header_only: a header's types are wanted, which need none)."""
    label = str(name).strip().upper()
    if label in _NEEDS_IMATRIX and not header_only:
        raise QuantError(
            f"quantizing to {label} needs an importance matrix, which ondevice does not make: use llama.cpp's "
            "llama-imatrix and llama-quantize, or another type"
        )
    types = file_types(header_only=header_only)
    member = types.get(label)
    if member is None:
        raise QuantError(f"unknown quantization type {name!r}; valid types: {', '.join(types)}")
    return member


def main_tensor_type(ftype: LlamaFileType) -> GGMLQuantizationType:
    """The tensor type most weights get for a file type (Q4_K_M -> Q4_K, Q8_0 -> Q8_0)."""
    label = _label(ftype)
    while label:
        if label in GGMLQuantizationType.__members__:
            return GGMLQuantizationType[label]
        label = label.rpartition("_")[0]
    raise QuantError(f"no tensor type known for file type {ftype.name}")


def is_quantized(g: GGUFFile) -> list[str]:
    """Names of the quantized (block) types among a file's tensors; [] for F32/F16/BF16 files."""
    return sorted({t.type_name for t in g.tensors if block_format(t.ggml_type).is_quantized})


def estimate_bytes(g: GGUFFile, ftype: LlamaFileType) -> int:
    """Rough size of the output: matrices at the file type's main tensor type, the rest as is."""
    fmt = block_format(main_tensor_type(ftype))
    total = g.data_offset
    for t in g.tensors:
        if len(t.shape) >= 2 and t.shape[0] % fmt.block_elements == 0:
            total += fmt.tensor_bytes(t.shape)
        else:
            total += t.n_bytes
    return total


def quantize(
    src: str | Path,
    dst: str | Path,
    qtype: str,
    *,
    threads: int | None = None,
    allow_requantize: bool = False,
    force: bool = False,
    progress: Progress | None = None,
    pure: bool = False,
) -> Path:
    """Write `src` quantized to `qtype` at `dst`; return `dst`. Raises QuantError (and
    GGUFFormatError / ModelNotFoundError for a source that is not a readable GGUF).

    `pure`: every matrix gets the type's main tensor type (llama.cpp's --pure), instead of
    llama.cpp's mix (e.g. Q4_0 files keep output.weight at Q6_K)."""
    ftype = file_type(qtype)
    if threads is not None and int(threads) < 1:
        raise InvalidParameterError(f"threads must be at least 1, not {threads}")
    src, dst = Path(src), Path(dst)
    source = read_gguf(src)
    if not source.tensors:
        raise QuantError(f"{src}: has no tensors (vocab-only GGUF); nothing to quantize")
    already = is_quantized(source)
    if already and not allow_requantize:
        raise QuantError(
            f"{src} is already quantized ({', '.join(already)}); requantizing cannot bring back the precision "
            "it lost: pass --allow-requantize to do it anyway"
        )
    if already:
        _log.info(
            "requantizing %s (%s): quality lost in the first quantization cannot come back", src, ", ".join(already)
        )
    _check_destination(src, dst, force)
    _check_space(dst, estimate_bytes(source, ftype))
    try:
        with paths.atomic_path(dst) as tmp:
            _run_llama_quantize(
                src, tmp, dst, ftype, threads=threads, allow_requantize=allow_requantize, progress=progress, pure=pure
            )
            _verify_output(tmp, dst, len(source.tensors))
    except DestinationError as exc:  # the rename refused (an immutable file, a read-only mount): the temp is gone
        raise QuantError(str(exc)) from None
    return dst


def _check_destination(src: Path, dst: Path, force: bool) -> None:
    if dst.exists() and src.resolve() == dst.resolve():
        raise QuantError(f"destination {dst} is the source file")
    try:
        paths.check_destination(dst, force=force)
    except DestinationError as exc:
        raise QuantError(str(exc)) from None
    paths.remove_stale_temps(dst.parent)  # our own temp names only: what killed runs left


def _check_space(dst: Path, need_bytes: int) -> None:
    try:
        free = shutil.disk_usage(dst.parent).free
    except OSError:
        return
    if free < need_bytes:
        raise QuantError(
            f"not enough disk space in {dst.parent}: about {need_bytes / 1e6:.1f} MB needed, {free / 1e6:.1f} MB free"
        )


def _run_llama_quantize(
    src: Path, tmp: Path, dst: Path, ftype: LlamaFileType, *, threads, allow_requantize, progress, pure
) -> None:
    from ondevice.llama.log import log_listener
    from ondevice.llama.quantize import quantize_file, supports_file_type

    if not supports_file_type(ftype.name, ftype.value):
        raise QuantError(f"this llama.cpp build does not support {_label(ftype)}")
    state = _QuantizeState()

    def on_log(text: str) -> None:
        match = _TENSOR_LINE.search(text)
        if match:
            state.done, state.total = int(match.group(1)), int(match.group(2))
        if "failed" in text or "error" in text.lower():
            state.errors.append(text.strip())

    def work() -> None:
        try:
            state.rc = quantize_file(
                src,
                tmp,
                ftype.value,
                threads=int(threads or 0),
                allow_requantize=bool(allow_requantize),
                pure=bool(pure),
            )
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            state.error = exc

    drop = _DropReported()
    logging.getLogger("ondevice.llama_cpp").addFilter(drop)
    with log_listener(on_log):
        worker = threading.Thread(target=work, name="llama-quantize", daemon=True)
        worker.start()
        try:
            _wait(worker, state, progress)
        finally:
            logging.getLogger("ondevice.llama_cpp").removeFilter(drop)
    if state.error is not None:
        raise QuantError(f"quantizing {src} failed: {state.error}")
    if state.rc != 0:
        detail = state.errors[-1] if state.errors else f"llama_model_quantize returned {state.rc}"
        if "iostream" in detail:  # std::ofstream failed mid-write
            raise QuantError(f"writing {dst} failed, the disk may be full: {detail}")
        raise QuantError(f"quantizing {src} to {_label(ftype)} failed: {detail}")


class _DropReported(logging.Filter):
    """Drop llama.cpp's own "failed to quantize" line: the QuantError says it once."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "failed to quantize" not in record.getMessage()


@dataclass
class _QuantizeState:
    """What the quantizer's worker thread and its log callback leave for the caller's thread."""

    done: int = 0  # tensors quantized so far
    total: int = 0  # tensors in all
    rc: int | None = None  # llama_model_quantize's status, once it returned
    error: BaseException | None = None  # what the call raised instead
    errors: list[str] = field(default_factory=list)  # llama.cpp's log lines that speak of a failure


def _wait(worker: threading.Thread, state: _QuantizeState, progress: Progress | None) -> None:
    """Join the worker, reporting progress from this thread; Ctrl+C still reaches the caller."""
    shown = (-1, -1)
    while worker.is_alive():
        worker.join(0.1)
        now = (state.done, state.total)
        if progress and now != shown and now[1]:
            progress(*now)
            shown = now
    if progress and state.rc == 0 and state.total:
        progress(state.total, state.total)


def _verify_output(tmp: Path, dst: Path, n_tensors: int) -> None:
    """The temporary file must read back as a complete GGUF with every tensor."""
    try:
        out = read_gguf(tmp)
    except GGUFFormatError as exc:
        raise QuantError(f"writing {dst} failed: the output is incomplete ({exc})") from None
    if len(out.tensors) != n_tensors:
        raise QuantError(f"writing {dst} failed: {len(out.tensors)} of {n_tensors} tensors written")
