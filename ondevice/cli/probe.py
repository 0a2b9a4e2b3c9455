"""`ondevice probe [--json] [--refresh]`: this machine's memory, compute and kernel speeds."""

from __future__ import annotations

import sys

from ondevice.cli.output import dump_json, terminal_width
from ondevice.core.fmt import fold_lines, human_bytes, number, score_table, table

__all__ = ["register", "run", "render", "age_text", "cpu_buffers_text", "disk_text"]


def register(sub) -> None:
    p = sub.add_parser("probe", help="measure this machine: memory bandwidth, compute, llama.cpp kernels (cached)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--refresh", action="store_true", help="measure again instead of showing the cached result")
    p.add_argument(
        "--no-kernel",
        dest="kernel",
        action="store_false",
        help="skip the llama.cpp kernel probe (host probe only; no calibrated predictions)",
    )
    p.add_argument("--backend", help="backend to probe (default: the one the engine uses, e.g. CPU, CUDA, Metal)")
    p.add_argument("--threads", type=int, help="threads (default: one per physical core)")
    p.set_defaults(func=run)


def _progress(msg: str) -> None:
    print(f"probing: {msg}", file=sys.stderr, flush=True)


def _waiting_only(msg: str) -> None:
    """--json: stdout is the document; stderr still says when this probe waits for another."""
    from ondevice.probing import WAITING

    if msg.startswith(WAITING):
        _progress(msg)


def run(args) -> int:
    from ondevice.core.errors import InvalidParameterError
    from ondevice.probing import probe

    if args.threads is not None and args.threads < 1:
        raise InvalidParameterError(f"--threads must be at least 1, not {args.threads}")
    if args.refresh:  # the native self-test runs again too
        from ondevice.llama.guard import forget_verdict

        forget_verdict()
    result = probe(
        refresh=args.refresh,
        kernel=args.kernel,
        backend=args.backend,
        n_threads=args.threads,
        progress=_waiting_only if args.json else _progress,
    )
    if args.json:
        d = result.to_dict()
        d["age_s"] = result.age_s
        d["from_cache"] = result.from_cache
        d["cpu_buffers"] = cpu_buffers_text()
        dump_json(d)
    else:
        print(render(result, width=terminal_width()))
    return 0


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


def age_text(seconds: float) -> str:
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n != 1 else ''} ago"
    return "just now"


READ_KERNELS = {"memchr": "libc memchr", "numpy-sum": "numpy sum"}  # MemoryProbe.read_kernel, as the report names it


def render(r, *, width: int | None = None) -> str:
    h, m, c, k = r.host, r.memory, r.compute, r.kernel
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
    lines.append(f"host compute: {c.f32_gflops:.1f} GFLOP/s f32 ({c.matrix_n}x{c.matrix_n} matrix product)")
    lines.append(disk_text(r.disk))
    lines.append("")
    if k is None:
        lines.append("kernels: not probed (run `ondevice probe --refresh` without --no-kernel)")
    else:
        lines.append(
            f"llama.cpp decode kernels on {k.backend}, {k.n_threads} threads, CPU buffers {k.cpu_buffers} "
            f"({len(k.points)} runs of synthetic models, fit error {100 * k.fit_rms_rel:.1f}% rms):"
        )
        rows = [
            [t, f"{g:.1f}", f"{100 * g / m.read_gbs:.0f}%", number(k.type_cached_gbs.get(t))]
            for t, g in k.type_gbs.items()
        ]
        lines.append(
            "  "
            + table(
                ["weights", "GB/s", "of host read", "from cache GB/s"],
                rows,
                align="lrrr",
                width=None if width is None else width - 2,
                full="--json",
            ).replace("\n", "\n  ")
        )
        lines.append(
            f"  fixed cost per token {1e3 * k.t0_s:.3f} ms, per layer {1e6 * k.layer_s:.1f} us, "
            f"per vocabulary entry {1e9 * k.vocab_s:.2f} ns, per matrix row {1e9 * k.row_s:.2f} ns,"
        )
        lines.append(f"  per attention score (query head x cached token x layer), {score_table(k.attn_score_s)}")
        if k.type_gflops:
            lines.append(
                "  prefill (batched) "
                + ", ".join(f"{t} {g:.0f}" for t, g in k.type_gflops.items())
                + " GFLOP/s"
                + (f"; attention {k.attn_gflops:.0f} GFLOP/s" if k.attn_gflops else "")
                + f"; per matrix row and token {1e9 * k.batch_row_s:.2f} ns"
                + (f" (rows under {k.batch_row_width:.0f} weights)" if k.batch_row_width else "")
            )
        from ondevice.roofline.prediction import POOR_FIT

        if k.fit_rms_rel > POOR_FIT:
            lines.append(
                f"  the fit is POOR ({100 * k.fit_rms_rel:.0f}% rms): predictions from it are uncertain by about "
                "that much; probe again when the machine is quiet (`ondevice probe --refresh`)"
            )
        if k.pass_spread > 0.05:
            lines.append(
                f"  passes differed by {100 * k.pass_spread:.0f}% (median over the large models): this machine's "
                "speed moves about that much, and so will measurements against the prediction"
            )
    lines.append("")
    if r.read_curve:
        lines.append(
            "read bandwidth by working-set size (what the caches add): "
            + ", ".join(f"{human_bytes(b)} {g:.0f}" for b, g in r.read_curve)
            + " GB/s"
        )
    lines.append(f"ceiling bandwidth (pure roofline bound): {r.ceiling_gbs:.1f} GB/s")
    if r.nameplate:
        n = r.nameplate
        ratio = f"; best measured is {100 * r.ceiling_gbs / n.bandwidth_gbs:.0f}% of it" if n.bandwidth_gbs else ""
        note = f" ({n.note})" if n.note else ""
        lines.append(f"nameplate for {n.chip}: {n.bandwidth_gbs:g} GB/s (maker's figure, not measured){note}{ratio}")
    else:
        lines.append("nameplate: none known for this machine's memory")
    return fold_lines("\n".join(lines), width)
