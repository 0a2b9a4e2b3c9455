"""`bench --batch` output: the terminal table, and the --json / --csv / --md files.

JSON layout: {"record": {... as every bench, settings.batch added}, "batch": {"workload": {...},
"levels": [{n_seqs, output_tok_s, decode_tok_s, seq_decode_tok_s, itl_s: {p50, ...}, ttft_s,
predicted_decode_tok_s, ceiling_decode_tok_s, efficiency, scaling, slo, failures}], "knee",
"slo_max_seqs", "knee_share", "runs": [{n_seqs, repeat, status, reason, result: BatchGeneration}]}}.
CSV: one row per batch size.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ondevice.bench.batch import KNEE_SHARE, LevelSummary, SweepResult, SweepRun
from ondevice.bench.report import header_facts
from ondevice.bench.stats import clean
from ondevice.bench.suites import Workload
from ondevice.core.fmt import fold, ms_cell, number, table
from ondevice.core.paths import atomic_write

__all__ = [
    "HEADERS",
    "CSV_COLUMNS",
    "level_rows",
    "render_sweep",
    "sweep_document",
    "write_sweep_csv",
    "sweep_markdown",
]

HEADERS = (
    "B",
    "runs",
    "output tok/s",
    "decode tok/s",
    "pred tok/s",
    "eff",
    "per-seq tok/s",
    "ITL p50/p95 ms",
    "TTFT p50 ms",
    "scaling",
    "notes",
)
TERMINAL_DROP = ("runs", "scaling", "eff", "TTFT p50 ms")
CSV_COLUMNS = (
    "n_seqs",
    "runs",
    "ok_runs",
    "output_tok_s",
    "decode_tok_s",
    "seq_decode_tok_s",
    "itl_p50_s",
    "itl_p95_s",
    "itl_p99_s",
    "ttft_p50_s",
    "ttft_p95_s",
    "predicted_decode_tok_s",
    "ceiling_decode_tok_s",
    "efficiency",
    "scaling",
    "knee",
    "slo_passed",
    "slo_goodput",
    "failures",
)


def _notes(lv: LevelSummary, result: SweepResult) -> str:
    parts = []
    if lv.n_seqs == result.knee:
        parts.append("knee")
    if lv.slo is not None:
        parts.append(
            f"SLO {'pass' if lv.slo.passed else 'FAIL'}" + (" (largest B)" if lv.n_seqs == result.slo_max_seqs else "")
        )
    if lv.failures:
        parts.append(f"{len(lv.failures)} not ok: {lv.failures[0]}")
    return "; ".join(parts)


def level_rows(result: SweepResult) -> list[list[str]]:
    rows = []
    for lv in result.levels:
        rows.append(
            [
                str(lv.n_seqs),
                f"{lv.ok_runs}/{lv.runs}",
                number(lv.output_tok_s),
                number(lv.decode_tok_s),
                number(lv.predicted_decode_tok_s),
                number(lv.efficiency, ".2f"),
                number(lv.seq_decode_tok_s),
                f"{ms_cell(lv.itl_s.p50)}/{ms_cell(lv.itl_s.p95)}",
                ms_cell(lv.ttft_s.p50),
                number(lv.scaling, ".2f"),
                _notes(lv, result),
            ]
        )
    return rows


def _title(workload: Workload, record: dict[str, Any]) -> str:
    title = (
        f"ondevice bench --batch: {workload.prompt_tokens} prompt + {workload.output_tokens} output tokens per "
        f"sequence, end-of-generation ignored"
    )
    return title + (" (INCOMPLETE: interrupted)" if record.get("incomplete") else "")


def _legend(result: SweepResult) -> list[str]:
    knee = (
        (
            f"knee: B={result.knee} (the last B up to which each step in B gains at least {KNEE_SHARE:.0%} of "
            f"proportional aggregate decode tok/s)"
        )
        if result.knee is not None
        else "knee: needs two measured levels"
    )
    lines = [knee]
    if any(lv.slo is not None for lv in result.levels):
        lines.append(
            f"SLO: largest B meeting it: {result.slo_max_seqs}"
            if result.slo_max_seqs is not None
            else "SLO: no batch size meets it"
        )
    return lines


def render_sweep(record: dict[str, Any], workload: Workload, result: SweepResult, *, width: int | None = None) -> str:
    """The terminal report: the run's facts, the table (fitted to width), the knee and SLO lines."""
    facts = [fold(f"{k}: {v}", width) for k, v in header_facts(record)]
    align = "r" * (len(HEADERS) - 1) + "l"
    text = table(HEADERS, level_rows(result), align, width=width, drop=TERMINAL_DROP, full="--json/--csv/--md")
    lines = facts + ["", fold(_title(workload, record), width), text]
    return "\n".join(lines + [fold(x, width) for x in _legend(result)]) + "\n"


def sweep_document(
    record: dict[str, Any], workload: Workload, result: SweepResult, runs: Sequence[SweepRun]
) -> dict[str, Any]:
    """The --json document."""
    batch = {
        "workload": {
            "name": workload.name,
            "prompt_tokens": workload.prompt_tokens,
            "output_tokens": workload.output_tokens,
        },
        **result.to_dict(),
        "runs": [r.to_dict() for r in runs],
    }
    return clean({"record": record, "batch": batch})


def _csv_row(lv: dict[str, Any], knee: int | None) -> dict[str, Any]:
    slo = lv.get("slo") or {}
    itl, ttft = lv.get("itl_s") or {}, lv.get("ttft_s") or {}
    return {
        **{k: lv.get(k) for k in CSV_COLUMNS if k in lv and not isinstance(lv.get(k), (dict, list))},
        "itl_p50_s": itl.get("p50"),
        "itl_p95_s": itl.get("p95"),
        "itl_p99_s": itl.get("p99"),
        "ttft_p50_s": ttft.get("p50"),
        "ttft_p95_s": ttft.get("p95"),
        "knee": lv["n_seqs"] == knee,
        "slo_passed": slo.get("passed"),
        "slo_goodput": slo.get("goodput"),
        "failures": "; ".join(lv.get("failures") or ()),
    }


def write_sweep_csv(path: str | Path, doc: dict[str, Any]) -> None:
    """One row per batch size, from the --json document."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for lv in doc["batch"]["levels"]:
        row = _csv_row(lv, doc["batch"].get("knee"))
        w.writerow(["" if row.get(k) is None else row.get(k) for k in CSV_COLUMNS])
    with atomic_write(Path(path), "w") as f:
        f.write(buf.getvalue())


def sweep_markdown(record: dict[str, Any], workload: Workload, result: SweepResult) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731 - one escape, used in every table cell
    lines = [f"# {_title(workload, record)}", ""] + [f"- {k}: {esc(v)}" for k, v in header_facts(record)]
    lines += ["", "| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in level_rows(result)]
    return "\n".join(lines + [""] + _legend(result)) + "\n"
