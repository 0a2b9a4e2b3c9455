"""The reproducibility record every result file carries (docs/bench.md).

Model files are hashed before the bench runs (hashing reads the whole file, which must not
happen between a cold-load eviction and its load); digests are cached by path, size and
mtime so a large model is hashed once.
"""

from __future__ import annotations

import json
import logging
import platform
import shlex
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ondevice.core import paths
from ondevice.core.hashing import sha256_file

__all__ = ["SCHEMA", "READABLE_SCHEMAS", "file_sha256", "model_digests", "build_record"]

# The "schema" field of every result file. 2 added the host's machine id (record.host.machine_id,
# for `bench compare`), the cold_start scenario and goodput in req/s (slo.goodput_rps beside
# slo.good_share, which /1 called "goodput"); a /1 file is still read.
SCHEMA = "ondevice-bench/2"
READABLE_SCHEMAS = ("ondevice-bench/1", SCHEMA)
log = logging.getLogger(__name__)


def _digest_cache() -> Path:
    return paths.cache_dir() / "bench" / "sha256.json"


def file_sha256(path: str | Path, *, use_cache: bool = True) -> str:
    """sha256 of a file, remembered by (path, size, mtime_ns) in the user cache dir."""
    path = Path(path).resolve()
    st = path.stat()
    key, stamp = str(path), [st.st_size, st.st_mtime_ns]
    cache: dict[str, Any] = {}
    if use_cache:
        try:
            cache = json.loads(_digest_cache().read_text())
        except (OSError, ValueError):
            cache = {}
        hit = cache.get(key)
        if isinstance(hit, dict) and hit.get("stamp") == stamp and isinstance(hit.get("sha256"), str):
            return hit["sha256"]
    digest = sha256_file(path)
    if use_cache and isinstance(cache, dict):
        cache[key] = {"stamp": stamp, "sha256": digest}
        try:
            with paths.atomic_write(_digest_cache(), "w") as out:
                json.dump(cache, out)
        except OSError as exc:  # a read-only cache dir only costs a re-hash next time
            log.debug("sha256 cache not written: %s", exc)
    return digest


def model_digests(plans: Sequence[Any]) -> dict[str, str | None]:
    """label -> sha256 of every planned model file (None when it cannot be read)."""
    out: dict[str, str | None] = {}
    for p in plans:
        try:
            out[p.label] = file_sha256(p.path) if p.path else None
        except OSError:
            out[p.label] = None
    return out


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).isoformat(timespec="seconds")


def _machine_id() -> str | None:
    try:
        from ondevice.probing.cache import machine_id

        return machine_id()
    except Exception as exc:  # the record still says what it can
        log.debug("machine id: %s", exc)
        return None


def _host() -> dict[str, Any]:
    try:
        from ondevice.probing.hardware import detect

        return detect().to_dict()
    except Exception as exc:  # the record still says what it can
        import psutil

        return {
            "os": f"{platform.system()} {platform.release()}",
            "machine": platform.machine(),
            "cpu_model": platform.processor() or None,
            "ram_total_bytes": psutil.virtual_memory().total,
            "warnings": [f"host detection failed: {type(exc).__name__}: {exc}"],
        }


def _probe(backend: str | None) -> dict[str, Any]:
    if not backend:
        return {"note": "no model loaded: backend unknown"}
    try:
        from ondevice.probing import cached_probe

        result = cached_probe(backend)
    except Exception as exc:
        return {"note": f"probe cache unreadable: {type(exc).__name__}: {exc}"}
    if result is None:
        return {
            "backend": backend,
            "note": f"no probe cached for {backend}: run `ondevice probe` for the roofline columns",
        }
    d = result.to_dict()
    d.pop("host", None)  # already in the record
    d.update(age_s=round(result.age_s, 1), probed_at=_iso(result.created_unix_s))
    return d


def _versions() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, Any] = {"python": platform.python_version()}
    for dist in ("ondevice", "llama_cpp_python", "numpy", "gguf"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    from ondevice.llama.build import build_id, build_info, llama_cpp_version

    binding_version, system_info = build_info()
    out["llama_cpp_build"] = build_id(binding_version, system_info)  # llama-cpp-python version + system info hash
    out["llama_cpp"] = llama_cpp_version()
    out["llama_cpp_system_info"] = system_info.strip() if system_info else None
    return out


def _model(p: Any, digests: dict[str, str | None]) -> dict[str, Any]:
    spec = p.spec
    d: dict[str, Any] = {
        "label": p.label,
        "ref": p.ref,
        "path": str(p.path) if p.path else None,
        "sha256": digests.get(p.label),
        "error": p.error or None,
        "n_ctx": p.n_ctx,
        "engine": dict(p.engine_info),
        "workloads": [
            {
                "name": w.name,
                "prompt_tokens": w.prompt_tokens,
                "output_tokens": w.output_tokens,
                "capped_from": w.capped_from,
                "output_capped_from": w.output_capped_from,
            }
            for w in p.suite.workloads
        ],
    }
    if spec is not None:
        d.update(
            name=spec.name,
            arch=spec.arch,
            quant=spec.quant,
            file_bytes=spec.file_bytes,
            decode_weight_bytes=spec.decode_weight_bytes,
            n_ctx_train=spec.n_ctx_train,
            kv_bytes_per_token=spec.kv_bytes_per_token,
            kv_bytes_allocated=spec.kv_read_bytes(p.n_ctx),
        )
    return d


def build_record(
    outcome: Any,
    *,
    argv: Sequence[str] | None = None,
    digests: dict[str, str | None] | None = None,
    host: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The record for a finished (or interrupted) BenchOutcome."""
    cfg = outcome.config
    backend = next((p.engine_info.get("backend") for p in outcome.models if p.engine_info), None)
    argv = list(sys.argv if argv is None else argv)
    return {
        "schema": SCHEMA,
        "started_at": _iso(outcome.started_at),
        "ended_at": _iso(outcome.ended_at or time.time()),
        "duration_s": round((outcome.ended_at or time.time()) - outcome.started_at, 3),
        "incomplete": bool(outcome.incomplete),
        "command_line": shlex.join(argv),
        "versions": _versions(),
        "host": {"machine_id": _machine_id(), **(host if host is not None else _host())},
        "probe": _probe(backend),
        "settings": {
            "suite": cfg.suite.name,
            "repeats": cfg.suite.repeats,
            "warmup": cfg.suite.warmup,
            "scenarios": list(cfg.scenarios),
            "seed": cfg.seed,
            "sampling": dict(cfg.sampling, ignore_eos=True),
            "timeout_s": cfg.timeout_s,
            "n_ctx": cfg.n_ctx,
            "n_threads": cfg.n_threads,
            "n_batch": cfg.n_batch,
            "n_ubatch": cfg.n_ubatch,
            "n_gpu_layers": cfg.n_gpu_layers,
            "flash_attn": cfg.flash_attn,
            "cache_type_k": cfg.cache_type_k,
            "cache_type_v": cfg.cache_type_v,
            "ablation_tokens": cfg.suite.ablation_tokens,
            "prompts": "seeded English-like text, cut to exact token counts in each model's tokenizer",
            "peak_rss": outcome.rss_method,
        },
        "models": [_model(p, digests or {}) for p in outcome.models],
    }
