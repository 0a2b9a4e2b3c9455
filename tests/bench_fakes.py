"""A fake model behind the real Engine interface, for bench runner tests.

Timings are synthetic and exact (no sleeping): prefill costs `prefill_s_per_token` per
computed prompt token, each decode step `step_s`. The KV cache is modelled (longest common
prefix when reuse_prefix, cleared otherwise), so the prefix-hit scenario is checked for real.
Hooks make a request hang until cancelled, or raise KeyboardInterrupt mid-stream.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ondevice.core.errors import ContextOverflowError, ModelLoadError
from ondevice.core.metrics import timings_from_marks
from ondevice.core.results import Generation, TokenEvent

_NS = 1_000_000_000


class FakeStream:
    def __init__(self, engine: FakeEngine, ids: list[int], max_tokens: int, cancel, reuse_prefix: bool):
        self._e, self._ids, self._max, self._cancel, self._reuse = engine, ids, max_tokens, cancel, reuse_prefix
        self.generation: Generation | None = None
        self._closed = False

    def __iter__(self):
        e = self._e
        e.calls.append(SimpleNamespace(n_prompt=len(self._ids), max_tokens=self._max, reuse_prefix=self._reuse))
        cached = 0
        if self._reuse:
            while cached < min(len(e.cache), len(self._ids) - 1) and e.cache[cached] == self._ids[cached]:
                cached += 1
        computed = len(self._ids) - cached
        t0 = 0
        prefill_end = t0 + round(computed * e.prefill_s_per_token * _NS)
        marks, out = [], []
        finish = "length"
        for i in range(self._max):
            if e.on_token is not None:
                e.on_token(e, i, self._cancel)
            if self._closed or (self._cancel is not None and self._cancel.is_set()):
                finish = "cancelled"
                break
            t = prefill_end + round((e.first_sample_s + i * e.step_s) * _NS)
            tok = 10 + (len(self._ids) + i) % 50
            marks.append(t)
            out.append(tok)
            yield TokenEvent(index=i, token_id=tok, text=f"w{tok} ", t_s=t / _NS)
        e.cache = list(self._ids) + out[:-1]
        timings = timings_from_marks(0, 0, 0, prefill_end, marks, computed)
        self.generation = Generation(
            "".join(f"w{t} " for t in out), tuple(out), finish, len(self._ids), cached, timings
        )

    def close(self) -> None:
        self._closed = True


@dataclass
class FakeEngine:
    label: str = "fake"
    load_s: float = 0.25
    prefill_s_per_token: float = 0.001
    first_sample_s: float = 0.002
    step_s: float = 0.01
    n_ctx: int = 4096
    on_token: Callable[[FakeEngine, int, Any], None] | None = None
    predictor: Any = None

    def __post_init__(self):
        self.cache: list[int] = []
        self.calls: list[SimpleNamespace] = []
        self.closed = False
        self.info = SimpleNamespace(
            load_s=self.load_s,
            backend="CPU",
            n_gpu_layers=0,
            n_threads=2,
            n_batch=512,
            n_ctx=self.n_ctx,
            flash_attn=False,
            llama_cpp_version="fake",
            seed=0,
        )

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]:
        ids = [100 + (sum(map(ord, w)) % 400) for w in text.split()]
        return ([1] if add_bos else []) + ids

    def stream(self, prompt: Sequence[int], *, max_tokens: int = 256, cancel=None, reuse_prefix: bool = True, **_: Any):
        ids = list(prompt)
        if len(ids) + max_tokens > self.n_ctx:
            raise ContextOverflowError(f"prompt {len(ids)} + {max_tokens} exceeds {self.n_ctx}")
        return FakeStream(self, ids, max_tokens, cancel, reuse_prefix)

    def close(self) -> None:
        self.closed = True


class FakeLoader:
    """load_fn for run_bench: a FakeEngine per load; `fail` maps a path substring to an error."""

    def __init__(self, fail: dict[str, str] | None = None, **engine_kw: Any):
        self.fail = fail or {}
        self.engine_kw = engine_kw
        self.loads: list[str] = []
        self.engines: list[FakeEngine] = []

    def __call__(self, path: str, **kw: Any) -> FakeEngine:
        self.loads.append(path)
        for key, msg in self.fail.items():
            if key in path:
                raise ModelLoadError(msg)
        e = FakeEngine(label=path, n_ctx=kw.get("n_ctx", 4096), **self.engine_kw)
        self.engines.append(e)
        return e
