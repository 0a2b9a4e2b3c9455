"""`ondevice bench compare A.json B.json`: ratios, and a verdict that tells noise from change.

`ondevice bench compare RUN.json` with a file holding two models (measured interleaved)
compares the second against the first.

A server's closed loop at concurrency 1 (`bench --url`, scenario closed_c1) is the resident
scenario over HTTP: one request at a time, the model loaded, nothing cached. The two are
compared with each other, which gives a server's overhead over the in-process engine.

For each scenario both files hold, the time ratio B/A of the median is given with a 95%
bootstrap confidence interval. The bootstrap is two-level (runs resampled, then the tokens
within each run), so run-to-run drift widens the interval instead of being mistaken for a
change. A Mann-Whitney rank test runs beside it. Verdict per metric: "slower" when the
interval lies above 1, the rank test gives p < 0.05 and the ratio exceeds 1 + threshold;
"faster" the same way below 1; else "no significant difference". (The bootstrap guards
the pooled per-token ITLs, whose rank test alone is over-confident since tokens of one run
are not independent; the rank test guards the few per-run TTFTs, where a percentile
bootstrap of 3-5 values is too narrow.) numpy only.

Before any verdict, the two records are checked for what a comparison should hold equal
(ondevice.bench.comparable: model sha256, llama-cpp-python, engine settings, sampling, host):
what differs is said in one "not comparable: ..." line above the table, and the numbers are
still shown. Files of schema ondevice-bench/1 and /2 are read.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ondevice.bench.comparable import differences
from ondevice.bench.record import READABLE_SCHEMAS, SCHEMA
from ondevice.core.errors import BenchError
from ondevice.core.stored import StoredFileError, load_json

__all__ = [
    "MetricComparison",
    "ScenarioComparison",
    "load_results",
    "compare_docs",
    "split_models",
    "bootstrap_ratio",
    "mann_whitney",
    "render_comparison",
    "comparability",
    "FASTER",
    "SLOWER",
    "SAME",
]

FASTER, SLOWER, SAME = "faster", "slower", "no significant difference"
_TESTED = {"load": ("load_s",), "request": ("ttft_s", "itl_s"), "cold_start": ("cold_start_s", "ttft_s")}
_RATIO_ONLY = ("tpot_s", "e2e_s", "decode_tok_s", "prefill_tok_s")
_SAME_AS = {"closed_c1": "resident"}  # scenario -> the scenario it is compared with


@dataclass(frozen=True)
class MetricComparison:
    metric: str  # ttft_s, itl_s, load_s (tested) or a ratio-only metric
    a_p50: float | None  # A's median (seconds, or tok/s for *_tok_s)
    b_p50: float | None  # B's median
    ratio: float | None  # B / A of the medians
    ci_low: float | None  # 95% bootstrap interval of the ratio (tested metrics only)
    ci_high: float | None
    p_value: float | None  # Mann-Whitney two-sided p (tested metrics only)
    n_a: int  # samples on each side (tokens for itl_s, runs otherwise)
    n_b: int
    verdict: str | None  # FASTER / SLOWER / SAME for tested metrics; None for ratio-only


@dataclass(frozen=True)
class ScenarioComparison:
    model: str  # model label (A's)
    scenario: str
    workload: str
    metrics: tuple[MetricComparison, ...]
    verdict: str  # FASTER / SLOWER / SAME, "mixed" when tested metrics disagree, or why not comparable

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "scenario": self.scenario,
            "workload": self.workload,
            "verdict": self.verdict,
            "metrics": [m.__dict__ for m in self.metrics],
        }


MAX_RESULTS_BYTES = 256 << 20  # a bench file of many thousands of runs is a few MB


def load_results(path: str | Path) -> dict[str, Any]:
    """Read a bench --json file; BenchError (one line) for anything else."""
    path = Path(path)
    try:
        doc = load_json(path, MAX_RESULTS_BYTES)
    except FileNotFoundError:
        raise BenchError(f"{path}: no such file") from None
    except StoredFileError as exc:
        raise BenchError(str(exc)) from None
    record = doc.get("record") if isinstance(doc, dict) else None
    if (
        not isinstance(record, dict)
        or record.get("schema") not in READABLE_SCHEMAS
        or not isinstance(doc.get("results"), list)
    ):
        raise BenchError(
            f"{path}: not an ondevice bench result file (expected "
            f"{{'record': {{'schema': '{SCHEMA}'}}, 'results': [...]}})"
        )
    for r in doc["results"]:
        if not isinstance(r, dict) or not {"model", "scenario", "runs"} <= set(r) or not isinstance(r["runs"], list):
            raise BenchError(f"{path}: malformed result entry (needs model, scenario and runs)")
    return doc


def split_models(doc: dict[str, Any], name: str = "the file") -> tuple[dict[str, Any], dict[str, Any], str, str]:
    """One file holding exactly two models (measured interleaved) -> (A doc, B doc, A, B)."""
    models = list(dict.fromkeys(r["model"] for r in doc["results"]))
    if len(models) != 2:
        raise BenchError(
            f"{name} holds {len(models)} model(s): compare one file only when it holds exactly two, or give two files"
        )
    a, b = ({"record": doc["record"], "results": [r for r in doc["results"] if r["model"] == m]} for m in models)
    return a, b, models[0], models[1]


def _samples(result: dict[str, Any], metric: str) -> list[np.ndarray]:
    """Per ok run: its samples of `metric` (all ITLs, or one value)."""
    out = []
    for run in result.get("runs", []):
        if run.get("status") != "ok":
            continue
        if metric == "itl_s":
            xs = [x for x in run.get("itl_s") or [] if x is not None]
        else:
            xs = [run[metric]] if run.get(metric) is not None else []
        if xs:
            out.append(np.asarray(xs, dtype=float))
    return out


def bootstrap_ratio(
    a: Sequence[np.ndarray], b: Sequence[np.ndarray], *, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """(median(B)/median(A), low, high): two-level bootstrap over runs, then samples in a run."""
    rng = np.random.default_rng(seed)
    ratio = float(np.median(np.concatenate(b)) / np.median(np.concatenate(a)))
    ma, mb = _boot_medians(a, n_boot, rng), _boot_medians(b, n_boot, rng)
    r = mb / ma
    tail = (1 - level) / 2
    return ratio, float(np.quantile(r, tail)), float(np.quantile(r, 1 - tail))


def _boot_medians(runs: Sequence[np.ndarray], n_boot: int, rng: np.random.Generator) -> np.ndarray:
    flat = np.concatenate(runs)
    lens = np.array([len(x) for x in runs])
    offsets = np.concatenate([[0], np.cumsum(lens)[:-1]])
    out = np.empty(n_boot)
    for i in range(n_boot):
        pick = rng.integers(0, len(runs), len(runs))
        run_of = np.repeat(pick, lens[pick])
        idx = offsets[run_of] + (rng.random(len(run_of)) * lens[run_of]).astype(np.int64)
        out[i] = np.median(flat[idx])
    return out


def mann_whitney(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sided p-value of the Mann-Whitney U test (normal approximation, ties corrected)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        return math.nan
    x = np.concatenate([a, b])
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    avg_rank = upper - (counts - 1) / 2.0  # 1-based average rank of each distinct value
    u1 = avg_rank[inverse[:n1]].sum() - n1 * (n1 + 1) / 2.0
    n = n1 + n2
    tie = float((counts**3 - counts).sum()) / (n * (n - 1)) if n > 1 else 0.0
    var = n1 * n2 / 12.0 * ((n + 1) - tie)
    if var <= 0:
        return 1.0
    d = u1 - n1 * n2 / 2.0
    z = (abs(d) - 0.5) / math.sqrt(var) if abs(d) >= 0.5 else 0.0
    return float(math.erfc(z / math.sqrt(2)))


def _verdict(ratio: float, lo: float, hi: float, p: float, threshold: float, alpha: float = 0.05) -> str:
    if not (p < alpha):  # both tests must call it: the rank test too
        return SAME
    if lo > 1.0 and ratio > 1.0 + threshold:
        return SLOWER
    if hi < 1.0 and ratio < 1.0 - threshold:
        return FASTER
    return SAME


def _p50(result: dict[str, Any], metric: str) -> float | None:
    s = result.get(metric)
    return s.get("p50") if isinstance(s, dict) else None


def _compare_metric(ra: dict, rb: dict, metric: str, threshold: float, tested: bool) -> MetricComparison:
    a_p50, b_p50 = _p50(ra, metric), _p50(rb, metric)
    ratio = b_p50 / a_p50 if a_p50 and b_p50 is not None else None
    if not tested:
        return MetricComparison(metric, a_p50, b_p50, ratio, None, None, None, 0, 0, None)
    sa, sb = _samples(ra, metric), _samples(rb, metric)
    na, nb = sum(len(x) for x in sa), sum(len(x) for x in sb)
    if not sa or not sb:
        return MetricComparison(metric, a_p50, b_p50, ratio, None, None, None, na, nb, None)
    ratio, lo, hi = bootstrap_ratio(sa, sb)
    p = mann_whitney(np.concatenate(sa), np.concatenate(sb))
    return MetricComparison(metric, a_p50, b_p50, ratio, lo, hi, p, na, nb, _verdict(ratio, lo, hi, p, threshold))


def _key(r: dict[str, Any], with_model: bool) -> tuple:
    scenario = r.get("scenario")
    scenario = _SAME_AS.get(scenario, scenario) if isinstance(scenario, str) else scenario
    k = (scenario, r.get("workload", ""), r.get("prompt_tokens"), r.get("output_tokens"))
    return ((r.get("model"),) + k) if with_model else k


def compare_docs(a: dict[str, Any], b: dict[str, Any], *, threshold: float = 0.05) -> list[ScenarioComparison]:
    """Scenario-by-scenario comparison of two result documents (B against A)."""
    if not (0 <= threshold < 1):
        raise BenchError(f"--threshold {threshold}: must be in [0, 1)")
    one_each = len({r["model"] for r in a["results"]}) == 1 and len({r["model"] for r in b["results"]}) == 1
    with_model = True
    by_key = {_key(r, True): r for r in b["results"]}
    if one_each and not any(_key(r, True) in by_key for r in a["results"]):
        with_model, by_key = False, {_key(r, False): r for r in b["results"]}
    out = []
    for ra in a["results"]:
        rb = by_key.get(_key(ra, with_model))
        if rb is None or ra["scenario"] == "load":
            continue
        kind = (
            "load"
            if ra["scenario"] in ("cold_load", "warm_load")
            else ra["scenario"]
            if ra["scenario"] in _TESTED
            else "request"
        )
        metrics = [_compare_metric(ra, rb, m, threshold, True) for m in _TESTED[kind]]
        if kind == "request":
            metrics += [_compare_metric(ra, rb, m, threshold, False) for m in _RATIO_ONLY]
        out.append(
            ScenarioComparison(ra["model"], ra["scenario"], ra.get("workload", ""), tuple(metrics), _overall(metrics))
        )
    if not out:
        raise BenchError("the two files have no scenario in common (same scenarios, workloads and token counts needed)")
    return out


def comparability(
    a: dict[str, Any], b: dict[str, Any], rows: Sequence[ScenarioComparison], *, same_file: bool = False
) -> dict[str, list[str]]:
    """A's model label -> what differs between the two runs of it (comparable.differences), for
    every model compared that differs in something; {} when all are comparable."""
    b_models = list(dict.fromkeys(r["model"] for r in b["results"]))
    out: dict[str, list[str]] = {}
    for label in dict.fromkeys(sc.model for sc in rows):
        b_label = label if label in b_models or len(b_models) != 1 else b_models[0]
        diff = differences(a, b, a_model=label, b_model=b_label, same_file=same_file)
        if diff:
            out[label] = diff
    return out


def _overall(metrics: Sequence[MetricComparison]) -> str:
    verdicts = [m.verdict for m in metrics if m.verdict is not None]
    if not verdicts:
        return "not comparable: no ok runs on one side"
    changed = {v for v in verdicts if v != SAME}
    if not changed:
        return SAME
    return changed.pop() if len(changed) == 1 else "mixed"


# What a narrow terminal leaves out first: the model (the first line names both files), the two
# medians (their ratio stays), the rank test's p (the verdict stays), the workload.
TERMINAL_DROP = ("model", "A p50", "B p50", "p (MW)", "workload")


def render_comparison(
    rows: Sequence[ScenarioComparison],
    a_name: str,
    b_name: str,
    *,
    width: int | None = None,
    differs: dict[str, list[str]] | None = None,
) -> str:
    """The comparison as text; width: the terminal's columns, which every line fits (None: no limit);
    differs: comparability()'s result, said before the table."""
    from ondevice.core.fmt import fold, millis, number, table

    lines = [fold(f"B = {b_name} against A = {a_name}; ratio = B/A of the medians (times: above 1 is slower)", width)]
    for label, diff in (differs or {}).items():
        who = f" ({label})" if len(differs or {}) > 1 else ""
        lines.append(
            fold(
                f"not comparable{who}: {'; '.join(diff)} differ; the verdicts below measure all of it, not one change",
                width,
            )
        )
    body = []
    for sc in rows:
        for m in sc.metrics:
            unit_ms = m.metric.endswith("_s") and not m.metric.endswith("tok_s")
            show = (lambda v: millis(v, places=((math.inf, 2),))) if unit_ms else number  # noqa: E731 - the column's formatter, chosen by unit
            body.append(
                [
                    sc.model,
                    sc.scenario,
                    sc.workload or "-",
                    m.metric,
                    show(m.a_p50),
                    show(m.b_p50),
                    number(m.ratio, ".3f"),
                    f"[{m.ci_low:.3f}, {m.ci_high:.3f}]" if m.ci_low is not None else "-",
                    number(m.p_value, ".3g"),
                    m.verdict or "",
                ]
            )
        body.append([sc.model, sc.scenario, sc.workload or "-", "=> verdict", "", "", "", "", "", sc.verdict])
    lines.append(
        table(
            ["model", "scenario", "workload", "metric", "A p50", "B p50", "B/A", "95% CI", "p (MW)", "verdict"],
            body,
            align="llllrrrrrl",
            width=width,
            drop=TERMINAL_DROP,
            whole=("verdict",),
            full="--json",
        )
    )
    return "\n".join(lines)
