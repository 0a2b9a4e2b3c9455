"""Bench output: a terminal table (fitted to the terminal) and --json / --csv / --md files.

The library renders strings and writes files atomically; only the CLI prints.
JSON layout: {"record": {...}, "results": [{"model", "scenario", "prompt_tokens",
"output_tokens", "repeats", "ttft_s": {p50, p95, p99, mean, std, min, max, n}, "itl_s", "tpot_s",
"e2e_s", "prefill_tok_s", "decode_tok_s", "ceiling_tok_s", "predicted_tok_s", "efficiency", "predicted_ttft_s",
"ttft_efficiency", "predicted_e2e_s",
"failures": [...], "runs": [... each with its per-token "itl_s" trace]}]}.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ondevice.bench import coldstart
from ondevice.bench.restore import RESTORE_HEADERS, restore_rows, restore_table
from ondevice.bench.rows import HEADERS, cold_notes, header_facts, table_rows
from ondevice.bench.speculative import SPEC_HEADERS, spec_rows, spec_table
from ondevice.bench.stats import EXTRA_METRICS, METRICS, ScenarioResult, clean
from ondevice.core import paths
from ondevice.core.fmt import fold, table
from ondevice.core.paths import atomic_write

__all__ = [
    "result_document",
    "write_json",
    "keep_unsaved",
    "write_csv",
    "write_markdown",
    "render_table",
    "table_rows",
    "HEADERS",
    "header_facts",
]

_STATS = ("n", "p50", "p95", "p99", "mean", "std", "min", "max")
_TEXT_COLUMNS = ("model", "scenario", "workload", "notes")
# What a narrow terminal leaves out first (the files keep everything): the token counts the
# workload names, the roofline, prefill speed, efficiency, TPOT (ITL p50 is beside it), runs.
TERMINAL_DROP = (
    "P",
    "N",
    "out tok/s",
    "E2E p50/pred s",
    "ceiling/pred tok/s",
    "prefill tok/s",
    "TTFT eff",
    "eff",
    "TPOT p50 ms",
    "runs",
    "TTFT pred ms",
)
_COLD_COLS = ("total_s", "read_s", "load_overhead_s", "ttft_s", "disk_read_gbs")  # of "cold_start_predicted"
_SPEC_COLS = (
    "exact",
    "agreement",
    "acceptance",
    "mean_accepted_per_step",
    "drafts_per_step",
    "k_cap",
    "plain_decode_tok_s",
    "spec_decode_tok_s",
    "speedup_p50",
    "predicted_speedup_p50",
    "speedup_at_acceptance_p50",
    "burst_share",
)  # the speculative scenario's, from "speculative"
_RESTORE_COLS = (
    "history_tokens",
    "turn_tokens",
    "state_bytes",
    "load_state_s",
    "restore_ttft_s",
    "predicted_restore_s",
    "hit_ttft_s",
    "predicted_hit_s",
    "recompute_ttft_s",
    "predicted_recompute_s",
    "disk_read_gbs",
    "restore_over_hit",
    "choice",
    "measured_runs",
    "restore_faster_runs",
    "choice_right_runs",
    "judged_runs",
)  # the restore scenario's, from "restore"
_LOAD_COLS = (
    "offered",
    "sent",
    "achieved_rps",
    "arrival_rps",
    "mean_in_flight",
    "little_lw",
    "little_ratio",
    "goodput_rps",
    "output_tok_s",
)  # server levels (bench --url), from each result's "load"


def result_document(
    record: dict[str, Any], results: Sequence[ScenarioResult], slo: dict | None = None, load: dict | None = None
) -> dict[str, Any]:
    """The --json document. slo: (model, scenario, workload) -> SloResult; load: the same keys ->
    LevelStats of server levels (bench --url)."""
    rows = []
    for r in results:
        d = r.to_dict()
        s = (slo or {}).get((r.model, r.scenario, r.workload))
        if s is not None:
            d["slo"] = s.to_dict()
        lv = (load or {}).get((r.model, r.scenario, r.workload))
        if lv is not None:
            d["load"] = lv.to_dict()
        rows.append(d)
    return clean({"record": record, "results": rows})


def write_json(path: str | Path, doc: dict[str, Any]) -> None:
    with atomic_write(Path(path), "w") as f:
        json.dump(doc, f, indent=1, allow_nan=False)
        f.write("\n")


def keep_unsaved(doc: dict[str, Any]) -> Path:
    """Write the --json document to <cache dir>/bench/unsaved/ (when the file asked for could
    not be written) and return its path."""
    name = f"bench-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
    path = paths.cache_dir() / "bench" / "unsaved" / name
    write_json(path, doc)
    return path


def _csv_header() -> list[str]:
    cols = ["model", "scenario", "workload", "prompt_tokens", "output_tokens", "repeats", "ok_runs"]
    for m in METRICS + ("load_s", "ttft_saved_s"):
        cols += [f"{m}_{s}" for s in _STATS]
    for m in EXTRA_METRICS:
        cols += [f"{m}_{s}" for s in _STATS]
    return (
        cols
        + [
            "ceiling_tok_s",
            "predicted_tok_s",
            "efficiency",
            "predicted_ttft_s",
            "ttft_efficiency",
            "predicted_e2e_s",
            "peak_rss_bytes",
            "kv_bytes",
            "cached_prompt_tokens",
            "kv_cache_speedup",
            "slo_goodput_rps",
            "slo_good_share",
            "slo_passed",
        ]
        + [f"load_{c}" for c in _LOAD_COLS]
        + [f"cold_start_predicted_{c}" for c in _COLD_COLS]
        + [f"spec_{c}" for c in _SPEC_COLS]
        + [f"restore_{c}" for c in _RESTORE_COLS]
        + ["failures"]
    )


def write_csv(path: str | Path, doc: dict[str, Any]) -> None:
    """One row per scenario result; summaries flattened to METRIC_STAT columns."""
    buf = io.StringIO()
    w = csv.writer(buf)
    header = _csv_header()
    w.writerow(header)
    for r in doc["results"]:
        flat: dict[str, Any] = {k: r.get(k) for k in header if k in r and not isinstance(r.get(k), (dict, list))}
        for m in METRICS + ("load_s", "ttft_saved_s") + EXTRA_METRICS:
            for s in _STATS:
                flat[f"{m}_{s}"] = (r.get(m) or {}).get(s)
        flat.update({f"load_{c}": (r.get("load") or {}).get(c) for c in _LOAD_COLS})
        flat.update({f"cold_start_predicted_{c}": (r.get("cold_start_predicted") or {}).get(c) for c in _COLD_COLS})
        flat.update({f"spec_{c}": (r.get("speculative") or {}).get(c) for c in _SPEC_COLS})
        flat.update({f"restore_{c}": (r.get("restore") or {}).get(c) for c in _RESTORE_COLS})
        slo = r.get("slo") or {}
        flat.update(
            slo_goodput_rps=slo.get("goodput_rps"),
            slo_good_share=slo.get("good_share"),
            slo_passed=slo.get("passed"),
            failures="; ".join(f"#{f['repeat']} {f['status']}: {f['reason']}" for f in r.get("failures", [])),
        )
        w.writerow(["" if flat.get(k) is None else flat.get(k) for k in header])
    with atomic_write(Path(path), "w") as f:
        f.write(buf.getvalue())


def write_markdown(
    path: str | Path,
    record: dict[str, Any],
    results: Sequence[ScenarioResult],
    slo: dict | None = None,
    load: dict | None = None,
) -> None:
    with atomic_write(Path(path), "w") as f:
        f.write(markdown(record, results, slo, load))


def markdown(
    record: dict[str, Any], results: Sequence[ScenarioResult], slo: dict | None = None, load: dict | None = None
) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731 - one escape, used in every table cell
    lines = [f"# ondevice bench ({record.get('settings', {}).get('suite', '?')})", ""]
    lines += [f"- {k}: {esc(v)}" for k, v in header_facts(record)]
    lines += ["", "| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in table_rows(results, slo)]
    cold = coldstart.rows(results)
    if cold:
        lines += [
            "",
            "## Cold start (page cache dropped -> load -> first token; predicted = read + load + TTFT)",
            "",
            "| " + " | ".join(coldstart.HEADERS) + " |",
            "|" + "|".join("---" for _ in coldstart.HEADERS) + "|",
        ]
        lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in cold]
        lines += [f"- {esc(n)}" for n in cold_notes(results)]
    if load:
        from ondevice.bench.serve.report import LOAD_HEADERS, load_rows

        lines += [
            "",
            "## Load levels",
            "",
            "| " + " | ".join(LOAD_HEADERS) + " |",
            "|" + "|".join("---" for _ in LOAD_HEADERS) + "|",
        ]
        lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in load_rows(results, load)]
    spec = spec_rows(results)
    if spec:
        lines += [
            "",
            "## Speculative decoding (prompt lookup against plain, interleaved)",
            "",
            "| " + " | ".join(SPEC_HEADERS) + " |",
            "|" + "|".join("---" for _ in SPEC_HEADERS) + "|",
        ]
        lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in spec]
    restore = restore_rows(results)
    if restore:
        lines += [
            "",
            "## Restore (a resumed conversation: KV state from disk, recomputed, or still in memory)",
            "",
            "| " + " | ".join(RESTORE_HEADERS) + " |",
            "|" + "|".join("---" for _ in RESTORE_HEADERS) + "|",
        ]
        lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in restore]
    return "\n".join(lines) + "\n"


def render_table(
    record: dict[str, Any],
    results: Sequence[ScenarioResult],
    slo: dict | None = None,
    *,
    width: int | None = None,
    load: dict | None = None,
) -> str:
    """The terminal report as text: the run's facts, a title, the table (and, for a server run, the
    load levels). width: the terminal's columns, which every line fits (None: no limit, whole tables)."""
    title = f"ondevice bench: {record.get('settings', {}).get('suite', '?')} suite"
    if record.get("incomplete"):
        title += " (INCOMPLETE: interrupted)"
    single = len({r.model for r in results}) == 1
    headers = list(HEADERS[1:] if single else HEADERS)
    rows = [row[1:] if single else row for row in table_rows(results, slo)]
    align = "".join("l" if h in _TEXT_COLUMNS else "r" for h in headers)
    lines = [fold(f"{k}: {v}", width) for k, v in header_facts(record)] + ["", title]
    text = table(headers, rows, align)
    if width is None or max(map(len, text.splitlines())) <= width:
        return (
            "\n".join(
                lines
                + [text]
                + _cold_table(results, width)
                + _load_table(results, load, width)
                + spec_table(results, width)
                + restore_table(results, width)
            )
            + "\n"
        )
    # Too wide: the notes (failures, SLO verdicts, load times) go under the table, one line a row.
    notes = [
        fold(f"{' '.join(c for c in row[:-1][: 3 - single] if c != '-')}: {row[-1]}", width, indent="    ")
        for row in rows
        if row[-1]
    ]
    lines.append(
        table(
            headers[:-1],
            [row[:-1] for row in rows],
            align[:-1],
            width=width,
            drop=TERMINAL_DROP,
            full="--json/--csv/--md",
        )
    )
    return (
        "\n".join(
            lines
            + notes
            + _cold_table(results, width)
            + _load_table(results, load, width)
            + spec_table(results, width)
            + restore_table(results, width)
        )
        + "\n"
    )


