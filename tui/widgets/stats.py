"""The stats panel: live latency, prediction gauge, ITL sparkline, context, memory, model card.

All sections are lines of one StyledLines, repainted line by line when their text
changes, so a timer tick with nothing new repaints nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any

from ondevice.tui.live import LiveStats
from ondevice.tui.widgets.charts import ItlChartRows, StyledLines, hbar, plain_text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from ondevice.core import fmt

__all__ = ["StatsPanel", "fmt_ms", "fmt_rate", "fmt_bytes", "model_card_lines", "speculative_lines"]

BAR_CELLS = 12
_DASH = "–"


# The panel's style of ondevice.core.fmt's figures: fewer decimals as they grow, an en dash when missing.
fmt_ms = partial(fmt.millis, places=((100, 1), (10_000, 0)), missing=_DASH)  # "12.3 ms", "500 ms", "12.0 s"
fmt_rate = partial(fmt.rate, places=((1000, 1), (math.inf, 0)), missing=_DASH, zero_is_missing=True)
fmt_bytes = partial(fmt.binary_bytes, missing=_DASH)  # memory: KiB, MiB, GiB


def _row(label: str, value: str) -> str:
    return f"{label:<10}{value}"


def model_card_lines(info: Any) -> list[str]:
    """The model card from an EngineInfo (duck-typed: spec, backend, offload, threads)."""
    spec = info.spec
    name = spec.name or (str(info.model_path).rsplit("/", 1)[-1] if info.model_path else "model")
    offload = info.n_gpu_layers
    offload_text = (
        "none" if not offload else ("all layers" if spec.n_layer and offload >= spec.n_layer else f"{offload} layers")
    )
    return [
        name,
        _row("arch", spec.arch or "unknown"),
        _row("quant", f"{spec.quant or '?'} {spec.bits_per_weight:.2f} bpw"),
        _row("size", fmt_bytes(spec.file_bytes)),
        _row("backend", str(info.backend)),
        _row("offload", offload_text),
        _row("threads", str(info.n_threads)),
        _row("buffers", f"CPU {getattr(info, 'cpu_buffers', 'all')}"),
        _row("attention", "flash " + _on_off(getattr(info, "flash_attn_used", None))),
        _row("KV type", f"{getattr(info, 'cache_type_k', 'f16')}/{getattr(info, 'cache_type_v', 'f16')}"),
    ]


def speculative_lines(spec: Any) -> list:
    """Speculative decoding's lines (none without it): acceptance, accepted per step, k. The decode
    line above is then the committed tokens' rate, held against the plain prediction."""
    if spec is None:
        return []
    acc = _DASH if spec.acceptance_rate is None else f"{spec.acceptance_rate:.0%} acc"
    per = _DASH if spec.mean_accepted_per_step is None else f"{spec.mean_accepted_per_step:.1f}/step"
    return [
        ((_row("spec", f"{spec.mode} {acc}"), None),),
        ((_row("", f"{per}, k {spec.k_final}/{spec.k_cap}"), "dim"),),
    ]


def _on_off(flag: bool | None) -> str:
    return "?" if flag is None else ("on" if flag else "off")


