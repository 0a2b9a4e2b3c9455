"""`ondevice probe [MODEL] [--json] [--refresh]`: this machine (memory, compute, caches, disk) and a model's
shape timed on it (the default model unless named)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from ondevice.cli.output import dump_json, terminal_width
from ondevice.cli.progress import StatusLine
from ondevice.core.fmt import age_text, fold_lines, human_bytes, millis

if TYPE_CHECKING:
    from ondevice.roofline import ShapeTiming

__all__ = ["register", "run", "render", "render_timing", "cpu_buffers_text", "disk_text"]


def register(sub) -> None:
    p = sub.add_parser(
        "probe", help="measure this machine (memory bandwidth, compute, caches, disk) and time a model on it (cached)"
    )
    p.add_argument("model", nargs="?", help="the model to time: registry name or .gguf path (default: the built-in)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--refresh", action="store_true", help="measure again instead of showing the cached results")
    p.add_argument("--no-model", dest="time_model", action="store_false", help="the host probe only: time no model")
    p.add_argument("--backend", help="backend to probe (default: the one the engine uses, e.g. CPU, CUDA, Metal)")
    p.add_argument("--threads", type=int, help="threads (default: one per physical core)")
    p.set_defaults(func=run)


def _waiting_only(msg: str) -> None:
    """--json: stdout is the document; stderr still says when this probe waits for another."""
    from ondevice.probing import WAITING

    if msg.startswith(WAITING):
        print(f"probing: {msg}", file=sys.stderr, flush=True)


def run(args) -> int:
    from ondevice.core.errors import InvalidParameterError
    from ondevice.probing import probe

    if args.threads is not None and args.threads < 1:
        raise InvalidParameterError(f"--threads must be at least 1, not {args.threads}")
    if args.model and not args.time_model:
        raise InvalidParameterError("give a MODEL to time or --no-model, not both")
    if args.refresh:  # the native self-test runs again too
        from ondevice.llama.guard import forget_verdict

        forget_verdict()
    status = None if args.json else StatusLine("probing")  # one line rewritten on a terminal; a log gets each line
    say = _waiting_only if status is None else status
    try:
        result = probe(refresh=args.refresh, backend=args.backend, n_threads=args.threads, progress=say)
        timed = _time_model(args, say) if args.time_model else None
    finally:
        if status is not None:
            status.close()
    if args.json:
        d = result.to_dict()
        d.update(age_s=result.age_s, from_cache=result.from_cache, cpu_buffers=cpu_buffers_text())
        d["model"] = timed[0] if timed is not None else None
        d["timing"] = timed[1].to_dict() if timed is not None else None
        dump_json(d)
    else:
        text = render(result, width=terminal_width())
        if timed is not None:
            text += "\n\n" + render_timing(*timed)
        print(text)
    return 0


def _time_model(args, say) -> tuple[str, ShapeTiming]:
    """(model file name, its ShapeTiming on this machine: cached unless --refresh, else timed now)."""
    from ondevice.cli.progress import resolve_model_with_bar
    from ondevice.engine import load
    from ondevice.probing import timing_for

    engine = load(resolve_model_with_bar(args.model), n_threads=args.threads)
    try:
        return engine.info.model_path.rsplit("/", 1)[-1], timing_for(engine, progress=say, refresh=args.refresh)
    finally:
        engine.close()


def render_timing(model: str, t: ShapeTiming) -> str:
    """A model's timing in words: its decode steps, prefill chunks and batch steps, and how it was timed."""
    how = {"model": "its own file", "twin": "its twin", "twins": f"twins of {' and '.join(map(str, t.layers))} layers"}
    lines = [
        f"{model} timed on this machine ({how.get(t.source, t.source)}, {t.plan} plan) in {t.elapsed_s:.1f} s; "
        f"other processes used {t.other_cpu_cores:.1f} cores, rounds {100 * t.spread:.0f}% apart:"
    ]
    lines.append(
        "  decode: "
        + ", ".join(f"{millis(s)} a step at {n} tokens of context ({1 / s:.1f} tok/s)" for n, s in t.decode)
    )
    empty = [(k, s) for pos, k, s in t.prefill if pos == 0]
    lines.append("  prefill from an empty cache: " + ", ".join(f"{k} tokens {millis(s)}" for k, s in empty))
    for pos, k, s in t.prefill:
        if pos:
            lines.append(f"  a chunk of {k} tokens after {pos} cached: {millis(s)}")
    if t.batch:
        lines.append(
            f"  batched decode steps at {t.batch_ctx} tokens of context: "
            + ", ".join(f"{b} sequences {millis(s)}" for b, s in t.batch)
        )
    return "\n".join(lines)


