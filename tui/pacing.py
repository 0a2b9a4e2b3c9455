"""Frame pacing while an answer streams: how often the UI may draw, from the CPU it spends.

Pure arithmetic, no Textual: the main screen asks `Frames.pace` after each frame when the
next one is due. On a fast machine that is the full 10 Hz; on a slow or busy one, fewer
frames, so that the UI thread's CPU (rendering included) stays within its budget.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "Frames",
    "MAX_FRAME_S",
    "TICK_S",
    "UI_CPU_BUDGET",
    "UI_CPU_BUDGET_NO_SPARE_CORE",
    "no_spare_core",
    "ui_cpu_budget",
]

TICK_S = 1 / 10  # timer period while tokens stream: at most 10 frames a second (cap ~20 Hz)
MAX_FRAME_S = 0.5  # ... and at least 2 frames a second, however slow the machine
UI_CPU_BUDGET = 0.04  # share of one core the UI thread may spend while tokens stream ...
UI_CPU_BUDGET_NO_SPARE_CORE = 0.015  # ... when the engine's threads take every core: each slice
# the UI takes stalls one decode thread, and the others wait for it at the next barrier


def no_spare_core(engine_threads: int | None, cpu_count: int | None) -> bool:
    """The engine's threads take every core (unknown counts: assume a core is left)."""
    return bool(engine_threads and cpu_count and engine_threads >= cpu_count)


def ui_cpu_budget(engine_threads: int | None, cpu_count: int | None) -> float:
    """The UI thread's CPU share while tokens stream: less when no core is left to it."""
    return UI_CPU_BUDGET_NO_SPARE_CORE if no_spare_core(engine_threads, cpu_count) else UI_CPU_BUDGET


@dataclass
class Frames:
    """The screen's drawing state for the turn streaming now."""

    ui_budget: float = UI_CPU_BUDGET  # share of a core the UI may spend on this turn's frames (ui_cpu_budget)
    cpu_s: float | None = None  # UI thread CPU time (thread_time) at the last frame
    following: bool = True  # the view follows the text (until the user scrolls up)
    scrolled_y: float | None = None  # the transcript's scroll offset after the last follow

    def pace(self, cpu_s: float) -> float:
        """A frame starts with the UI thread's CPU time at `cpu_s`: seconds until the next one
        (the CPU spent since the last frame, over the budget; TICK_S to MAX_FRAME_S)."""
        spent = cpu_s - self.cpu_s if self.cpu_s is not None else 0.0
        self.cpu_s = cpu_s
        return min(MAX_FRAME_S, max(TICK_S, spent / self.ui_budget))
