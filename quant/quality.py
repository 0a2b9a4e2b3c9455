"""Quality of a model, and how far a quantized model is from another: perplexity on a shipped
public-domain text, mean KL divergence of next-token distributions, top-1 agreement.

Method (as llama.cpp's perplexity tool): the text is tokenized once, cut into windows of
`n_ctx` tokens (each starting with BOS when the model has one), every window evaluated from an
empty cache; only the second half of each window is scored, so each scored token has at least
n_ctx/2 tokens of context. Two models are run window by window in lockstep, so their logits
never need to be held for the whole text.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import numpy as np
from gguf import Keys

from ondevice.core.errors import InvalidParameterError, QuantError
from ondevice.core.stored import StoredFileError, read_regular_file
from ondevice.gguf.reader import ArrayRef, GGUFFile, read_gguf
from ondevice.llama.logits import LogitsModel

__all__ = [
    "Perplexity",
    "Comparison",
    "default_text",
    "perplexity",
    "compare",
    "compare_many",
    "check_same_vocabulary",
    "DEFAULT_TEXT",
    "DEFAULT_N_CTX",
]

DEFAULT_TEXT = ("alice_ch1.txt", "pride_ch1.txt")  # quant/data, joined in this order
DEFAULT_N_CTX = 512  # window length, tokens (capped at the model's trained context)
_ROWS = 32  # logit rows turned into probabilities at a time (bounds memory on big vocabularies)

Progress = Callable[[int, int], None]  # (windows done, windows total)


@dataclass(frozen=True)
class Perplexity:
    """Perplexity of one model on one text."""

    model_path: str  # the GGUF file
    text_name: str  # which text was scored
    n_ctx: int  # window length, tokens
    n_windows: int  # windows evaluated
    n_text_tokens: int  # tokens of the text (model's tokenizer), before windowing
    n_scored: int  # tokens scored (second half of each window)
    nll: float  # mean negative log-likelihood of the scored tokens, nats per token
    nll_stderr: float  # standard error of that mean, nats
    ppl: float  # exp(nll)
    eval_s: float  # wall time evaluating this model, seconds

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Comparison:
    """`other` measured against `base` on the same tokens (shared tokenizer)."""

    base: Perplexity  # perplexity of the reference model
    other: Perplexity  # perplexity of the compared model
    kl_mean: float  # mean KL(base || other) over scored positions, nats
    kl_median: float  # median KL, nats
    kl_p99: float  # 99th percentile KL, nats
    kl_max: float  # largest KL at one position, nats
    top1_agreement: float  # share of positions where both models' most likely token is the same, 0..1

    @property
    def ppl_ratio(self) -> float:
        return self.other.ppl / self.base.ppl

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ppl_ratio"] = self.ppl_ratio
        return d


def default_text() -> str:
    """The shipped evaluation text (public domain; see quant/data/README.md)."""
    folder = resources.files("ondevice.quant") / "data"
    return "\n\n".join(folder.joinpath(name).read_text(encoding="utf-8") for name in DEFAULT_TEXT)


MAX_TEXT_BYTES = 64 << 20  # an evaluation text: far more than --max-tokens ever scores


def _read_text(text: str | Path | None) -> tuple[str, str]:
    if text is None:
        return default_text(), "+".join(DEFAULT_TEXT)
    path = Path(text)
    try:
        data = read_regular_file(path, MAX_TEXT_BYTES)  # a FIFO or /dev/zero is refused, not read forever
        return data.decode("utf-8"), path.name
    except FileNotFoundError:
        raise QuantError(f"cannot read text file {path}: no such file") from None
    except StoredFileError as exc:
        raise QuantError(f"cannot read text file {exc}") from None
    except UnicodeDecodeError as exc:
        raise QuantError(f"cannot read text file {path}: {exc}") from None


def _window_len(g: GGUFFile, n_ctx: int | None) -> int:
    trained = g.get(Keys.LLM.CONTEXT_LENGTH.format(arch=g.get(Keys.General.ARCHITECTURE)))
    n = int(n_ctx or DEFAULT_N_CTX)
    if isinstance(trained, int) and trained > 0:
        n = min(n, trained)
    if n < 8:
        raise InvalidParameterError(f"n_ctx must be at least 8 tokens, not {n}")
    return n


def _windows(tokens: list[int], n_ctx: int, bos: int | None) -> list[tuple[list[int], int]]:
    """(window tokens, first scored index) for each window; only windows with something to score."""
    body = n_ctx - 1 if bos is not None else n_ctx
    first = n_ctx // 2
    out: list[tuple[list[int], int]] = []
    for start in range(0, len(tokens), body):
        window = ([bos] if bos is not None else []) + tokens[start : start + body]
        if len(window) > first + 1 or (not out and len(window) >= 2):
            out.append((window, min(first, len(window) - 1)))
    return out


def _stats(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """exp(x - max) in float32, its row sums and log-sum-exp in float64 (accurate, half the memory)."""
    top = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - top)
    total = e.sum(axis=1, dtype=np.float64)
    return e, total, top[:, 0].astype(np.float64) + np.log(total)


class _Scorer:
    """Per-position NLL of one model; for a model compared with a base, KL and top-1 agreement."""

    def __init__(self) -> None:
        self.nll: list[np.ndarray] = []
        self.kl: list[np.ndarray] = []
        self.agree = 0
        self.n = 0

    def add(self, targets: np.ndarray, logits: np.ndarray, lse: np.ndarray) -> None:
        self.nll.append(lse - logits[np.arange(len(targets)), targets].astype(np.float64))
        self.n += len(targets)

    def add_kl(
        self,
        base: np.ndarray,
        base_e: np.ndarray,
        base_total: np.ndarray,
        base_lse: np.ndarray,
        logits: np.ndarray,
        lse: np.ndarray,
    ) -> None:
        # KL(b||o) = sum_v p_b(v) (x_b(v) - x_o(v)) - (lse_b - lse_o); x_b - x_o is exact in float32
        # where the two logits are within a factor of 2 (near-identical models), so float32 is enough.
        cross = np.einsum("ij,ij->i", base_e, base - logits, dtype=np.float64) / base_total
        self.kl.append(np.maximum(cross - (base_lse - lse), 0.0))
        self.agree += int((base.argmax(axis=1) == logits.argmax(axis=1)).sum())

    def perplexity(
        self, path: Path, text_name: str, n_ctx: int, n_windows: int, n_text: int, eval_s: float
    ) -> Perplexity:
        nll = np.concatenate(self.nll) if self.nll else np.zeros(0)
        if not nll.size:
            raise QuantError("the text is too short to score: no window has tokens past its first half")
        mean = float(nll.mean())
        stderr = float(nll.std(ddof=1) / math.sqrt(nll.size)) if nll.size > 1 else 0.0
        return Perplexity(
            str(path), text_name, n_ctx, n_windows, n_text, int(nll.size), mean, stderr, math.exp(mean), eval_s
        )


def _score_window(targets: np.ndarray, logits: list[np.ndarray], scorers: list[_Scorer]) -> None:
    """Score one window for a base (index 0) and the models compared with it, _ROWS rows at a time."""
    for r in range(0, len(targets), _ROWS):
        tgt = targets[r : r + _ROWS]
        base = logits[0][r : r + _ROWS]
        base_e, base_total, base_lse = _stats(base)
        scorers[0].add(tgt, base, base_lse)
        for other, scorer in zip(logits[1:], scorers[1:]):
            rows = other[r : r + _ROWS]
            lse = _stats(rows)[2]
            scorer.add(tgt, rows, lse)
            scorer.add_kl(base, base_e, base_total, base_lse, rows, lse)


def _prepare(path: Path, text: str, n_ctx: int, max_tokens: int | None, n_threads: int | None, n_gpu_layers):
    model = LogitsModel(path, n_ctx=n_ctx, n_threads=n_threads or os.cpu_count(), n_gpu_layers=n_gpu_layers)
    try:
        tokens = model.tokenize(text, add_bos=False)
        if max_tokens is not None:
            if max_tokens < 2:
                raise InvalidParameterError(f"max_tokens must be at least 2, not {max_tokens}")
            tokens = tokens[:max_tokens]
        return model, tokens, _windows(tokens, n_ctx, model.bos)
    except BaseException:
        model.close()
        raise


def perplexity(
    model: str | Path,
    *,
    text: str | Path | None = None,
    n_ctx: int | None = None,
    max_tokens: int | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int | str | None = "auto",
    progress: Progress | None = None,
) -> Perplexity:
    """Perplexity of `model` on `text` (a file; default: the shipped text)."""
    path = Path(model)
    g = read_gguf(path)
    body, name = _read_text(text)
    n = _window_len(g, n_ctx)
    lm, tokens, windows = _prepare(path, body, n, max_tokens, n_threads, n_gpu_layers)
    scorer, t0 = _Scorer(), time.perf_counter()
    with lm:
        for i, (window, first) in enumerate(windows):
            _score_window(np.asarray(window[first:]), [lm.window_logits(window, first)], [scorer])
            if progress:
                progress(i + 1, len(windows))
    return scorer.perplexity(path, name, n, len(windows), len(tokens), time.perf_counter() - t0)


def compare(base: str | Path, other: str | Path, **kw) -> Comparison:
    """Perplexity of both models, KL(base || other) and top-1 agreement on the same windows.
    Keywords as compare_many."""
    return compare_many(base, [other], **kw)[0]


def compare_many(
    base: str | Path,
    others: Sequence[str | Path],
    *,
    text: str | Path | None = None,
    n_ctx: int | None = None,
    max_tokens: int | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int | str | None = "auto",
    progress: Progress | None = None,
) -> list[Comparison]:
    """Compare several models with one base; the base is evaluated once per window."""
    paths = [Path(base)] + [Path(o) for o in others]
    if len(paths) < 2:
        raise InvalidParameterError("compare_many needs at least one model to compare with the base")
    files = [read_gguf(p) for p in paths]
    for g in files[1:]:
        check_same_vocabulary(files[0], g)
    body, name = _read_text(text)
    n = min(_window_len(g, n_ctx) for g in files)
    first_model, tokens, windows = _prepare(paths[0], body, n, max_tokens, n_threads, n_gpu_layers)
    models = [first_model]
    try:
        for p in paths[1:]:
            models.append(LogitsModel(p, n_ctx=n, n_threads=n_threads or os.cpu_count(), n_gpu_layers=n_gpu_layers))
            if models[-1].n_vocab != models[0].n_vocab:
                raise QuantError(
                    f"different vocabularies: {models[0].n_vocab} tokens in {paths[0]}, {models[-1].n_vocab} in {p}"
                )
        scorers = [_Scorer() for _ in paths]
        seconds = [0.0] * len(paths)
        for i, (window, first) in enumerate(windows):
            logits = []
            for k, m in enumerate(models):
                t0 = time.perf_counter()
                logits.append(m.window_logits(window, first))
                seconds[k] += time.perf_counter() - t0
            _score_window(np.asarray(window[first:]), logits, scorers)
            if progress:
                progress(i + 1, len(windows))
    finally:
        for m in models:
            m.close()
    ppl = [s.perplexity(p, name, n, len(windows), len(tokens), t) for s, p, t in zip(scorers, paths, seconds)]
    return [_comparison(ppl[0], ppl[k], scorers[k]) for k in range(1, len(paths))]


def _comparison(base: Perplexity, other: Perplexity, scorer: _Scorer) -> Comparison:
    kl = np.concatenate(scorer.kl)
    return Comparison(
        base=base,
        other=other,
        kl_mean=float(kl.mean()),
        kl_median=float(np.median(kl)),
        kl_p99=float(np.percentile(kl, 99)),
        kl_max=float(kl.max()),
        top1_agreement=scorer.agree / scorer.n,
    )


def _vocab_bytes(g: GGUFFile) -> Iterator[bytes | str]:
    tokens = g.get(Keys.Tokenizer.LIST)
    if isinstance(tokens, ArrayRef):
        with open(g.path, "rb") as f:
            f.seek(tokens.offset)
            yield f.read(tokens.nbytes)
    else:
        yield repr(tokens)


def check_same_vocabulary(a: GGUFFile, b: GGUFFile) -> None:
    """Raise QuantError unless both files carry the same token list (KL needs one tokenizer)."""
    ta, tb = a.get(Keys.Tokenizer.LIST), b.get(Keys.Tokenizer.LIST)
    if ta is None or tb is None:
        missing = a.path if ta is None else b.path
        raise QuantError(f"{missing} has no {Keys.Tokenizer.LIST}: cannot check that the vocabularies match")
    if len(ta) != len(tb):
        raise QuantError(f"different vocabularies: {len(ta)} tokens in {a.path}, {len(tb)} in {b.path}")
    if list(_vocab_bytes(a)) != list(_vocab_bytes(b)):
        raise QuantError(f"different vocabularies: {a.path} and {b.path} have the same size but different tokens")