class StatsPanel(VerticalScroll, can_focus=False):
    """Right-hand panel. Call the show_* methods from the UI thread.

    One StyledLines holds every section (live figures and gauge, the ITL chart, context /
    prefill / memory, the model card): every widget on screen is drawn again on every
    frame, and a frame repaints only the lines that changed.
    """

    SECTIONS = (
        ("live", 11),
        ("itl", ItlChartRows.ROWS),
        ("ctx", 3),
        ("prefill", 2),
        ("spec", 0),
        ("mem", 2),
        ("gap", 1),
        ("card", 0),
    )

    def compose(self) -> ComposeResult:
        yield StyledLines(id="stats-lines")

    def on_mount(self) -> None:
        self.border_title = "latency"
        self._lines = self.query_one("#stats-lines", StyledLines)
        self._sections: dict[str, list] = {name: [] for name, _ in self.SECTIONS}
        self._chart = ItlChartRows()
        self.context_level = "ok"  # ok / warn / full, as context_level() said last
        self.show_live(None)
        self.show_context(0, 0, None, "ok")
        self.show_model(["loading…"])

    def section_text(self, name: str) -> str:
        """The plain text of one section (live, itl, ctx, prefill, mem, card)."""
        return plain_text(self._sections[name])

    def show_live(self, s: LiveStats | None, itl_s: Sequence[float] = ()) -> None:
        s = s or LiveStats(0, None, None, None, None, 0, None, None, None)
        eff = s.efficiency
        gauge = f"{eff * 100:4.0f}% of pred" if eff else " no prediction"
        ref = f" ─ pred {s.predicted_step_s * 1000:.1f} ms" if s.predicted_step_s else ""
        cached = _DASH if s.cached_prompt_tokens is None else f"{s.cached_prompt_tokens}/{s.prompt_tokens} tok"
        self._set(
            live=[
                ((_row("TTFT", fmt_ms(s.ttft_s)), None),),
                ((_row("  pred", fmt_ms(s.predicted_ttft_s)), "dim"),),
                ((_row("ITL last", fmt_ms(s.last_itl_s)), None),),
                ((_row("TPOT", fmt_ms(s.tpot_s)), None),),
                ((_row("decode", fmt_rate(s.decode_tok_s)), None),),
                ((_row("ceiling", fmt_rate(s.ceiling_tok_s)), None),),
                ((_row("predicted", fmt_rate(s.predicted_tok_s)), None),),
                ((_row("E2E", fmt_ms(s.e2e_s)), None),),
                ((_row("  pred", fmt_ms(s.predicted_e2e_s)), "dim"),),
                ((_row("output", fmt_rate(s.output_tok_s)), None),),
                ((f"{hbar(eff, BAR_CELLS)} {gauge}", "gauge"),),
                ((f"ITL {s.output_tokens} tok{ref}", "dim"),),
            ],
            itl=self._chart.lines(itl_s, s.predicted_step_s, self._chart_width()),
            prefill=[((_row("prefill", fmt_rate(s.prefill_tok_s)), None),), ((_row("cached", cached), None),)],
            spec=speculative_lines(s.speculative),
        )

    def show_context(self, used: int, n_ctx: int, kv_bytes: int | None, level: str) -> None:
        self.context_level = level
        fraction = used / n_ctx if n_ctx else None
        style = None if level == "ok" else level
        self._set(
            ctx=[
                ((f"ctx {hbar(fraction, BAR_CELLS)}", style),),
                ((_row("", f"{used}/{n_ctx or '?'} tok"), style),),
                ((_row("KV cache", fmt_bytes(kv_bytes)), None),),
            ]
        )

    def show_memory(self, rss_bytes: int | None, sys_used_bytes: int | None, sys_total_bytes: int | None) -> None:
        sys_text = _DASH
        if sys_used_bytes is not None and sys_total_bytes:
            sys_text = f"{sys_used_bytes / sys_total_bytes:.0%} of {fmt_bytes(sys_total_bytes)}"
        self._set(mem=[((_row("RSS", fmt_bytes(rss_bytes)), None),), ((_row("sys mem", sys_text), None),)])

    def show_model(self, lines: Sequence[str]) -> None:
        self._set(card=[((line, "muted"),) for line in lines])

    def on_resize(self) -> None:
        self._set(itl=self._chart.lines(self._chart.values, self._chart.ref, self._chart_width()))

    def _chart_width(self) -> int:
        return self._lines.size.width or max(1, self.size.width - 4)

    def _set(self, **sections: list) -> None:
        """Replace some sections; the lines widget repaints the lines that changed."""
        changed = False
        for name, lines in sections.items():
            if lines != self._sections[name]:
                self._sections[name] = lines
                changed = True
        if changed:
            blank = (("", None),)
            out: list = []
            for name, height in self.SECTIONS:
                lines = self._sections[name]
                out += lines + [blank] * (height - len(lines)) if height else lines
            self._lines.set_lines(out)
