"""The quantization ladder: what each quant level of one model costs and buys, on this machine.

For a source model and a list of types: quantize each (cached in the user cache dir), then
per rung report the file size and bits per weight, the roofline's ceiling and calibrated
decode tok/s, the measured decode tok/s and TTFT of a short run with EOS ignored, and the
perplexity and KL divergence against the highest-precision rung.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ondevice.quant import quality
from ondevice.quant.quantize import file_type, is_quantized, quantize

from ondevice.core import paths
from ondevice.core.errors import GGUFFormatError, InvalidParameterError, QuantError
from ondevice.gguf.reader import read_gguf
from ondevice.gguf.spec import ModelSpec, inspect

__all__ = ["Rung", "Ladder", "BenchPlan", "run_ladder", "rung_path", "parse_types"]

# progress(stage, detail): stage is "quantize", "bench" or "quality"
Progress = Callable[[str, str], None]


@dataclass(frozen=True)
class BenchPlan:
    """The short speed run per rung."""

    prompt_tokens: int = 64  # prompt length, tokens (cut from the shipped text)
    output_tokens: int = 32  # tokens generated, EOS ignored
    runs: int = 3  # measured runs per rung (after one warm-up); medians are reported
    n_threads: int | None = None  # llama.cpp threads (None: the engine's default)

    def validate(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 2 or self.runs < 1:
            raise InvalidParameterError("bench needs prompt_tokens >= 1, output_tokens >= 2 and runs >= 1")

    @property
    def mean_ctx(self) -> int:
        """Context midway through the measured decode: where the prediction is taken."""
        return self.prompt_tokens + self.output_tokens // 2


@dataclass(frozen=True)
class Rung:
    """One quant level of the model."""

    qtype: str  # quantization type, e.g. "Q4_K_M"
    path: str  # the quantized file (in the cache)
    cached: bool  # the file was already in the cache
    file_bytes: int  # size of the file
    weight_bytes: int  # bytes of tensor data
    decode_weight_bytes: int  # weight bytes one decode step reads
    bits_per_weight: float  # 8 * weight_bytes / parameters
    ceiling_tok_s: float | None  # roofline bound at BenchPlan.mean_ctx (None: no probe cached, no bandwidth given)
    predicted_tok_s: float | None  # calibrated prediction at BenchPlan.mean_ctx (None: no kernel probe)
    ttft_floor_s: float | None  # roofline's lower bound on TTFT for the bench prompt, seconds
    decode_tok_s: float | None  # measured, median over runs (None: bench skipped)
    ttft_s: float | None  # measured time to first token, median over runs, seconds
    ppl: float | None  # perplexity on the evaluation text (None: quality skipped)
    kl_mean: float | None  # mean KL(base || this rung), nats per token
    top1_agreement: float | None  # share of positions where the top token matches the base's, 0..1
    is_base: bool  # the highest-precision rung: quality reference

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Ladder:
    source: str  # the source model file
    source_quant: str | None  # its file type, e.g. "Q4_K_M"
    base_type: str  # rung the quality figures are measured against
    rungs: tuple[Rung, ...]  # in the order asked
    bench: BenchPlan | None  # None: no speed run
    backend: str | None  # llama.cpp backend that ran the bench
    prediction_note: str | None  # where the predicted figures come from, or why there are none
    quality_text: str | None  # evaluation text name
    quality_n_ctx: int | None  # quality window, tokens
    quality_scored_tokens: int | None  # tokens scored per model

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rungs"] = [r.to_dict() for r in self.rungs]
        return d


def parse_types(types: str | Sequence[str]) -> list[str]:
    """ "Q4_0,Q8_0" or a list -> canonical names, duplicates dropped; QuantError for unknown ones."""
    items = types.split(",") if isinstance(types, str) else list(types)
    out: list[str] = []
    for item in (t.strip() for t in items):
        if item:
            name = next(k for k, v in _types_by_value().items() if v == file_type(item))
            if name not in out:
                out.append(name)
    if not out:
        raise QuantError("no quantization types given")
    return out


def _types_by_value() -> dict[str, Any]:
    from ondevice.quant.quantize import file_types

    return file_types()


def rung_path(source: Path, qtype: str, cache_root: Path | None = None) -> Path:
    """Cache location of one rung: keyed by the source's path, size and mtime."""
    st = source.stat()
    key = hashlib.sha256(f"{source.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:12]
    root = cache_root or paths.cache_dir() / "quant"
    return root / f"{source.stem}-{key}" / f"{qtype}.gguf"


def _obtain(
    source: Path, qtype: str, cache_root: Path | None, allow_requantize: bool, threads: int | None
) -> tuple[Path, bool]:
    dst = rung_path(source, qtype, cache_root)
    if dst.exists():
        try:
            read_gguf(dst)
            return dst, True
        except GGUFFormatError:
            pass  # a damaged cache entry: make it again
    dst.parent.mkdir(parents=True, exist_ok=True)
    quantize(source, dst, qtype, threads=threads, allow_requantize=allow_requantize, force=True)
    return dst, False


def _measure(path: Path, plan: BenchPlan) -> tuple[float | None, float | None, str]:
    """Median decode tok/s and TTFT over plan.runs runs (after one warm-up), and the backend."""
    from ondevice.engine import load
    from ondevice.engine.loader import MIN_N_CTX

    n_ctx = max(MIN_N_CTX, plan.prompt_tokens + plan.output_tokens + 8)  # llama.cpp's smallest context at least
    with load(path, n_ctx=n_ctx, n_threads=plan.n_threads) as eng:
        ids = eng.tokenize(quality.default_text(), add_bos=True)[: plan.prompt_tokens]
        speeds, ttfts = [], []
        for run in range(plan.runs + 1):
            g = eng.generate(ids, max_tokens=plan.output_tokens, ignore_eos=True, temperature=0.0, reuse_prefix=False)
            if run and g.timings.decode_tok_s:
                speeds.append(g.timings.decode_tok_s)
                ttfts.append(g.timings.ttft_s)
        backend = eng.info.backend
    med = statistics.median
    return (med(speeds) if speeds else None), (med(ttfts) if ttfts else None), backend


def _predict(spec: ModelSpec, plan: BenchPlan, bandwidth_gbs: float | None, probe: Any) -> tuple[Any, str]:
    """roofline.predict at the bench's mid-decode context: (Prediction or None, a note)."""
    from ondevice.api import predict
    from ondevice.core.errors import ProbeError

    try:
        pred = predict(
            spec if bandwidth_gbs is not None else spec.path,  # a file of this machine: its shape timed here
            ctx=(plan.mean_ctx,),
            prompt_tokens=plan.prompt_tokens,
            bandwidth_gbs=bandwidth_gbs,
            probe=probe,
        )
    except ProbeError as exc:
        return None, str(exc)
    if pred.bandwidth_source == "given":
        note = f"predictions: pure ceiling at a given {pred.bandwidth_gbs:g} GB/s"
    else:
        note = f"predictions: probe of this machine ({pred.backend}, {pred.bandwidth_gbs:.1f} GB/s)"
        if not pred.calibrated:
            note += "; the model was not timed, so no predicted figure"
    return pred, note


def run_ladder(
    source: str | Path,
    types: str | Sequence[str],
    *,
    allow_requantize: bool = False,
    cache_root: Path | None = None,
    threads: int | None = None,
    bench: BenchPlan | None = BenchPlan(),
    quality_opts: dict[str, Any] | None = None,
    with_quality: bool = True,
    bandwidth_gbs: float | None = None,
    probe: Any = None,
    progress: Progress | None = None,
) -> Ladder:
    """Build and measure the ladder. `quality_opts` are passed to quality.compare_many
    (text, n_ctx, max_tokens, n_threads). Predictions come from ondevice.roofline.predict: the
    cached probe of this machine, or `probe`, or the pure ceiling at `bandwidth_gbs`."""
    src = Path(source)
    g = read_gguf(src)
    names = parse_types(types)
    if is_quantized(g) and not allow_requantize:
        raise QuantError(
            f"{src} is already quantized ({', '.join(is_quantized(g))}); pass --allow-requantize to build a ladder "
            "from it"
        )
    if bench is not None:
        bench.validate()
    say = progress or (lambda stage, detail: None)
    files: list[tuple[str, Path, bool]] = []
    for name in names:
        say("quantize", name)
        path, cached = _obtain(src, name, cache_root, allow_requantize, threads)
        files.append((name, path, cached))
    specs = [inspect(p) for _, p, _ in files]
    speeds = _speeds(files, specs, bench, bandwidth_gbs, probe, say)
    base_i = max(range(len(files)), key=lambda i: specs[i].bits_per_weight)
    comparisons = _quality(files, base_i, quality_opts or {}, say) if with_quality else [None] * len(files)
    rows = zip(files, specs, speeds, comparisons)
    rungs = tuple(_rung(f, spec, sp, cmp, i == base_i) for i, (f, spec, sp, cmp) in enumerate(rows))
    first = comparisons[0]
    return Ladder(
        source=str(src),
        source_quant=inspect(src).quant,
        base_type=names[base_i],
        rungs=rungs,
        bench=bench,
        backend=speeds[-1]["backend"],
        prediction_note=speeds[-1]["note"],
        quality_text=first.base.text_name if first else None,
        quality_n_ctx=first.base.n_ctx if first else None,
        quality_scored_tokens=first.base.n_scored if first else None,
    )


def _speeds(files, specs, bench: BenchPlan | None, bandwidth_gbs, probe, say: Progress) -> list[dict[str, Any]]:
    """Per rung: the roofline prediction, and the measured speed when there is a bench plan."""
    out = []
    for (name, path, _), spec in zip(files, specs):
        pred, note = _predict(spec, bench or BenchPlan(), bandwidth_gbs, probe)
        row: dict[str, Any] = {"pred": pred, "note": note, "tok_s": None, "ttft_s": None, "backend": None}
        if bench is not None:
            say("bench", name)
            row["tok_s"], row["ttft_s"], row["backend"] = _measure(path, bench)
        out.append(row)
    return out


def _rung(file: tuple[str, Path, bool], spec: ModelSpec, speed: dict[str, Any], cmp, is_base: bool) -> Rung:
    name, path, cached = file
    pred = speed["pred"]
    return Rung(
        qtype=name,
        path=str(path),
        cached=cached,
        file_bytes=spec.file_bytes,
        weight_bytes=spec.weight_bytes,
        decode_weight_bytes=spec.decode_weight_bytes,
        bits_per_weight=spec.bits_per_weight,
        ceiling_tok_s=pred.contexts[0].ceiling_tok_s if pred else None,
        predicted_tok_s=pred.contexts[0].predicted_tok_s if pred else None,
        ttft_floor_s=pred.ttft.floor_s if pred and pred.ttft else None,
        decode_tok_s=speed["tok_s"],
        ttft_s=speed["ttft_s"],
        ppl=cmp.other.ppl if cmp else None,
        kl_mean=cmp.kl_mean if cmp else None,
        top1_agreement=cmp.top1_agreement if cmp else None,
        is_base=is_base,
    )


def _quality(files, base_i: int, opts: dict[str, Any], say: Progress) -> list[quality.Comparison]:
    """One comparison per rung, in rung order; the base compared with itself (KL 0)."""
    base_path = files[base_i][1]
    others = [p for i, (_, p, _) in enumerate(files) if i != base_i]

    def tell(done: int, total: int) -> None:
        say("quality", f"window {done}/{total}")

    if others:
        found = quality.compare_many(base_path, others, progress=tell, **opts)
        base_ppl = found[0].base
    else:
        base_ppl = quality.perplexity(base_path, progress=tell, **opts)
        found = []
    self_cmp = quality.Comparison(base_ppl, base_ppl, 0.0, 0.0, 0.0, 0.0, 1.0)
    it = iter(found)
    return [self_cmp if i == base_i else next(it) for i in range(len(files))]
