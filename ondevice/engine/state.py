"""The KV cache of sequence 0 on disk: llama.cpp's sequence state, bound to what makes it valid.

File layout: MAGIC, a 4-byte little-endian header length, a JSON header, then the llama.cpp state
bytes and (when kept) the prompt's last logits. The header binds the state to the model file (size
and sha256 of its first and last MiB: a cheap content identity), the llama.cpp build, the context
settings (n_ctx, n_batch, n_ubatch, cache types, flash attention) and the token ids it holds, and
gives the sha256 of the payload. Anything that does not match, or a file that is truncated, garbage,
oversized or not a regular file, raises StateFileError: the caller recomputes, never answers from a
wrong cache. Files are written to a temporary name and renamed into place.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ondevice.core import paths
from ondevice.core.errors import EngineError, StateFileError

__all__ = [
    "MAGIC",
    "state_binding",
    "write_state",
    "read_state",
    "model_identity",
    "ResumeChoice",
    "choose_resume",
    "save_kv",
    "load_kv",
]

MAGIC = b"ONDEVICE-KV-STATE-1\n"
_HEADER_MAX_BYTES = 64 << 20  # the header holds at most n_ctx token ids as JSON
_EDGE_BYTES = 1 << 20


def model_identity(model_path: str) -> dict:
    """Size and sha256 of the first and last MiB of the model file: another file (or a rewritten one) differs."""
    path = Path(model_path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(_EDGE_BYTES))
        f.seek(max(0, size - _EDGE_BYTES))
        digest.update(f.read(_EDGE_BYTES))
    return {"size_bytes": size, "edges_sha256": digest.hexdigest()}


def state_binding(info: Any) -> dict:
    """What a saved state is valid for, from an engine's EngineInfo."""
    return {
        "model": model_identity(info.model_path),
        "llama_cpp": info.llama_cpp_version,
        "n_ctx": info.n_ctx,
        "n_batch": info.n_batch,
        "n_ubatch": info.n_ubatch,
        "cache_type_k": info.cache_type_k,
        "cache_type_v": info.cache_type_v,
        "flash_attn": info.flash_attn_used,
        "n_gpu_layers": info.n_gpu_layers,
    }


def write_state(path: Path, binding: dict, tokens: list[int], state: bytes, logits: bytes, logits_len: int) -> int:
    """Write the state file atomically; its size in bytes."""
    payload = state + logits
    header = {
        "binding": binding,
        "tokens": list(tokens),
        "state_bytes": len(state),
        "logits_bytes": len(logits),
        "logits_len": logits_len,
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
    }
    raw = json.dumps(header, sort_keys=True).encode()
    with paths.atomic_write(Path(path)) as out:
        out.write(MAGIC + struct.pack("<I", len(raw)) + raw)
        out.write(payload)
    return len(MAGIC) + 4 + len(raw) + len(payload)


