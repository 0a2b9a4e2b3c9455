"""The engine settings `run`, `chat` and `bench` share (llama.cpp's names and defaults), and
the KV cache types `predict` also takes: one place that adds the flags and reads them back."""

from __future__ import annotations

import argparse
from typing import Any

from ondevice.core.errors import InvalidParameterError
from ondevice.core.kvtypes import DEFAULT_KV_TYPE, KV_CACHE_TYPES

__all__ = [
    "add_engine_args",
    "add_kv_cache_args",
    "add_fit_arg",
    "add_retime_arg",
    "engine_kwargs",
    "settings_text",
    "say_fit",
]

_FLASH = {"auto": "auto", "on": True, "off": False}


def add_kv_cache_args(p: argparse.ArgumentParser) -> None:
    types = ", ".join(KV_CACHE_TYPES)
    p.add_argument(
        "-ctk",
        "--cache-type-k",
        default=DEFAULT_KV_TYPE,
        type=str.lower,
        choices=KV_CACHE_TYPES,
        metavar="TYPE",
        help=f"K cache element type: {types} (default {DEFAULT_KV_TYPE})",
    )
    p.add_argument(
        "-ctv",
        "--cache-type-v",
        default=DEFAULT_KV_TYPE,
        type=str.lower,
        choices=KV_CACHE_TYPES,
        metavar="TYPE",
        help=f"V cache element type (a quantized one needs flash attention; default {DEFAULT_KV_TYPE})",
    )


def add_retime_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--retime",
        action="store_true",
        help="time the model here again before it runs, instead of using its cached timing "
        "(when runs keep missing their prediction one way: the machine's speed has moved)",
    )


def add_engine_args(p: argparse.ArgumentParser) -> None:
    """--flash-attn, --n-batch, --n-ubatch and the KV cache types, as llama.cpp names and defaults them."""
    p.add_argument(
        "-fa",
        "--flash-attn",
        nargs="?",
        const="on",
        default="auto",
        type=str.lower,
        choices=tuple(_FLASH),
        help="flash attention: auto (llama.cpp's default: on where the backend has it), on, off",
    )
    p.add_argument(
        "-b",
        "--n-batch",
        type=int,
        default=None,
        help="prompt tokens per llama_decode call (default: llama.cpp's 2048, at most the context)",
    )
    p.add_argument(
        "-ub",
        "--n-ubatch",
        type=int,
        default=None,
        help="tokens per compute pass inside a call (default: llama.cpp's 512)",
    )
    add_kv_cache_args(p)
    add_fit_arg(p)


def add_fit_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fit",
        action="store_true",
        help="choose the largest context (up to -c, else the trained one) and, on a GPU, the most offloaded layers "
        "that fit the free memory with a 10%% margin, and say what was chosen and why",
    )


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The load() keyword arguments these flags give."""
    for name in ("n_batch", "n_ubatch"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InvalidParameterError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
    return {
        "flash_attn": _FLASH[args.flash_attn],
        "n_batch": args.n_batch,
        "n_ubatch": args.n_ubatch,
        "cache_type_k": args.cache_type_k,
        "cache_type_v": args.cache_type_v,
        "fit": bool(getattr(args, "fit", False)),
    }


def settings_text(info: Any) -> str:
    """The settings an engine runs with, for the run line:
    "batch 2048/512, flash attn on, KV f16/f16, CPU buffers repack"."""
    fa = {True: "on", False: "off", None: str(info.flash_attn)}[info.flash_attn_used]
    return (
        f"batch {info.n_batch}/{info.n_ubatch}, flash attn {fa}, KV {info.cache_type_k}/{info.cache_type_v}, "
        f"CPU buffers {info.cpu_buffers}"
    )


def say_fit(info: Any) -> None:
    """One line on stderr: what --fit chose and why (nothing without --fit)."""
    import sys

    if getattr(info, "fit_reason", ""):
        print(f"ondevice: --fit: {info.fit_reason}", file=sys.stderr, flush=True)
