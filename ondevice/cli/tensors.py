"""`ondevice info MODEL --tensors [--against SRC]`: one row per tensor (type, shape, bytes, bits per
weight), or each tensor's error against a source model."""

from __future__ import annotations

from pathlib import Path

from ondevice.cli.output import ProgressLine, dump_json, terminal_width
from ondevice.core.fmt import fold, number, table

__all__ = ["run_tensors"]


def run_tensors(model: Path, against: Path | None, as_json: bool) -> int:
    """`ondevice info MODEL --tensors [--against SRC]`: per-tensor types, and errors against a source."""
    from ondevice.gguf.reader import read_gguf
    from ondevice.quant.errstats import tensor_errors
    from ondevice.quant.formats import block_format

    if against is None:
        rows = [
            {
                "name": t.name,
                "type": t.type_name,
                "shape": list(t.shape),
                "n_elements": t.n_elements,
                "n_bytes": t.n_bytes,
                "bits_per_weight": block_format(t.ggml_type).bits_per_weight,
            }
            for t in read_gguf(model).tensors
        ]
        if as_json:
            dump_json({"path": str(model), "tensors": rows})
        else:
            print(
                table(
                    ["tensor", "type", "shape", "bytes", "bpw"],
                    [
                        [
                            r["name"],
                            r["type"],
                            "x".join(map(str, r["shape"])),
                            r["n_bytes"],
                            f"{r['bits_per_weight']:.2f}",
                        ]
                        for r in rows
                    ],
                    align="lllrr",
                    width=terminal_width(),
                    drop=("shape",),
                    full="--json",
                )
            )
        return 0
    line = ProgressLine(not as_json)
    try:
        errors = tensor_errors(model, against, progress=lambda d, n: line(f"comparing tensors: {d}/{n}"))
    finally:
        line.done()
    if as_json:
        dump_json({"path": str(model), "against": str(against), "tensors": [e.to_dict() for e in errors]})
        return 0
    error_rows = [
        [
            e.name,
            f"{e.source_type}->{e.type_name}",
            "x".join(map(str, e.shape)),
            f"{e.bits_per_weight:.2f}",
            number(e.rmse, ".3e"),
            number(e.max_abs_error, ".3e"),
            number(None if e.rel_rmse is None else 100 * e.rel_rmse, ".3f"),
        ]
        for e in errors
    ]
    print(
        table(
            ["tensor", "type", "shape", "bpw", "RMSE", "max abs err", "rel RMSE %"],
            error_rows,
            align="lllrrrr",
            width=terminal_width(),
            drop=("shape", "max abs err"),
            full="--json",
        )
    )
    print(
        fold(
            f"  {model} against {against}; rel RMSE = RMSE / RMS of the source tensor", terminal_width(), indent="    "
        )
    )
    return 0
