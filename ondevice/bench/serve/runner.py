"""`bench --url`: plan the requests, run the load levels against the server, keep every request.

Per workload, the levels run in the order given: closed loop at each concurrency, then open
loop at each rate, `requests` requests a level, after `warmup` untimed requests. Prompts are
built before a level starts (never inside the timed path), each new, so no request hits a
cache another one filled: exact lengths in the model's tokens with a tokenizer (`--tokenizer`
or `--local`), else seeded text of about P tokens (marked estimated).

`--local MODEL` runs the same model in-process too, interleaved request by request with the
server's concurrency-1 level (server, local, local, server, ...: drift hits both alike), as a
second model of the same results: `bench compare FILE` then gives the server's overhead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ondevice.bench import scenarios as sc
from ondevice.bench.oscache import PeakRss
from ondevice.bench.runner import BenchConfig, BenchOutcome, ModelPlan, Progress, load_plan, plan_bench
from ondevice.bench.runs import RESIDENT, RunRecord, RunStatus
from ondevice.bench.serve.client import Target, get_json, parse_base_url, stream_request
from ondevice.bench.serve.load import LoadInterrupted, closed_loop, open_loop, poisson_arrivals
from ondevice.bench.serve.measure import RequestSpec, to_record
from ondevice.bench.suites import PromptBuilder, Suite, Workload
from ondevice.core.errors import BenchError
from ondevice.core.reasoning import DEFAULT_MARKERS, ThinkMarkers, detect_markers

__all__ = ["ServeConfig", "ServeOutcome", "Level", "run_serve", "levels", "request_body"]

log = logging.getLogger(__name__)
WORDS_PER_TOKEN = 1 / 1.3  # seeded English-like text without a tokenizer: about 1.3 tokens a word


@dataclass(frozen=True)
class Level:
    name: str  # scenario name: closed_c{C} or open_r{rate}
    mode: str  # "closed" | "open"
    offered: float  # C or λ


@dataclass(frozen=True)
class ServeConfig:
    target: Target
    bench: BenchConfig  # suite, sampling, seed, timeout; engine settings and models=(local,) for --local
    concurrency: tuple[int, ...] = (1,)
    rates: tuple[float, ...] = ()
    requests: int = 8  # per level
    duration_s: float = 120.0  # per level: no request is sent after this
    tokenizer: str | None = None  # model reference whose tokenizer counts tokens and builds prompts
    local: bool = False  # bench.models[0] also runs in-process, interleaved with concurrency 1
    ignore_eos: bool = True  # ask for exactly N tokens (ignore_eos, min_tokens)
    api_key_env: str | None = None  # the variable's name, for the record


@dataclass
class ServeOutcome:
    outcome: BenchOutcome  # the runs, in the shape local benches have
    levels: dict[str, Level]  # scenario -> level
    target: dict[str, Any] = field(default_factory=dict)  # what the record says about the server
    config: ServeConfig | None = None


def levels(concurrency: tuple[int, ...], rates: tuple[float, ...]) -> list[Level]:
    out = [Level(f"closed_c{c}", "closed", float(c)) for c in concurrency]
    return out + [Level(f"open_r{r:g}", "open", float(r)) for r in rates]


def request_body(target: Target, text: str, n_out: int, seed: int, sampling: dict, ignore_eos: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": n_out, "seed": seed, "stream_options": {"include_usage": True}}
    body.update(
        {k: v for k, v in sampling.items() if k in ("temperature", "top_p", "top_k", "min_p", "repeat_penalty")}
    )
    if ignore_eos:
        body.update(ignore_eos=True, min_tokens=n_out)
    if target.model:
        body["model"] = target.model
    if target.chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


class _Prompts:
    """Prompt text (and ids for the local engine) of exactly P tokens, or about P without a tokenizer."""

    def __init__(self, engine: Any, seed: int):
        self.engine = engine
        self.builder = PromptBuilder((lambda t, b: engine.tokenize(t, add_bos=b)) if engine else _no_tokenizer, seed)
        self.bos = engine.tokenize("", add_bos=True) if engine else []

    def get(self, n: int, key: str) -> tuple[str, list[int] | None]:
        """(prompt text, its ids): about n tokens of text and no ids without a tokenizer."""
        if self.engine is None:
            return self.builder.text(max(1, round(n * WORDS_PER_TOKEN)), key), None
        ids = self.builder.ids(n, key)
        body = ids[len(self.bos) :] if self.bos and ids[: len(self.bos)] == self.bos else ids
        return self.engine.detokenize(body), ids


def _no_tokenizer(text: str, add_bos: bool) -> list[int]:
    raise BenchError("prompt ids need a tokenizer (--tokenizer or --local)")


def _setup(cfg: ServeConfig) -> tuple[ModelPlan | None, Any, str]:
    """(local plan, tokenizer engine, where the tokenizer came from)."""
    local = None
    if cfg.local:
        local = plan_bench(replace(cfg.bench, scenarios=(RESIDENT,)))[0]
        if local.error:
            raise BenchError(f"--local {local.ref}: {local.error}")
        load_plan(cfg.bench, local)
        return local, local.engine, local.label
    if cfg.tokenizer is None:
        return None, None, ""
    from ondevice.engine import load
    from ondevice.models.materialize import resolve_model

    path = resolve_model(cfg.tokenizer)
    return None, load(path, n_ctx=256, n_gpu_layers=0), path.name


def _served_model(target: Target) -> tuple[str | None, list[str], str]:
    """(model to name in requests, the ids /models lists, a note when it could not be read)."""
    try:
        listed = [m.get("id") for m in get_json(target, "/models").get("data", []) if isinstance(m, dict)]
    except Exception as exc:  # a server without /models, or none at all: the requests will say
        return target.model, [], target.scrub(f"GET /models failed: {type(exc).__name__}: {exc}")
    ids = [m for m in listed if isinstance(m, str)]
    return target.model or (ids[0] if ids else None), ids, ""


def _short_name(model: str | None) -> str | None:
    """A served model's id as a label: a file path (llama-cpp-python's default id) by its file name."""
    return model.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1] if model else model


def _markers(cfg: ServeConfig) -> ThinkMarkers:
    if cfg.tokenizer or cfg.local:
        from ondevice.gguf.reader import read_gguf
        from ondevice.models.materialize import resolve_model

        try:
            found = detect_markers(
                read_gguf(resolve_model(cfg.tokenizer or cfg.bench.models[0])).get("tokenizer.chat_template")
            )
        except Exception:  # the markers are a convenience: the defaults still read <think> blocks
            found = None
        return found or DEFAULT_MARKERS
    return DEFAULT_MARKERS


def run_serve(cfg: ServeConfig, *, progress: Callable[[Progress], None] | None = None) -> ServeOutcome:
    """Run every level of every workload; never raises for a failing server. Ctrl-C: incomplete."""
    model, listed, note = _served_model(cfg.target)
    target = replace(cfg.target, model=model)
    _, host, port, _ = parse_base_url(target.url)
    label = f"{_short_name(model) or 'server'} @ {host}:{port}"
    lv = levels(cfg.concurrency, cfg.rates)
    bench = replace(cfg.bench, models=(label,), scenarios=tuple(x.name for x in lv))
    server_plan = ModelPlan(model, label, None, None, 0, cfg.bench.suite)
    outcome = BenchOutcome(bench, [server_plan], [], time.time())
    local, tok, tok_name = _setup(cfg)
    if local is not None:
        outcome.models.insert(0, local)  # A = in-process, B = server: compare's ratio is the server's overhead
    info = {
        "url": target.url,
        "endpoint": target.endpoint,
        "model": model,
        "models_listed": listed,
        "chat": target.chat,
        "api_key_env": cfg.api_key_env,
        "tokenizer": tok_name or None,
        "timeout_s": target.timeout_s,
        "ignore_eos": cfg.ignore_eos,
        "notes": [note] if note else [],
    }
    run = _Run(cfg, target, label, outcome, local, tok, _markers(cfg), progress)
    try:
        run.all(lv)
    except KeyboardInterrupt:
        outcome.incomplete = True
    finally:
        outcome.ended_at = time.time()
        for engine in {id(e): e for e in (tok, local.engine if local else None) if e is not None}.values():
            try:
                engine.close()
            except Exception as exc:  # a close that fails must not hide the runs
                log.warning("closing the engine: %s", exc)
    return ServeOutcome(outcome, {x.name: x for x in lv}, info, cfg)


class _Run:
    def __init__(self, cfg, target, label, outcome, local, tok, markers, progress):
        self.cfg, self.target, self.label, self.outcome, self.local = cfg, target, label, outcome, local
        self.prompts = _Prompts(tok, cfg.bench.seed)
        self.counter = (lambda text: len(tok.tokenize(text, add_bos=False))) if tok else None
        self.markers, self.progress = markers, progress
        self.ctx = (
            sc.RequestContext(local.engine, local.label, 0, cfg.bench.sampling, cfg.bench.timeout_s, PeakRss())
            if local
            else None
        )

    def all(self, lv: list[Level]) -> None:
        suite: Suite = self.cfg.bench.suite
        total, done = len(lv) * len(suite.workloads), 0
        self._warmup(suite.workloads[0])
        for w in suite.workloads:
            for level in lv:
                if self.progress:
                    self.progress(Progress(done, total, f"{w.name} {level.name}"))
                self._level(w, level)
                done += 1
        if self.progress:
            self.progress(Progress(total, total, "done"))

    def _warmup(self, w: Workload) -> None:
        for i in range(self.cfg.bench.suite.warmup):
            text, ids = self.prompts.get(min(w.prompt_tokens, 64), f"warmup:{i}")
            stream_request(
                self.target,
                request_body(
                    self.target, text, min(w.output_tokens, 8), 0, self.cfg.bench.sampling, self.cfg.ignore_eos
                ),
            )
            if self.ctx is not None and ids:
                sc.request(self.ctx, ids, min(w.output_tokens, 8), 0, reuse_prefix=False)

    def _level(self, w: Workload, level: Level) -> None:
        n, seed0 = self.cfg.requests, self.cfg.bench.seed
        prompts = [self.prompts.get(w.prompt_tokens, f"{w.name}:{level.name}:{i}") for i in range(n)]
        specs = [
            RequestSpec(self.label, level.name, w.name, i, w.prompt_tokens, w.output_tokens, seed0 + i)
            for i in range(n)
        ]
        bodies = [
            request_body(self.target, text, w.output_tokens, s.seed, self.cfg.bench.sampling, self.cfg.ignore_eos)
            for (text, _), s in zip(prompts, specs)
        ]
        start = time.perf_counter_ns()
        send = lambda i: stream_request(self.target, bodies[i])  # noqa: E731
        try:
            if self.ctx is not None and level.name == "closed_c1":
                logs = self._interleaved(send, prompts, specs, w)
            elif level.mode == "closed":
                logs = closed_loop(send, n, int(level.offered), self.cfg.duration_s)
            else:
                logs = open_loop(send, poisson_arrivals(level.offered, n, seed0), self.cfg.duration_s)
        except LoadInterrupted as stop:  # keep what finished; the rest is "interrupted"
            for s, lg in zip(specs, stop.results):
                self.outcome.runs.append(self._record(s, lg, start, interrupted=True))
            raise
        for s, lg in zip(specs, logs):
            self.outcome.runs.append(self._record(s, lg, start))

    def _interleaved(self, send, prompts, specs, w: Workload) -> list[Any]:
        logs: list[Any] = [None] * len(specs)
        deadline = time.perf_counter() + self.cfg.duration_s
        try:
            for i, ((_, ids), s) in enumerate(zip(prompts, specs)):
                if time.perf_counter() > deadline:
                    break
                local = lambda: self.outcome.runs.append(  # noqa: E731
                    replace(sc.resident_run(self.ctx, w.name, ids, w.output_tokens, s.seed), repeat=i)
                )
                first, second = (local, None) if i % 2 else (None, local)
                if first:
                    first()
                logs[i] = send(i)
                if second:
                    second()
        except KeyboardInterrupt:
            raise LoadInterrupted(logs) from None
        return logs

    def _record(self, spec: RequestSpec, lg: Any, start_ns: int, interrupted: bool = False) -> RunRecord:
        if lg is None:
            status: RunStatus = "interrupted" if interrupted else "skipped"
            why = (
                "interrupted by the user (Ctrl-C)"
                if interrupted
                else f"not sent: the level's {self.cfg.duration_s:g} s budget ran out"
            )
            return RunRecord(
                spec.model,
                spec.scenario,
                spec.workload,
                spec.index,
                status,
                reason=why,
                prompt_tokens=spec.prompt_tokens,
                output_tokens_requested=spec.output_tokens,
                seed=spec.seed,
            )
        return to_record(lg, spec, counter=self.counter, markers=self.markers, level_start_ns=start_ns)
