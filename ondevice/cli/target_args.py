"""`ondevice predict` flags for a machine you do not have: --device, --backend, --compute, --memory,
--unified; and the lines that show the estimate beside the bound.

--device NAME (as the driver or "About This Mac" prints it: "RTX 4070", "M2 Max", "RX 7900 XTX")
fills what the nameplate tables know: bandwidth, peak FP16, unified memory or VRAM, and the backend
llama.cpp users usually run it with (Metal on Apple, CUDA on NVIDIA, ROCm on AMD; --backend Vulkan
for the Vulkan build). Flags given win over the table.
"""

from __future__ import annotations

from ondevice.core.fmt import binary_bytes, human_bytes

__all__ = ["add_target_args", "target_from_args", "estimate_lines", "memory_where_text"]

_FLAGS = ("device", "backend", "compute", "memory")


def add_target_args(p) -> None:
    g = p.add_argument_group("another machine (with --bandwidth or a known --device)")
    g.add_argument("--device", help='GPU or chip, e.g. "RTX 4070", "M2 Max": fills bandwidth, compute, memory kind')
    g.add_argument(
        "--backend", help="llama.cpp backend there: CUDA, Metal, ROCm, Vulkan, CPU (picks the estimate's fit)"
    )
    g.add_argument("--compute", type=float, metavar="TFLOPS", help="peak FP16 TFLOPS there (the TTFT floor)")
    g.add_argument(
        "--memory",
        type=float,
        metavar="GB",
        help="its VRAM (or unified memory) as the maker labels it: 12 for a 12 GB card",
    )
    g.add_argument("--unified", action="store_true", help="memory is unified (the GPU may use 75%% of it)")


def target_from_args(args):
    """(Target or None, bandwidth GB/s or None). None: no flag describes another machine."""
    from ondevice.core.errors import InvalidParameterError
    from ondevice.probing.nameplate import compute_lookup, default_backend, lookup, unified_memory
    from ondevice.roofline.target import make_target

    if not any(getattr(args, f, None) is not None for f in _FLAGS) and not getattr(args, "unified", False):
        return None, args.bandwidth
    bandwidth = args.bandwidth
    if args.device is not None:
        plate = lookup(args.device)
        if plate is None and bandwidth is None:
            raise InvalidParameterError(
                f"--device {args.device!r} is not in the nameplate table: give --bandwidth "
                "(and --compute, --memory) for it"
            )
        bandwidth = bandwidth if bandwidth is not None else plate.bandwidth_gbs
    elif bandwidth is None:
        raise InvalidParameterError(
            "--backend/--compute/--memory/--unified describe another machine: "
            "give its --bandwidth GB/s or a known --device"
        )
    target = make_target(
        backend=args.backend,
        device=args.device,
        compute_tflops=args.compute,
        memory_gb=args.memory,
        unified=args.unified,
        device_compute=compute_lookup(args.device),
        device_unified=unified_memory(args.device),
        device_backend=default_backend(args.device),
    )
    return target, bandwidth


def memory_where_text(m, target) -> str:
    """'12.0 GiB VRAM available' or '12.0 GiB unified memory available (75% of 16.0 GiB)'."""
    if not m.available_bytes:
        hint = " (give --memory GB)" if target is not None else ""
        return f"{m.where} unknown{hint}"
    if target is None:  # this machine: decimal, as the rest of the report
        return f"{human_bytes(m.available_bytes)} {m.where} available"
    text = f"{binary_bytes(m.available_bytes)} {m.where} available"  # another machine's: as its maker labels it
    total = getattr(target, "memory_total_bytes", None)
    if total and total != m.available_bytes:
        text += f" ({m.available_bytes / total:.0%} of {binary_bytes(total)}, what the GPU may use)"
    return text


def estimate_lines(p) -> list[str]:
    """The estimate beside the bound, for the first context (the table has one per context)."""
    if not p.estimates:
        return []
    e, c = p.estimates[0], p.contexts[0]
    return [
        f"estimated {e.tok_s:.1f} tok/s (range {e.low_tok_s:.1f}–{e.high_tok_s:.1f}) at {c.n_ctx} tokens of "
        f"context, {e.efficiency:.0%} of the {c.ceiling_tok_s:.1f} tok/s bound",
        f"  estimate: {e.basis}; range: 10th–90th percentile of the fit's leave-one-out error",
    ]
