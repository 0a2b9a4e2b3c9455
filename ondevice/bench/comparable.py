"""Whether two bench runs can be compared at all: what differs between their records.

A verdict ("slower", "faster") is only about the change a user made when everything else was
held: the same model file, llama-cpp-python, engine settings, sampling and machine. This
lists what was not, from the records both files carry (ondevice.bench.record), so `bench
compare` can say "not comparable: ..." before its verdicts (it still shows the numbers).

Only what both records state is compared: a field one side lacks (an older file without the
machine id, a server run without engine settings) is not called a difference. Two models in
one file (measured interleaved) are two models on purpose: their files are not compared, only
their engine settings (host, versions and sampling are the file's own, shared).
"""

from __future__ import annotations

from typing import Any

__all__ = ["differences", "ENGINE_KEYS", "SAMPLING_KEYS"]

# Engine settings as the engine reported them at load (the record's models[].engine), with a
# label for the line. flash_attn_used (what llama.cpp chose for "auto") is compared when both
# sides have it, else what was asked.
ENGINE_KEYS = (
    ("backend", "backend"),
    ("n_gpu_layers", "offload"),
    ("n_threads", "threads"),
    ("n_ctx", "n_ctx"),
    ("n_batch", "n_batch"),
    ("n_ubatch", "n_ubatch"),
    ("flash_attn_used", "flash attention"),
    ("cache_type_k", "K cache"),
    ("cache_type_v", "V cache"),
    ("cpu_buffers", "CPU buffers"),
)
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty")


def _model_entry(doc: dict[str, Any], label: str | None) -> dict[str, Any]:
    models = [m for m in (doc.get("record") or {}).get("models") or [] if isinstance(m, dict)]
    if label is not None:
        found = next((m for m in models if m.get("label") == label), None)
        if found is not None:
            return found
    return models[0] if len(models) == 1 else {}


def _differ(a: Any, b: Any) -> bool:
    return a is not None and b is not None and a != b


def _short(x: Any) -> str:
    return f"{x[:12]}…" if isinstance(x, str) and len(x) > 16 else str(x)


def _engine(m: dict[str, Any]) -> dict[str, Any]:
    eng = dict(m.get("engine") or {})
    if eng.get("flash_attn_used") is None and eng.get("flash_attn") is not None:
        eng["flash_attn_used"] = eng["flash_attn"]
    if eng.get("n_ctx") is None:
        eng["n_ctx"] = m.get("n_ctx")
    return eng


def _host_items(ha: dict[str, Any], hb: dict[str, Any]) -> list[str]:
    out = []
    if _differ(ha.get("cpu_model"), hb.get("cpu_model")):
        out.append(f"CPU ({ha['cpu_model']} vs {hb['cpu_model']})")
    gpus_a = [g.get("name") for g in ha.get("gpus") or [] if isinstance(g, dict)] if "gpus" in ha else None
    gpus_b = [g.get("name") for g in hb.get("gpus") or [] if isinstance(g, dict)] if "gpus" in hb else None
    if gpus_a is not None and gpus_b is not None and gpus_a != gpus_b:  # _differ, spelled out for the types
        out.append(f"GPU ({', '.join(map(str, gpus_a)) or 'none'} vs {', '.join(map(str, gpus_b)) or 'none'})")
    if _differ(ha.get("machine_id"), hb.get("machine_id")):
        out.append(f"machine ({ha['machine_id']} vs {hb['machine_id']})")
    return out


def differences(
    a: dict[str, Any],
    b: dict[str, Any],
    *,
    a_model: str | None = None,
    b_model: str | None = None,
    same_file: bool = False,
) -> list[str]:
    """What differs between result documents a and b that a comparison should hold equal, one
    short item each ("threads (1 vs 2)"); [] when nothing stated by both differs.

    a_model / b_model: the model labels compared (a file's only model when None).
    same_file: both documents are halves of one file (two models measured interleaved).
    """
    ra, rb = a.get("record") or {}, b.get("record") or {}
    ma, mb = _model_entry(a, a_model), _model_entry(b, b_model)
    out = []
    if not same_file and _differ(ma.get("sha256"), mb.get("sha256")):
        out.append(f"model sha256 ({_short(ma['sha256'])} vs {_short(mb['sha256'])})")
    if not same_file:
        va, vb = ra.get("versions") or {}, rb.get("versions") or {}
        if _differ(va.get("llama_cpp_python"), vb.get("llama_cpp_python")):
            out.append(f"llama-cpp-python ({va['llama_cpp_python']} vs {vb['llama_cpp_python']})")
        elif _differ(va.get("llama_cpp_build"), vb.get("llama_cpp_build")):
            out.append(f"llama.cpp build ({va['llama_cpp_build']} vs {vb['llama_cpp_build']})")
    ea, eb = _engine(ma), _engine(mb)
    for key, label in ENGINE_KEYS:
        if _differ(ea.get(key), eb.get(key)):
            out.append(f"{label} ({ea[key]} vs {eb[key]})")
    if not same_file:
        sa = (ra.get("settings") or {}).get("sampling") or {}
        sb = (rb.get("settings") or {}).get("sampling") or {}
        for key in SAMPLING_KEYS:
            if _differ(sa.get(key), sb.get(key)):
                out.append(f"{key} ({sa[key]} vs {sb[key]})")
        out += _host_items(ra.get("host") or {}, rb.get("host") or {})
    return out
