"""`ondevice info [MODEL] [--json]`: a GGUF file inspected, without loading it."""

from __future__ import annotations

from ondevice.cli.output import dump_json, terminal_width
from ondevice.core.fmt import fold_lines, human_bytes, human_count, layer_ranges, table
from ondevice.core.textclean import printable
from ondevice.gguf.spec import ModelSpec, inspect
from ondevice.models.materialize import resolve_model


def register(sub) -> None:
    p = sub.add_parser("info", help="inspect a GGUF model (default: the built-in model)")
    p.add_argument("model", nargs="?", help="registry name or path to a .gguf file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--tensors", action="store_true", help="one row per tensor: type, shape, bytes, bits per weight")
    p.add_argument(
        "--against", metavar="SRC", help="with --tensors: each tensor's error (RMSE, max abs) against source model SRC"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    if args.tensors or args.against:
        from ondevice.cli.tensors import run_tensors

        return run_tensors(resolve_model(args.model), resolve_model(args.against) if args.against else None, args.json)
    spec = inspect(resolve_model(args.model))
    buffers = cpu_buffers(spec)
    if args.json:
        dump_json({**spec.to_dict(), "cpu_buffers": buffers})
    else:
        print(render(spec, buffers, width=terminal_width()))
    return 0


def cpu_buffers(spec: ModelSpec) -> dict:
    """Where this machine's loads put the model's CPU-side weights (the crash guard's verdict)."""
    from ondevice.llama.guard import cpu_buffer_verdict
    from ondevice.llama.model import repack_plan

    verdict = cpu_buffer_verdict()
    named = len(repack_plan(spec.path)) if verdict.mode == "repack" and spec.path else None
    return {"mode": verdict.mode, "source": verdict.source, "reason": verdict.reason, "repacked_tensors": named}


def render(s: ModelSpec, buffers: dict | None = None, *, width: int | None = None) -> str:
    lines = [printable(str(s.path)) + (f"  ({printable(s.name)})" if s.name else "")]  # names come from the file

    def row(label: str, value: object) -> None:
        lines.append(f"  {label:<16}{value}")

    row("architecture", s.arch or "unknown")
    if not s.has_weights:
        row("weights", "none: this file holds no tensors (vocab-only)")
        row("tokenizer", f"{s.tokenizer_model or 'unknown'}, {s.n_vocab or '?'} tokens")
        lines += [f"  note: {w}" for w in s.warnings]
        return fold_lines("\n".join(lines), width)
    row("quant", f"{s.quant or 'unknown'}, {s.bits_per_weight:.2f} bits per weight")
    active = f" ({human_count(s.n_params_active)} active)" if s.n_params_active != s.n_params else ""
    row("parameters", human_count(s.n_params) + active)
    attends = s.attention_layers
    hybrid = f" ({len(attends)} attend: {layer_ranges(attends) or 'none'}; the rest recurrent, no KV cache)"
    row("layers", f"{s.n_layer}{hybrid if len(attends) < (s.n_layer or 0) else ''}" if s.n_layer else "unknown")
    row("d_model", s.d_model or "unknown")
    row(
        "heads",
        f"{s.n_head or '?'} query, {s.n_head_kv or '?'} KV; head dim K {s.head_dim_k or '?'}, V {s.head_dim_v or '?'}",
    )
    row("context", f"{s.n_ctx_train or '?'} tokens trained")
    row("vocabulary", f"{s.n_vocab or '?'} tokens ({s.tokenizer_model or 'unknown'} tokenizer)")
    if s.sliding_window:
        row(
            "sliding window",
            f"{s.sliding_window} tokens on {len(s.swa_layers)} of {s.n_layer} layers ({layer_ranges(s.swa_layers)})",
        )
    else:
        row("sliding window", "none")
    row("experts", f"{s.n_expert} ({s.n_expert_used} used per token)" if s.n_expert else "none (dense)")
    row("output head", "tied to token_embd" if s.tied_output else "separate output.weight")
    row("chat template", "yes" if s.has_chat_template else "none")
    row(
        "file",
        f"{human_bytes(s.file_bytes)} ({s.file_bytes} B = header {s.header_bytes} + tensors {s.weight_bytes} + "
        f"padding {s.padding_bytes})",
    )
    row("weights", f"{human_bytes(s.weight_bytes)} ({s.n_tensors} tensors)")
    row("decode reads", f"{human_bytes(s.decode_weight_bytes)} of weights per token")
    kv_types = (
        s.kv_cache_types[0] if len(set(s.kv_cache_types)) == 1 else f"{s.kv_cache_types[0]} K, {s.kv_cache_types[1]} V"
    )
    row(
        "KV cache",
        f"{s.kv_bytes_per_token} B per token ({kv_types}); {human_bytes(s.kv_read_bytes(s.n_ctx_train or 0))} at the "
        "full trained context",
    )
    if s.state_bytes:
        row("recurrent state", f"{human_bytes(s.state_bytes)} a sequence (f32), read every decode step")
    if buffers:
        named = (
            f"; {buffers['repacked_tensors']} weights to CPU_REPACK" if buffers["repacked_tensors"] is not None else ""
        )
        row("CPU buffers", f"{buffers['mode']} on this machine ({buffers['source']}: {buffers['reason']}){named}")
    lines += [f"  note: {w}" for w in s.warnings]
    lines.append("")
    rows = [
        [t, b, f"{100 * b / s.weight_bytes:.1f}%", s.decode_bytes_by_type.get(t, 0)] for t, b in s.bytes_by_type.items()
    ]
    lines.append(table(["type", "bytes", "share", "decode bytes"], rows, align="lrrr", width=width, full="--json"))
    return fold_lines("\n".join(lines), width)