def _cold_table(results: Sequence[ScenarioResult], width: int | None) -> list[str]:
    """The cold-start cells, measured parts beside predicted ones, as lines; [] without any."""
    rows = coldstart.rows(results)
    if not rows:
        return []
    one = len({row[0] for row in rows}) == 1
    headers = list(coldstart.HEADERS[1:] if one else coldstart.HEADERS)
    rows = [row[1:] if one else row for row in rows]
    align = "".join("l" if h == "model" else "r" for h in headers)
    return [
        "",
        fold(
            "cold start: page cache dropped -> load -> first token; predicted = disk read of the file + "
            "warm load + TTFT",
            width,
        ),
        table(headers, rows, align, width=width, drop=coldstart.TERMINAL_DROP, full="--json/--csv/--md"),
    ] + [fold(f"  {n}", width, indent="    ") for n in cold_notes(results)]


def _load_table(results: Sequence[ScenarioResult], load: dict | None, width: int | None) -> list[str]:
    """A server run's load levels (bench --url), as lines; [] for a local run."""
    if not load:
        return []
    from ondevice.bench.serve.report import LOAD_HEADERS, load_rows

    rows = load_rows(results, load)
    one = len({row[0] for row in rows}) == 1
    headers = list(LOAD_HEADERS[1:] if one else LOAD_HEADERS)
    rows = [row[1:] if one else row for row in rows]
    align = "".join("l" if h in ("model", "level", "workload", "tokens") else "r" for h in headers)
    return ["", "load levels (client side)", table(headers, rows, align, width=width, full="--json/--csv/--md")]
