"""`ondevice twin ([MODEL] | --config CONFIG.json [--quant TYPE]) OUT.gguf [--layers N] [--force]`: write a
model's twin, its header with valid random data (ondevice.quant.twin), to time how fast it runs here.
No MODEL and no --config: the default model's twin."""

from __future__ import annotations

import time
from pathlib import Path

from ondevice.cli.output import dump_json
from ondevice.core.errors import InvalidParameterError
from ondevice.core.fmt import human_bytes

__all__ = ["register"]


def register(sub) -> None:
    p = sub.add_parser(
        "twin",
        help="write a model's twin: its architecture, metadata and tensors with random data (times like the model)",
    )
    p.add_argument(
        "model", nargs="?", help="registry name or .gguf path whose header is copied (default: the built-in model)"
    )
    p.add_argument("out", help="output .gguf path")
    p.add_argument("--config", metavar="CONFIG.json", help="a Hugging Face config.json instead of MODEL")
    p.add_argument("--quant", metavar="TYPE", help="file type of a --config twin: Q4_K_M, Q8_0, ... (default F16)")
    p.add_argument(
        "--layers", type=int, metavar="N", help="keep N blocks, their types matched to the whole model's mix"
    )
    p.add_argument("--seed", type=int, default=0, help="random data seed (default 0)")
    p.add_argument("--sparse", action="store_true", help="header only: the data region left a hole of its full size")
    p.add_argument(
        "--force",
        action="store_true",
        help="overwrite an existing OUT (refused without it; a directory or special file always)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args) -> int:
    from ondevice.core.paths import check_destination
    from ondevice.quant.twin import matching_blocks, reduce_layers, shape_key, write_twin

    if args.model is not None and args.config is not None:
        raise InvalidParameterError("give MODEL or --config CONFIG.json, not both")
    if args.quant and not args.config:
        raise InvalidParameterError("--quant goes with --config (a model's twin keeps the model's own types)")
    out = check_destination(Path(args.out), force=args.force)  # before any work
    t0 = time.perf_counter()
    header = _header(args)
    full_layers = header.n_layer
    if args.layers is not None:
        if not 1 <= args.layers <= full_layers:
            raise InvalidParameterError(f"--layers must be 1..{full_layers} for this model, not {args.layers}")
        header = reduce_layers(header, args.layers, matching_blocks(header, args.layers))
    write_twin(header, out, seed=args.seed, sparse=args.sparse)
    elapsed = time.perf_counter() - t0
    size = out.stat().st_size
    if args.json:
        dump_json(
            {
                "out": str(out),
                "arch": header.arch,
                "layers": header.n_layer,
                "model_layers": full_layers,
                "bytes": size,
                "shape_key": shape_key(header),
                "sparse": args.sparse,
                "seconds": elapsed,
            }
        )
        return 0
    print(
        f"wrote {out}: {header.arch}, {header.n_layer} of {full_layers} blocks, {human_bytes(size)}"
        f"{' (sparse)' if args.sparse else ''}, shape key {shape_key(header)}, in {elapsed:.1f} s"
    )
    return 0


def _header(args):
    from ondevice.models.materialize import resolve_model
    from ondevice.quant.hfconfig import header_from_hf_config
    from ondevice.quant.twin import quantized_header, read_header

    if args.config:
        header = header_from_hf_config(Path(args.config))
        return quantized_header(header, args.quant) if args.quant else header
    return read_header(resolve_model(args.model))
