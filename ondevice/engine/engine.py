"""`load()` and the Engine: tokenize, stream, generate, chat, cancel, one request at a time."""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from time import perf_counter_ns
from typing import Any, Unpack

import psutil

from ondevice.core.cpuload import OtherCpu
from ondevice.core.errors import (
    ContextOverflowError,
    EngineBusyError,
    EngineError,
    InvalidParameterError,
    ModelLoadError,
)
from ondevice.core.results import Generation
from ondevice.core.textclean import clean_text
from ondevice.engine import state as kv_state
from ondevice.engine.batch import BatchContext
from ondevice.engine.interface import Predictor, StreamArgs
from ondevice.engine.loader import EngineInfo, sibling_context
from ondevice.engine.loop import KVCache, Request, TokenStream, cancel_poll, check_cancel, run_request
from ondevice.engine.sampling import DEFAULTS, make_params
from ondevice.engine.tokens import check_ids, detokenize_ids, token_reader, tokenize_bytes
from ondevice.llama.model import LlamaHandle

__all__ = ["Engine", "StreamArgs"]

_SEED_MOD = 2**32


class Engine:
    """A loaded model and its context. One generation at a time; a second one concurrently raises EngineBusyError."""

    def __init__(self, handle: LlamaHandle, info: EngineInfo, predictor: Predictor | None = None):
        self._h = handle
        self.info = info
        self.predictor = predictor
        self._kv = KVCache(handle)
        self._token_info = token_reader(handle)
        self._busy = threading.Lock()
        # Held around tokenize/detokenize (which may run beside a generation) so close() cannot free the
        # vocabulary under them; close() takes it after _busy, tokenize never takes _busy, so no cycle.
        self._native = threading.RLock()
        self._cancel: threading.Event | None = None
        self._requests = 0  # requests started: the default draw seed is info.seed + this
        self._closed = False
        self._template: Any = None  # chat template, built on first chat()
        self._batches: weakref.WeakSet[BatchContext] = weakref.WeakSet()  # live batch contexts, freed before the model
        self._siblings: weakref.WeakSet[Engine] = weakref.WeakSet()  # engines on this one's model (sibling)
        self._drafts: dict[str, Any] = {}  # draft model path -> DraftModel, loaded on first use, freed by close()
        # (verify tokens checked, most of them giving single-token logits): speculative.exact_verify_tokens
        self._exact = (1, 1)
        self._process = psutil.Process()  # this process, for each request's OtherCpu meter
        self._step_costs: dict[str, Any] = {}  # mode -> speculative.StepCost: step times its requests measured

    # ---- state -------------------------------------------------------------------------
    @property
    def n_ctx(self) -> int:
        return self.info.n_ctx

    @property
    def kv_cache_tokens(self) -> int:
        """Tokens whose keys/values the cache holds now."""
        return len(self._kv.tokens)

    def cached_prefix(self, ids: Sequence[int]) -> int:
        """How many leading tokens of `ids` the KV cache holds now (what a request with prefix reuse
        would not prefill; at most len(ids) - 1: the last prompt token is always computed)."""
        return self._kv.common_prefix(ids)

    @property
    def n_vocab(self) -> int:
        return self._h.n_vocab

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("this engine is closed")

    # ---- text <-> tokens ---------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]:
        """Text -> token ids. add_bos: add the model's BOS when its vocabulary asks for one; special: parse
        special-token text. Lone surrogates (bytes that were not UTF-8, escaped by Python) become U+FFFD,
        as in llama.cpp's tokenizer."""
        if not isinstance(text, str):
            raise InvalidParameterError(f"text must be a string, not {type(text).__name__}")
        with self._native:
            self._check_open()
            return self._tokenize_open(clean_text(text).encode("utf-8"), add_bos, special)

    def _tokenize_open(self, raw: bytes, add_bos: bool, special: bool) -> list[int]:
        return tokenize_bytes(self._h, raw, add_bos, special)

    def detokenize(self, ids: Sequence[int], *, special: bool = False) -> str:
        """Token ids -> text (invalid UTF-8 becomes U+FFFD)."""
        ids = self._check_ids(ids, allow_empty=True)
        if not ids:
            self._check_open()
            return ""
        with self._native:
            self._check_open()
            return self._detokenize_open(ids, special)

    def _detokenize_open(self, ids: list[int], special: bool) -> str:
        return detokenize_ids(self._h, ids, special)

    def _check_ids(self, ids: Any, *, allow_empty: bool = False) -> list[int]:
        return check_ids(ids, self._h.n_vocab, allow_empty=allow_empty)

    # ---- generation --------------------------------------------------------------------
    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = DEFAULTS.max_tokens,
        temperature: float = DEFAULTS.temperature,
        top_k: int = DEFAULTS.top_k,
        top_p: float = DEFAULTS.top_p,
        min_p: float = DEFAULTS.min_p,
        repeat_penalty: float = DEFAULTS.repeat_penalty,
        seed: int | None = DEFAULTS.seed,
        stop: str | Sequence[str] = DEFAULTS.stop,
        ignore_eos: bool = DEFAULTS.ignore_eos,
        cancel: threading.Event | None = None,
        reuse_prefix: bool = True,
        speculative: str | None = None,
        draft: str | Path | None = None,
        spec_k: int | None = None,
        exact: bool | None = None,
    ) -> TokenStream:
        """Start a generation; iterate the returned TokenStream for timed TokenEvents.

        A prompt given as text is tokenized (BOS added when the model wants it); token ids
        are used as they are. Raises ContextOverflowError before any work when prompt +
        max_tokens exceed n_ctx, EngineBusyError when a generation is already running.

        speculative="lookup" drafts tokens by prompt lookup, draft=PATH (speculative="draft")
        with a smaller GGUF of the same vocabulary; the target verifies every draft, so the
        output is what plain decoding gives (token for token when greedy). spec_k: most drafted
        tokens per step, 0..64 (default 16); the engine picks k per step. exact=True caps k where a
        verify batch gives single-token decoding's logits bit for bit (output identical to plain);
        exact=False lets k go to spec_k, chosen for speed (the model's greedy choice under batched
        arithmetic); None: speculative.DEFAULT_EXACT. The Generation's `speculative` holds the
        counts (ondevice.engine.speculative).
        """
        params = make_params(
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            repeat_penalty=repeat_penalty,
            seed=seed,
            stop=stop,
            ignore_eos=ignore_eos,
        )
        if not isinstance(reuse_prefix, bool):
            raise InvalidParameterError(f"reuse_prefix must be True or False, not {reuse_prefix!r}")
        check_cancel(cancel)  # before any work (a draft model's load below)
        self._check_open()
        # one-time set-up (a draft model's load, the batch check) is not part of the request's timings
        spec = self.speculator(speculative, draft, spec_k, exact)
        start_ns = perf_counter_ns()  # the request starts here: tokenization is part of TTFT
        if isinstance(prompt, str):
            ids = self.tokenize(prompt, add_bos=True, special=False)
            if not ids:
                raise InvalidParameterError("prompt is empty: no tokens to process")
        else:
            ids = self._check_ids(prompt)
        return self._start(ids, start_ns, perf_counter_ns(), params, cancel, reuse_prefix, spec=spec)

    def generate(self, prompt: str | Sequence[int], **kwargs: Unpack[StreamArgs]) -> Generation:
        """Run a generation to its end and return the Generation (same arguments as stream())."""
        ts = self.stream(prompt, **kwargs)
        for _ in ts:
            pass
        assert ts.generation is not None
        return ts.generation

    def speculator(self, speculative: Any = None, draft: Any = None, spec_k: Any = None, exact: Any = None) -> Any:
        """A Speculator for one request from stream()'s speculative arguments, checked before any
        work (InvalidParameterError; a draft model that is missing, malformed or of another
        vocabulary raises its typed error); None when none is asked for."""
        from ondevice.engine.speculative import Speculator, StepCost, exact_verify_tokens, spec_settings

        settings = spec_settings(speculative, draft, spec_k, exact)
        if settings is None:
            return None
        self._check_open()
        if self._h.recurrent:
            raise InvalidParameterError(
                "speculative decoding needs a KV cache that can drop rejected drafts; "
                "this model's recurrent state cannot"
            )
        drafter = self._draft_model(settings.draft).drafter() if settings.draft is not None else None
        want = settings.k_max + 1
        checked, exact_tokens = self._exact
        if not settings.exact:
            exact_tokens = want  # k for speed: bounded by spec_k only
        elif want > checked and exact_tokens == checked:  # not measured this far yet
            with self._holding():
                exact_tokens = exact_verify_tokens(self._h, self.info, self.tokenize, want)
            self._exact = (want, exact_tokens)
        if drafter is None:
            from ondevice.engine.drafters import PromptLookup

            drafter = PromptLookup()
        cost = self._step_costs.setdefault(settings.mode, StepCost(self.predictor))  # drafting costs differ by mode
        return Speculator(settings, drafter, self.predictor, k_cap=min(want, exact_tokens) - 1, cost=cost)

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """The engine's lock for work outside a generation (EngineBusyError while one runs)."""
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError("the engine is already generating; wait for it, cancel it, or use another engine")
        try:
            yield
        finally:
            self._busy.release()

    def _draft_model(self, ref: str) -> Any:
        from ondevice.engine.drafters import DraftModel
        from ondevice.llama.devices import gpu_layers
        from ondevice.models.materialize import resolve_model

        path = resolve_model(ref)  # ModelNotFoundError for a file that is not there
        key = str(path.resolve())
        if key not in self._drafts:
            with self._holding():
                layers = gpu_layers(self._h.lib, "auto", None)[0] if self.info.backend != "CPU" else 0
                self._drafts[key] = DraftModel(path, self._h, n_threads=self.info.n_threads, n_gpu_layers=layers)
        return self._drafts[key]

    def _start(
        self,
        ids: list[int],
        start_ns: int,
        tokenized_ns: int,
        params: Any,
        cancel: Any,
        reuse_prefix: bool,
        on_done: Any = None,
        think: Any = None,
        spec: Any = None,
    ) -> TokenStream:
        self._check_open()
        if len(ids) + params.max_tokens > self.n_ctx:
            raise ContextOverflowError(
                f"prompt of {len(ids)} tokens + max_tokens {params.max_tokens} = {len(ids) + params.max_tokens}"
                f" tokens exceeds the context window of {self.n_ctx} tokens"
            )
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError("the engine is already generating; wait for it, cancel it, or use another engine")
        try:
            own = self._cancel = threading.Event()
            is_cancelled = cancel_poll(own, cancel)
            seed = params.seed if params.seed is not None else (self.info.seed + self._requests) % _SEED_MOD
            self._requests += 1
            other = OtherCpu(self._process)
            req = Request(ids, start_ns, tokenized_ns, params, seed, is_cancelled, reuse_prefix, think, spec, other)
            gen = run_request(self._h, self._kv, req, self.info.n_batch, self.predictor, self._token_info)
        except BaseException:
            self._cancel = None
            self._busy.release()
            raise

        def on_end(generation: Generation | None) -> None:
            self._cancel = None
            self._busy.release()
            if on_done is not None:
                on_done(generation)

        return TokenStream(gen, own, on_end)

    # ---- control -----------------------------------------------------------------------
    def cancel(self) -> None:
        """Stop the running generation (a batch context's included) at its next step (finish_reason
        "cancelled"); thread-safe, no-op when idle."""
        ev = self._cancel
        if ev is not None:
            ev.set()
        for batch in list(self._batches):
            batch.cancel()

    @property
    def busy(self) -> bool:
        return self._busy.locked()

    def reset(self) -> None:
        """Empty the KV cache (the next request prefills its whole prompt)."""
        self._check_open()
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError("cannot reset the cache while a generation is running")
        try:
            self._kv.clear()
        finally:
            self._busy.release()

    def save_state(self, path: str | Path) -> int:
        """Write the KV cache (sequence 0: the tokens it holds, their K/V, the prompt's kept logits) to `path`,
        bound to this model file, llama.cpp build and context settings (ondevice.engine.state); atomically.
        The file's size in bytes. DestinationError when `path` cannot be written."""
        self._check_open()
        with self._holding():
            return kv_state.save_kv(self._h, self._kv, self.info, Path(path))

    def load_state(self, path: str | Path, prompt: Sequence[int] | None = None) -> int:
        """Restore a state save_state wrote; the number of tokens the cache then holds. With `prompt`, the
        saved tokens must be a prefix of it. StateFileError (the cache left empty: the caller recomputes) for a
        state of another model, build, context or prompt, or a truncated, damaged or special file."""
        self._check_open()
        with self._holding():
            return kv_state.load_kv(self._h, self._kv, self.info, path, prompt)

    def chat(self, system: str | None = None, **sampling_defaults: Any):
        """A multi-turn conversation on this engine (see ondevice.engine.chat.Chat)."""
        from ondevice.engine.chat import Chat

        return Chat(self, system=system, **sampling_defaults)

    def batched(self, n_seqs: int, seq_tokens: int | None = None) -> BatchContext:
        """A context for n_seqs sequences decoded together (ondevice.engine.batch), each holding
        seq_tokens (prompt + output; None: this engine's n_ctx, rounded up to 256) tokens, on this
        engine's model with its threads, n_batch, n_ubatch, flash attention and KV types.
        n_seqs must be 1..256 (llama.cpp's limit) and seq_tokens within the model's trained
        context, else InvalidParameterError before any work; ModelLoadError when llama.cpp
        cannot allocate it."""
        self._check_open()
        batch = BatchContext.open(self, self._h, self._busy, self._token_info, n_seqs, seq_tokens)
        self._batches.add(batch)
        return batch

    def sibling(self, n_ctx: int) -> Engine:
        """Another engine on this engine's model (its weights loaded once), with a context of its own of n_ctx tokens
        and this engine's other settings, no predictor: caches that do not meet (probing.timing decodes a long context
        and a short one in turn). Closed with this engine, if not before (loader.sibling_context)."""
        self._check_open()
        sibling = Engine(*sibling_context(self._h, self.info, n_ctx))
        self._siblings.add(sibling)
        return sibling

    def _warm_up(self) -> None:
        """One request of one token through the whole request path, then an empty cache (llama.cpp's own tools warm
        up with a llama_decode): the weights llama.cpp reads from the memory-mapped file are faulted in, its compute
        graph set up, and what else a process's first request pays once (7% of a 10-token prompt's TTFT on a VM,
        benchmarks/data/twin_speed/epyc-zen4-2vcpu-first-request.txt) is paid at load, not inside the first
        request's TTFT; its time counts in info.load_s. ModelLoadError when it fails."""
        t0 = perf_counter_ns()
        bos = max(0, int(self._h.lib.llama_vocab_bos(self._h.vocab)))
        try:
            with self.side_requests():
                self.generate([bos], max_tokens=1, ignore_eos=True, reuse_prefix=False, seed=0)
        except EngineError as exc:
            raise ModelLoadError(f"{self._h!r}: the warm-up request failed ({exc})") from exc
        self.reset()
        self.info = replace(self.info, load_s=self.info.load_s + (perf_counter_ns() - t0) * 1e-9)

    @contextlib.contextmanager
    def side_requests(self) -> Iterator[None]:
        """Requests made inside (timing runs on the caller's engine) leave the draw seed of the caller's later
        requests as it was: request k without a seed of its own still draws with info.seed + k."""
        before = self._requests
        try:
            yield
        finally:
            self._requests = before

    def close(self) -> None:
        """Free the model and context (and the batch contexts on it). Raises EngineBusyError while a generation runs."""
        if self._closed:
            return
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError("cannot close the engine while a generation is running; cancel it first")
        try:
            with self._native:
                self._closed = True
            for batch in list(self._batches):
                batch.close()
            for sibling in list(self._siblings):  # their contexts, before the model they share
                sibling.close()
            for d in self._drafts.values():
                d.close()
            self._drafts.clear()
            self._h.free()
        finally:
            self._busy.release()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and not self._busy.locked():
            try:
                self.close()
            except Exception:
                pass

    def __repr__(self) -> str:
        i = self.info
        return f"Engine({i.spec.name or i.model_path!r}, backend={i.backend}, n_ctx={i.n_ctx}, load_s={i.load_s:.3f})"
