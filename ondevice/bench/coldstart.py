"""Cold start as the user lives it: the model file out of the page cache, then load, then the
first request's first token, as one figure and as its parts, beside a prediction.

The load scenarios time the load alone, and the requests after a load wait for untimed
warm-up requests ("fault in the weights"). With memory-mapped weights part of a cold start's
disk reads happen during the first prefill, so neither shows what a cold command costs. The
cold_start scenario (ondevice.bench.scenarios.cold_start_run) measures

    cold_start_s = load call -> first token of the first request
                 = load_s + tokenize_s + prefill_s + rest

(rest: the first sample, what ondevice.load does around llama.cpp's load — reading the GGUF
header, the predictor — and handing the request over). Its prompt is the suite's shortest, as
text (tokenized in the request, as a user's command does) when the text tokenizes back to the
same ids, else as token ids (tokenize then not timed; the record says so).

The prediction is

    file bytes / the disk's sequential read (ondevice probe, page cache dropped)
    + load overhead (the warm load call measured in the same bench, load_call_s: the same
      load, the file in memory, with what ondevice.load does around llama.cpp's load)
    + TTFT (the predictor's ttft_s(P), when it has one)

with each part None, and a note, where its input is missing.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ondevice.core.fmt import ms_cell

__all__ = [
    "ColdStartPrediction",
    "predict_cold_start",
    "disk_read_for",
    "prompt_for",
    "HEADERS",
    "TERMINAL_DROP",
    "rows",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ColdStartPrediction:
    """Predicted cold start of one model (module docstring)."""

    read_s: float | None  # file_bytes / disk read bandwidth, seconds
    load_overhead_s: float | None  # warm load call p50 of the same bench (load_call_s), seconds
    ttft_s: float | None  # predicted TTFT of the first request's prompt, seconds
    total_s: float | None  # the sum, when all three parts are known, seconds
    file_bytes: int | None  # model file size, bytes
    disk_read_gbs: float | None  # the probe's sequential disk read, GB/s
    notes: tuple[str, ...] = ()  # why a part is missing, or what to know about it

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d


def predict_cold_start(
    *,
    file_bytes: int | None,
    disk_read_gbs: float | None,
    load_overhead_s: float | None,
    ttft_s: float | None,
    notes: Sequence[str] = (),
) -> ColdStartPrediction:
    """read + load overhead + TTFT; a part whose input is missing stays None and so does the total."""
    notes = list(notes)
    read_s = None
    if file_bytes and disk_read_gbs and disk_read_gbs > 0:
        read_s = file_bytes / (disk_read_gbs * 1e9)
    elif not disk_read_gbs:
        notes.append("no disk read figure (`ondevice probe --refresh` measures it)")
    if load_overhead_s is None:
        notes.append("no warm load in this bench (add warm_load to --scenarios) for the load overhead")
    if ttft_s is None:
        notes.append("no TTFT prediction (the predictor has no ttft_s: `ondevice probe` calibrates prefill)")
    parts = [x for x in (read_s, load_overhead_s, ttft_s) if x is not None and math.isfinite(x)]
    total = sum(parts) if len(parts) == 3 else None  # only when all three are known
    return ColdStartPrediction(read_s, load_overhead_s, ttft_s, total, file_bytes, disk_read_gbs, tuple(notes))


def disk_read_for(path: str | Path | None, backend: str | None) -> tuple[float | None, str]:
    """(GB/s, note) of the cached probe's disk read for the disk `path` is on; never measures.
    The note says when the model lives on another device than the one probed."""
    try:
        from ondevice.probing import cached_probe

        result = cached_probe(backend) if backend else None
    except Exception as exc:  # an unreadable cache leaves the read part unknown
        log.debug("probe cache: %s", exc)
        result = None
    disk = getattr(result, "disk", None)
    if disk is None:
        return None, ""
    if disk.read_gbs is None:
        return None, f"the probe has no disk figure: {disk.note}"
    note = ""
    try:
        if path is not None and disk.device is not None and os.stat(path).st_dev != disk.device:
            note = f"the model is on another file system than the one probed ({disk.folder})"
    except OSError:
        pass
    return disk.read_gbs, note


def prompt_for(engine: Any, ids: Sequence[int]) -> tuple[str | list[int], str]:
    """The first request's prompt: the text of `ids` when it tokenizes back to them (so the
    request tokenizes, as a user's would), else the ids; (prompt, note)."""
    detokenize = getattr(engine, "detokenize", None)
    if detokenize is not None:
        try:
            text = detokenize(list(ids))
            if list(engine.tokenize(text, add_bos=True)) == list(ids):
                return text, ""
        except Exception as exc:  # any tokenizer trouble: fall back to the ids
            log.debug("cold-start prompt text: %s", exc)
    return list(ids), "prompt given as token ids (its text does not tokenize back to them): tokenize not timed"


HEADERS = (
    "model",
    "P",
    "runs",
    "cold start p50/p95 s",
    "load s",
    "tokenize ms",
    "prefill ms",
    "rest ms",
    "predicted s",
    "= read s",
    "+ load s",
    "+ TTFT ms",
    "disk GB/s",
    "meas/pred",
)


# What a narrow terminal leaves out first: the disk figure (in `ondevice probe`), the smaller
# measured parts, then the predicted parts; the measured and predicted totals and their ratio stay.
TERMINAL_DROP = ("disk GB/s", "runs", "P", "tokenize ms", "rest ms", "+ load s", "= read s", "+ TTFT ms")


def _s(v: float | None, fmt: str = "{:.3f}") -> str:
    return "-" if v is None or not math.isfinite(v) else fmt.format(v)


def rows(results: Sequence[Any]) -> list[list[str]]:
    """One row per cold_start result (ScenarioResult with its prediction): measured p50 parts
    beside the predicted ones."""
    out = []
    for r in results:
        if r.scenario != "cold_start":
            continue
        total = r.summary("cold_start_s")
        pred = r.cold_start
        ratio = total.p50 / pred.total_s if pred and pred.total_s and r.ok_runs else None
        out.append(
            [
                r.model,
                str(r.prompt_tokens),
                f"{r.ok_runs}/{r.repeats}",
                f"{_s(total.p50)}/{_s(total.p95)}" if r.ok_runs else "-",
                _s(r.summary("load_s").p50),
                ms_cell(r.summary("tokenize_s").p50),
                ms_cell(r.summary("prefill_s").p50),
                ms_cell(r.summary("cold_start_rest_s").p50),
                _s(pred.total_s if pred else None),
                _s(pred.read_s if pred else None),
                _s(pred.load_overhead_s if pred else None),
                ms_cell(pred.ttft_s if pred else None),
                _s(pred.disk_read_gbs if pred else None, "{:.2f}"),
                _s(ratio, "{:.2f}"),
            ]
        )
    return out