def read_state(path: Path, binding: dict, max_payload_bytes: int) -> tuple[dict, bytes]:
    """The header and payload of a state file made for `binding`, else StateFileError (one line)."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise StateFileError(f"{path}: cannot read the state file ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise StateFileError(f"{path}: not a regular file")
    if st.st_size > len(MAGIC) + 4 + _HEADER_MAX_BYTES + max_payload_bytes:
        raise StateFileError(f"{path}: {st.st_size} bytes, more than a state of this context can be")
    with open(path, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced between the stat and the open
            raise StateFileError(f"{path}: not a regular file")
        head = f.read(len(MAGIC) + 4)
        if len(head) < len(MAGIC) + 4 or head[: len(MAGIC)] != MAGIC:
            raise StateFileError(f"{path}: not an ondevice KV state file")
        (n_header,) = struct.unpack("<I", head[len(MAGIC) :])
        if n_header > _HEADER_MAX_BYTES:
            raise StateFileError(f"{path}: damaged state file (header of {n_header} bytes)")
        header = _parse_header(path, f.read(n_header), n_header)
        n_payload = header["state_bytes"] + header["logits_bytes"]
        if n_payload > max_payload_bytes:
            raise StateFileError(f"{path}: a state of {n_payload} bytes is more than this context can hold")
        payload = f.read(n_payload + 1)
    if len(payload) != n_payload or hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
        raise StateFileError(f"{path}: truncated or damaged state file")
    _check_binding(path, header["binding"], binding)
    return header, payload


def _parse_header(path: Path, raw: bytes, n_header: int) -> dict:
    try:
        if len(raw) != n_header:
            raise ValueError
        header = json.loads(raw)
        ok = isinstance(header, dict) and isinstance(header.get("binding"), dict)
        ok = ok and isinstance(header.get("tokens"), list) and all(type(t) is int for t in header["tokens"])
        ok = ok and all(type(header.get(k)) is int and header[k] >= 0 for k in ("state_bytes", "logits_bytes"))
        ok = ok and type(header.get("logits_len")) is int and isinstance(header.get("payload_sha256"), str)
        if not ok:
            raise ValueError
    except ValueError:
        raise StateFileError(f"{path}: truncated or damaged state file") from None
    return header


def _check_binding(path: Path, saved: dict, current: dict) -> None:
    """One line naming the first setting that differs."""
    for key, value in current.items():
        if saved.get(key) != value:
            what = "model file" if key == "model" else key
            raise StateFileError(f"{path}: saved for another {what} ({saved.get(key)!r}, this engine: {value!r})")


def logits_bytes(buf: Any) -> bytes:
    return bytes(buf) if buf is not None else b""


def as_float_array(raw: bytes) -> Any:
    return (ctypes.c_float * (len(raw) // 4)).from_buffer_copy(raw)


@dataclass(frozen=True)
class ResumeChoice:
    """Restore a saved state or recompute its tokens, whichever is predicted faster, with both figures."""

    restore: bool
    restore_s: float | None  # predicted: state bytes / the disk's read rate (None: no disk figure)
    recompute_s: float | None  # predicted prefill of the saved tokens (None: no prediction)

    def text(self) -> str:
        def secs(s: float | None) -> str:
            return "unknown" if s is None else f"{s * 1e3:.0f} ms"

        verb = "restoring the saved state" if self.restore else "recomputing the conversation"
        return f"{verb}: restore predicted {secs(self.restore_s)}, recompute {secs(self.recompute_s)}"


def choose_resume(state_bytes: int, disk_read_gbs: float | None, recompute_s: float | None) -> ResumeChoice:
    """Restore when its predicted time (bytes / disk read rate) is below the predicted recompute. Without one of
    the figures, restore: a state that loads gives the same cache, so it is never a wrong answer."""
    restore_s = state_bytes / (disk_read_gbs * 1e9) if disk_read_gbs else None
    if restore_s is None or recompute_s is None:
        return ResumeChoice(True, restore_s, recompute_s)
    return ResumeChoice(restore_s < recompute_s, restore_s, recompute_s)


def save_kv(h: Any, kv: Any, info: Any, path: Path) -> int:
    """Engine.save_state's work (the engine's lock held): sequence 0's llama.cpp state, the tokens the KV cache
    (a loop.KVCache) holds and the prompt's kept logits, written to `path` bound to the engine's EngineInfo."""
    n_bytes = int(h.lib.llama_state_seq_get_size(h.ctx, 0))
    buf = (ctypes.c_uint8 * n_bytes)()
    got = int(h.lib.llama_state_seq_get_data(h.ctx, buf, n_bytes, 0))
    if got != n_bytes:
        raise EngineError(f"llama.cpp wrote {got} of {n_bytes} state bytes")
    held = kv.prompt_logits is not None and kv.prompt_logits_len <= len(kv.tokens)
    logits = logits_bytes(kv.prompt_logits if held else None)
    binding = state_binding(info)
    return write_state(path, binding, kv.tokens, bytes(buf), logits, kv.prompt_logits_len * held)


def load_kv(h: Any, kv: Any, info: Any, path: str | Path, prompt: Sequence[int] | None) -> int:
    """Engine.load_state's work (the engine's lock held): the state at `path` into sequence 0 and the KV
    cache's bookkeeping; the number of tokens the cache then holds."""
    n_ctx = info.n_ctx
    cap = n_ctx * max(1, info.spec.kv_bytes_per_token) * 4 + 4 * h.n_vocab + (16 << 20)
    header, payload = read_state(Path(path), state_binding(info), cap)
    tokens = header["tokens"]
    if prompt is not None and list(prompt[: len(tokens)]) != tokens:
        raise StateFileError(f"{path}: saved for another prompt (its {len(tokens)} tokens differ)")
    if len(tokens) > n_ctx:
        raise StateFileError(f"{path}: {len(tokens)} tokens do not fit this {n_ctx}-token context")
    kv.clear()
    n_state = header["state_bytes"]
    src = (ctypes.c_uint8 * n_state).from_buffer_copy(payload[:n_state])
    if int(h.lib.llama_state_seq_set_data(h.ctx, src, n_state, 0)) != n_state:
        kv.clear()
        raise StateFileError(f"{path}: llama.cpp refused the saved state")
    kv.tokens.extend(tokens)
    if header["logits_bytes"] == 4 * h.n_vocab and 0 < header["logits_len"] <= len(tokens):
        kv.prompt_logits = as_float_array(payload[n_state:])
        kv.prompt_logits_len = header["logits_len"]
    return len(tokens)
