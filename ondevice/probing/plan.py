"""What the kernel probe runs: the plan (shapes, sizes, token counts), its synthetic models (built
once by quant's synthetic builder, quantized by llama.cpp, kept in the cache) and the runs over
them. kernel.py measures the runs and fits them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ondevice.roofline import bits_per_weight

__all__ = ["PROBE_TYPES", "KernelPlan", "ProbeRun", "Progress", "layer_bytes", "plan_for", "probe_models"]

PROBE_TYPES = ("Q4_0", "Q4_K", "Q5_0", "Q6_K", "Q8_0", "F16")  # the common GGUF types: each has its own CPU kernels
_FILE_TYPE = {"Q4_K": "Q4_K_S"}  # the quantizer's file type whose matrices are (nearly all) this tensor type
_MB = 1 << 20
_SIZED_MIN = 256 * _MB  # the F16 sized model is at least this, and the Q4_0 one >= 4x the last-level cache

Progress = Callable[[str], None]  # one line describing the step now running


@dataclass(frozen=True)
class KernelPlan:
    """Shapes and sizes of the probe models, and how long to decode each."""

    d_model: int = 2048  # width of the sized models (a multiple of 256)
    n_head: int = 16  # query heads
    n_head_kv: int = 4  # KV heads
    d_ff: int = 5632  # feed-forward width
    n_layer: int = 5  # blocks of the sized models
    n_vocab: int = 512  # vocabulary of the sized models (keeps the head < 1% of the bytes)
    tiny_d_model: int = 64  # width of the tiny models (weights stay in cache)
    tiny_layers: tuple[int, int] = (2, 16)  # blocks of the two tiny models (per-layer cost)
    tiny_vocab: int = 32000  # vocabulary of the large-vocab tiny model (per-entry cost)
    attn_shapes: tuple[tuple[int, int, int, int], ...] = (
        (1024, 16, 4, 8),
        (2048, 16, 4, 8),
        (1024, 4, 1, 8),
    )  # attention
    # models: d_model, heads, KV heads, blocks (head dimension 64, 128 and 256: Llama 3.2 1B's, Llama 3 8B's and
    # Qwen's, Gemma's; per score they cost 12, ~35 and 11-18 ns on an AMD EPYC VM, no line through them)
    attn_d_ff: int = 256  # feed-forward width of the attention models (small: the context's cost stands out)
    n_long: int = 2048  # prompt tokens of the attention model's long-context run (attention dominates there)
    narrow: tuple[int, int, int, int] = (640, 5, 1, 2048)  # the narrow model: d_model, heads, KV heads, d_ff (rows
    # of 640: Gemma 3 270M's width; against the sized models' 2,048 it sets the cost per matrix row)
    narrow_type: str = "Q8_0"  # its weight type (not repacked on x86, like most heads)
    narrow_layers: int = 26  # its blocks (plan_for: >= 4 x LLC of weights)
    cached: tuple[int, int, int, int] = (
        1024,
        16,
        4,
        1024,
    )  # the cached models, one per type: d_model, heads, KV heads,
    # d_ff; as many blocks as make cached_bytes (weights the caches hold: how fast each type's kernel goes from them)
    cached_bytes: int = 8 * _MB  # weights of each cached model (plan_for: at most a quarter of the LLC); large enough
    # that reading them, not the fixed costs, is most of a step
    n_prompt: int = 16  # prompt tokens before decoding (every other run)
    n_prefill: int = 512  # prompt tokens of the sized models' prefill runs: one llama_decode chunk of the engine's
    # default n_batch (a longer prompt is such chunks), so the batched rates are fitted at the chunk prompts use
    step_tokens: tuple[int, ...] = (2, 3, 4, 8, 16, 32, 64, 128)  # tokens per llama_decode timed against one (the
    # prefill runs): per token a matrix product costs more over few columns than over many (an AMD EPYC VM, sized Q5_0:
    # 4.5 ms a token at 16-64, 3.8 at 128, 3.5 at 256), so a short prompt's chunk is timed, not interpolated
    step_reps: int = 3  # timings of each up to 16 tokens, the median kept (longer steps: one per pass)
    n_tokens: int = 32  # decode steps timed per model (after n_warmup)
    n_warmup: int = 3  # decode steps dropped first (page faults, caches)
    run_budget_s: float = 4.0  # a run stops decoding after this many seconds (>= 4 timed steps kept)
    passes: int = 3  # every run is decoded this many times, round-robin; the median pass counts
    types: tuple[str, ...] = PROBE_TYPES  # weight types probed

    def layer_bytes_f16(self) -> int:
        return round(layer_bytes((self.d_model, self.n_head, self.n_head_kv, self.d_ff), "F16"))

    def row_width(self) -> float:
        """Weights per matrix row of the sized models (Calibration.batch_row_width): about 2,446 for the default shape."""
        d, kv_dim, d_ff = self.d_model, self.n_head_kv * (self.d_model // self.n_head), self.d_ff
        return (2 * d * d + 2 * kv_dim * d + 3 * d_ff * d) / (2 * d + 2 * kv_dim + 2 * d_ff + d)

    def mid_context(self, n_prompt: int) -> int:
        """The context at the middle of the timed decode steps of a run with n_prompt tokens."""
        return n_prompt + self.n_warmup + self.n_tokens // 2


def layer_bytes(shape: tuple[int, int, int, int], weight_type: str) -> float:
    """Bytes of one block of a probe model: shape (d_model, heads, KV heads, d_ff), its matrices (Q, K, V, O,
    gate, up, down) in weight_type."""
    d, heads, kv_heads, d_ff = shape
    return (2 * d * d + 2 * kv_heads * (d // heads) * d + 3 * d_ff * d) * bits_per_weight(weight_type) / 8


def plan_for(llc_bytes: int | None) -> KernelPlan:
    """Sized models that dwarf the caches: Q4_0 (4.5 bits per weight) >= 4 x LLC, F16 >= 256 MiB; the narrow
    Q8_0 model >= 4 x LLC and 128 MiB."""
    plan = KernelPlan()
    target = max(_SIZED_MIN, 4 * (llc_bytes or 0) * 16 // 4.5)
    narrow_target = max(128 * _MB, 4 * (llc_bytes or 0))
    return replace(
        plan,
        n_layer=max(1, int(-(-target // plan.layer_bytes_f16()))),
        narrow_layers=max(1, int(-(-narrow_target // layer_bytes(plan.narrow, plan.narrow_type or "Q8_0")))),
        cached_bytes=max(_MB, min(plan.cached_bytes, (llc_bytes or 4 * plan.cached_bytes) // 4)),
    )


@dataclass(frozen=True)
class ProbeRun:
    """One decode run of the kernel probe."""

    weight_type: str  # main weight type of the model
    path: Path  # the model file
    n_prompt: int  # prompt tokens before the timed steps
    role: str  # "sized" (bandwidth), "narrow" (cost per row), "cached" (kernel speed from the caches),
    # "tiny" (fixed costs), "attn" (attention),
    # "prefill" (batched rate) or "narrow-prefill" (batched cost per row)

    @property
    def is_prefill(self) -> bool:
        """A prefill run (timed for its prompt only, no decode)."""
        return self.role.endswith("prefill")


# ---------- models ----------


def _synth_kwargs(plan: KernelPlan, kind: str, n_layer: int, n_vocab: int, attn_shape=None) -> dict:
    """SynthConfig fields of a sized, narrow, tiny or attention probe model (attn_shape: one of plan.attn_shapes)."""
    if kind == "cached":
        d, heads, kv_heads, d_ff = plan.cached
        return dict(
            d_model=d,
            n_head=heads,
            n_head_kv=kv_heads,
            d_ff=d_ff,
            n_layer=n_layer,
            n_vocab=n_vocab,
            n_ctx_train=1024,
            seed=17,
            name="ondevice-probe-cached",
        )
    if kind == "narrow":
        d, heads, kv_heads, d_ff = plan.narrow
        return dict(
            d_model=d,
            n_head=heads,
            n_head_kv=kv_heads,
            d_ff=d_ff,
            n_layer=n_layer,
            n_vocab=n_vocab,
            n_ctx_train=1024,
            seed=13,
            name="ondevice-probe-narrow",
        )
    if kind == "tiny":
        d = plan.tiny_d_model if n_vocab <= 512 else plan.tiny_d_model // 4  # a thin head: the vocabulary's
        # per-entry cost (logits, sampling) more than the head's cache-speed matmul
        return dict(
            d_model=d,
            n_head=max(1, d // 32),
            n_head_kv=1,
            d_ff=2 * d,
            n_layer=n_layer,
            n_vocab=n_vocab,
            n_ctx_train=1024,
            seed=7,
            name="ondevice-probe-tiny",
        )
    if kind == "attn":
        d, heads, kv_heads, blocks = attn_shape
        return dict(
            d_model=d,
            n_head=heads,
            n_head_kv=kv_heads,
            d_ff=plan.attn_d_ff,
            n_layer=blocks,
            n_vocab=n_vocab,
            n_ctx_train=max(1024, 2 * plan.n_long),
            seed=5,
            name="ondevice-probe-attn",
        )
    return dict(
        d_model=plan.d_model,
        n_head=plan.n_head,
        n_head_kv=plan.n_head_kv,
        d_ff=plan.d_ff,
        n_layer=n_layer,
        n_vocab=n_vocab,
        n_ctx_train=1024,
        seed=11,
        name="ondevice-probe",
    )


def _model_path(model_dir: Path, kind: str, cfg: dict, weight_type: str) -> Path:
    tag = f"{kind}-d{cfg['d_model']}-l{cfg['n_layer']}-f{cfg['d_ff']}-v{cfg['n_vocab']}-h{cfg['n_head']}x{cfg['n_head_kv']}"
    return model_dir / f"{tag}-{weight_type}.gguf"


def _ensure(model_dir: Path, kind: str, cfg: dict, weight_type: str, progress: Progress) -> Path:
    """The F16 model for cfg (built if missing), quantized to weight_type (if missing)."""
    from ondevice.quant.synth import SynthConfig, build_synthetic_model

    f16 = _model_path(model_dir, kind, cfg, "F16")
    if not f16.exists():
        progress(f"building {f16.name}")
        build_synthetic_model(SynthConfig(dtype="F16", **cfg), f16)
    if weight_type == "F16":
        return f16
    out = _model_path(model_dir, kind, cfg, weight_type)
    if not out.exists():
        from ondevice.quant.quantize import quantize

        progress(f"quantizing {out.name}")
        quantize(f16, out, _FILE_TYPE.get(weight_type, weight_type))
    return out


def probe_models(plan: KernelPlan, model_dir: Path, progress: Progress) -> list[ProbeRun]:
    """Every run the plan decodes, building the models that are missing."""
    model_dir.mkdir(parents=True, exist_ok=True)
    runs: list[ProbeRun] = []
    cfg = _synth_kwargs(plan, "sized", plan.n_layer, plan.n_vocab)
    for t in plan.types:
        runs.append(ProbeRun(t, _ensure(model_dir, "sized", cfg, t, progress), plan.n_prompt, "sized"))
    if plan.narrow_type:
        narrow = _ensure(
            model_dir,
            "narrow",
            _synth_kwargs(plan, "narrow", plan.narrow_layers, plan.n_vocab),
            plan.narrow_type,
            progress,
        )
        runs.append(ProbeRun(plan.narrow_type, narrow, plan.n_prompt, "narrow"))
    if plan.cached:
        for t in plan.types:
            blocks = max(1, round(plan.cached_bytes / layer_bytes(plan.cached, t)))
            cfg = _synth_kwargs(plan, "cached", blocks, plan.n_vocab)
            runs.append(ProbeRun(t, _ensure(model_dir, "cached", cfg, t, progress), plan.n_prompt, "cached"))
    tiny = [(plan.tiny_layers[0], 512, t) for t in plan.types]
    tiny += [(plan.tiny_layers[1], 512, "F16"), (plan.tiny_layers[0], plan.tiny_vocab, "F16")]
    for n_layer, n_vocab, t in tiny:
        runs.append(
            ProbeRun(
                t,
                _ensure(model_dir, "tiny", _synth_kwargs(plan, "tiny", n_layer, n_vocab), t, progress),
                plan.n_prompt,
                "tiny",
            )
        )
    prefill_role = {"sized": "prefill", "narrow": "narrow-prefill"}
    runs += [
        ProbeRun(r.weight_type, r.path, plan.n_prefill, prefill_role[r.role]) for r in runs if r.role in prefill_role
    ]
    for shape in plan.attn_shapes:
        attn = _ensure(model_dir, "attn", _synth_kwargs(plan, "attn", shape[3], 512, shape), "F16", progress)
        runs += [ProbeRun("F16", attn, plan.n_prompt, "attn"), ProbeRun("F16", attn, plan.n_long, "attn")]
    return runs