def cpu_buffers_text() -> str:
    """The crash guard's verdict in a line: which extra CPU buffer types loads use here, and why."""
    from ondevice.llama.guard import cpu_buffer_verdict

    return cpu_buffer_verdict().label


def disk_text(d) -> str:
    """The disk read probe in a line (what a cold start reads the model file at)."""
    if d is None:
        return "disk read: not measured (`ondevice probe --refresh` measures it; cold-start predictions need it)"
    if d.read_gbs is None:
        return f"disk read: no figure: {d.note}"
    return (
        f"disk read: {d.read_gbs:.2f} GB/s sequential, page cache dropped ({human_bytes(d.file_bytes)} file in "
        f"{d.folder}, best of {d.passes})"
    )


READ_KERNELS = {"memchr": "libc memchr", "numpy-sum": "numpy sum"}  # MemoryProbe.read_kernel, as the report names it


def render(r, *, width: int | None = None) -> str:
    h, m, c = r.host, r.memory, r.compute
    when = f"measured {age_text(r.age_s)}" + (" (cached; --refresh to measure again)" if r.from_cache else "")
    lines = [f"this machine, backend {r.backend}: {when}"]

    def row(label: str, value: object) -> None:
        lines.append(f"  {label:<12}{value}")

    cores = f"{h.physical_cores or '?'} cores / {h.logical_cores or '?'} threads"
    row("host", f"{h.os} {h.machine}; {h.cpu_model or 'CPU unknown'}; {cores}")
    row(
        "memory",
        f"{human_bytes(h.ram_total_bytes)} RAM ({human_bytes(h.ram_available_bytes)} available); "
        f"last-level cache {human_bytes(h.llc_bytes) if h.llc_bytes else 'unknown'}",
    )
    if h.apple_chip:
        row("chip", f"{h.apple_chip} (unified memory)")
    for g in h.gpus:
        if g.vendor != "Apple":
            row("GPU", f"{g.name}, {human_bytes(g.vram_total_bytes)} VRAM ({human_bytes(g.vram_free_bytes)} free)")
    row("llama.cpp", f"{h.llama_cpp_version or 'unknown'}; backends {', '.join(h.llama_backends) or 'unknown'}")
    row("CPU buffers", cpu_buffers_text())
    for d in h.llama_devices:
        mem = f", {human_bytes(d.memory_total_bytes)}" if d.memory_total_bytes and d.kind != "CPU" else ""
        row("device", f"{d.name} ({d.kind}): {d.description}{mem}")
    lines += [f"  note: {w}" for w in h.warnings]
    lines.append("")
    lines.append(f"host memory, {m.n_threads} threads over {human_bytes(m.array_bytes)} arrays (best of {m.passes}):")
    lines.append(
        f"  read {m.read_gbs:.1f} GB/s ({READ_KERNELS.get(m.read_kernel, m.read_kernel)})   copy {m.copy_gbs:.1f} GB/s"
        "   (bytes counted as STREAM counts them)"
    )
    if c is not None:
        lines.append(f"host compute: {c.f32_gflops:.1f} GFLOP/s f32 ({c.matrix_n}x{c.matrix_n} matrix product)")
    else:
        lines.append("host compute, caches, disk: not measured yet (the first-run probe; `ondevice probe --refresh`)")
    lines.append(disk_text(r.disk))
    if r.read_curve:
        lines.append(
            "read bandwidth by working-set size (what the caches add): "
            + ", ".join(f"{human_bytes(b)} {g:.0f}" for b, g in r.read_curve)
            + " GB/s"
        )
    lines.append(f"ceiling bandwidth (the roofline's bound): {r.ceiling_gbs:.1f} GB/s")
    if r.nameplate:
        n = r.nameplate
        ratio = f"; best measured is {100 * r.ceiling_gbs / n.bandwidth_gbs:.0f}% of it" if n.bandwidth_gbs else ""
        note = f" ({n.note})" if n.note else ""
        lines.append(f"nameplate for {n.chip}: {n.bandwidth_gbs:g} GB/s (maker's figure, not measured){note}{ratio}")
    else:
        lines.append("nameplate: none known for this machine's memory")
    return fold_lines("\n".join(lines), width)
