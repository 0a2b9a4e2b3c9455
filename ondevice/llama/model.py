"""The one path that opens models and contexts in llama.cpp.

Every load (engine, quality/ladder, kernel probe, the native self-test) goes through
`load_model`: it builds the only `llama_model_params` in the tree and applies the machine's
crash-guard verdict (ondevice.llama.guard) to where the weights are placed. `new_context`
builds the context parameters from llama.cpp's defaults, changing only what is asked.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ondevice.core.errors import ModelLoadError
from ondevice.llama.buffers import REPACK, TensorOverrides, cpu_features, extra_buffer_types, repack_tensors
from ondevice.llama.firstopen import check_first_open
from ondevice.llama.guard import Verdict, cpu_buffer_verdict
from ondevice.llama.log import LOG_NAME, log_listener, raise_pending_interrupt, route_llama_log

__all__ = [
    "LlamaHandle",
    "fill_batch",
    "fill_batch_entries",
    "Placement",
    "llama_lib",
    "load_model",
    "place_weights",
    "new_context",
    "repack_plan",
    "repacked_bytes",
    "chat_formatter",
    "ErrorLines",
]

_log = logging.getLogger(LOG_NAME)


def llama_lib() -> Any:
    """llama-cpp-python's low-level binding, imported on first use (importing ondevice must not load llama.cpp)."""
    import llama_cpp

    return llama_cpp


RENDER_MAX_CHARS = 4 << 20  # the longest string a chat template may build or render (a prompt is far shorter)
RENDER_MAX_STEPS = 1_000_000  # range() steps summed over one render (nested loops multiply)


def chat_formatter(template: str, *, bos_token: str, eos_token: str) -> Any:
    """llama-cpp-python's Jinja renderer of a GGUF chat template: formatter(messages=[...]).prompt; bounded (a
    file's template is code from the file): range() steps per render, `*` and `**` results, and the output's
    length, each over its bound a jinja2 SecurityError."""
    import jinja2
    import jinja2.ext
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})
        steps = 0

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise SecurityError(f"a power of {right} in a chat template")
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > RENDER_MAX_CHARS:
                        raise SecurityError(f"a chat template builds a sequence of {len(seq) * n} items")
            return super().call_binop(context, operator, left, right)

        def bounded_range(self, *args: int) -> range:
            r = range(*args)
            self.steps += len(r)
            if self.steps > RENDER_MAX_STEPS:
                raise SecurityError(f"a chat template loops over {RENDER_MAX_STEPS} steps")
            return r

    class BoundedChatFormatter(Jinja2ChatFormatter):
        def __init__(self) -> None:
            # the base class's own __init__ compiles the template in an unbounded environment, and compiling folds
            # constants ({{ 10 ** 100000000 }} would run right there): its attributes are set here instead
            self.template, self.eos_token, self.bos_token = template, eos_token, bos_token
            self.add_generation_prompt, self.stop_token_ids = True, None
            env = BoundedSandbox(
                loader=jinja2.BaseLoader(),
                trim_blocks=True,
                lstrip_blocks=True,
                extensions=[Jinja2ChatFormatter.IgnoreGenerationTags, jinja2.ext.loopcontrols],
            )
            env.filters["tojson"] = self.tojson
            env.globals["range"] = env.bounded_range
            self._bounded = env
            self._environment = env.from_string(template)

        def __call__(self, **kwargs: Any) -> Any:
            self._bounded.steps = 0
            response = super().__call__(**kwargs)
            if len(response.prompt) > RENDER_MAX_CHARS:
                raise SecurityError(f"a chat template rendered {len(response.prompt)} characters")
            return response

    return BoundedChatFormatter()


class LlamaHandle:
    """The raw llama.cpp objects of one loaded model: model, context, vocabulary, memory.
    owns_model False: a second context on a model another handle owns (free() frees the context only)."""

    def __init__(self, lib: Any, model: Any, ctx: Any, *, owns_model: bool = True):
        self.lib = lib
        self.model = model
        self.ctx = ctx
        self.owns_model = owns_model
        self.vocab = lib.llama_model_get_vocab(model)
        self.memory = lib.llama_get_memory(ctx)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.n_ctx = int(lib.llama_n_ctx(ctx))  # llama.cpp may round the request up
        self.n_batch = int(lib.llama_n_batch(ctx))  # llama.cpp caps the request at n_ctx
        self.n_ubatch = int(lib.llama_n_ubatch(ctx))  # tokens per compute pass inside one llama_decode
        self.n_swa = int(lib.llama_model_n_swa(model))
        # some layers keep a recurrent state (llama.cpp's recurrent or hybrid memory: Mamba, RWKV, LFM2's short
        # convolutions): it holds every token it took in and cannot be cut back to a shorter prefix as a KV cache can
        self.recurrent = bool(lib.llama_model_is_recurrent(model) or lib.llama_model_is_hybrid(model))

    def free(self) -> None:
        if self.ctx:
            self.lib.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            if self.owns_model:
                self.lib.llama_model_free(self.model)
            self.model = None


def fill_batch_entries(batch: Any, entries: Iterable[tuple[int, int, int, bool]]) -> int:
    """Fill a llama_batch (from llama_batch_init, room for every entry) with (token, position,
    sequence id, keep logits) entries, in order; returns the number of tokens put in."""
    i = -1
    for i, (tok, pos, seq, want) in enumerate(entries):
        batch.token[i] = int(tok)
        batch.pos[i] = int(pos)
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = int(seq)
        batch.logits[i] = bool(want)
    batch.n_tokens = i + 1
    return i + 1


def fill_batch(batch: Any, tokens: Sequence[int], pos0: int, logits: Callable[[int], bool]) -> None:
    """Put `tokens` at positions pos0.. of sequence 0 into a llama_batch (from llama_batch_init);
    logits(i) says whether llama.cpp keeps the logits of the i-th."""
    fill_batch_entries(batch, ((tok, pos0 + i, 0, logits(i)) for i, tok in enumerate(tokens)))


@dataclass(frozen=True)
class Placement:
    """Where a model's CPU-side weights went."""

    cpu_buffers: str  # "all" | "repack" | "none": the extra CPU buffer types allowed (ondevice.llama.buffers)
    reason: str  # why: the crash guard's finding, e.g. "self-test: all: crashed (SIGSEGV); repack: ok"
    repacked_tensors: int  # weights placed in CPU_REPACK by name (repack mode only; in "all" llama.cpp decides)


def load_model(
    path: Path,
    *,
    n_gpu_layers: int,
    verdict: Verdict | None = None,
    lib: Any = None,
    cpu_only: bool = False,
    first_open: bool = True,
) -> tuple[Any, Placement]:
    """Open `path` (a validated GGUF); returns (llama_model pointer, Placement). Raises ModelLoadError.
    cpu_only: give the model no GPU device at all (llama.cpp's `--device none`), so that nothing runs
    on a GPU, not even the large batches llama.cpp otherwise hands a GPU build's device at n_gpu_layers 0.
    first_open: a file this machine has not opened before is first opened vocab-only in a child
    (ondevice.llama.firstopen), so that an abort in llama.cpp is a ModelLoadError (False: a caller that
    is itself such a child)."""
    if lib is None:
        import llama_cpp as lib  # lazy: importing ondevice must not load llama.cpp
    if first_open:
        check_first_open(Path(path))
    verdict = verdict or cpu_buffer_verdict()
    if verdict.mode == "unusable":
        raise ModelLoadError(verdict.note or "llama.cpp crashed in its self-test on this machine")
    route_llama_log(lib)
    lib.llama_backend_init()
    mparams = lib.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers
    if cpu_only:
        no_devices = (ctypes.c_void_p * 1)()  # empty, NULL-terminated; a local, so alive until the load returns
        mparams.devices = ctypes.addressof(no_devices)
    overrides = place_weights(mparams, path, verdict, lib)
    with ErrorLines() as errors:
        model = lib.llama_model_load_from_file(str(path).encode(), mparams)  # reads the override patterns
    _interrupted_after(model, lib.llama_model_free)
    if not model:
        raise ModelLoadError(f"{path}: llama.cpp could not load the model{errors.detail()}")
    return model, Placement(
        verdict.mode, f"{verdict.source}: {verdict.reason}", len(overrides.names) if overrides else 0
    )


def load_vocab_only(path: Path, lib: Any = None) -> Any:
    """Open `path` vocab-only (architecture, hyperparameters, vocabulary; no weights) with no device: the
    first-open check's child (ondevice.llama.vocabcheck). The llama_model pointer, NULL when llama.cpp refuses."""
    if lib is None:
        import llama_cpp as lib
    route_llama_log(lib)
    lib.llama_backend_init()
    mparams = lib.llama_model_default_params()
    mparams.vocab_only = True
    mparams.n_gpu_layers = 0
    no_devices = (ctypes.c_void_p * 1)()  # no GPU device: nothing to initialise for a vocabulary
    mparams.devices = ctypes.addressof(no_devices)
    return lib.llama_model_load_from_file(str(path).encode(), mparams)


def repack_plan(path: Path | str, lib: Any = None) -> list[str]:
    """Names of the weights in `path` that CPU_REPACK takes on this CPU (empty when the build has no
    CPU_REPACK or nothing qualifies)."""
    from ondevice.gguf.reader import read_gguf

    if lib is None:
        import llama_cpp as lib
    if REPACK not in extra_buffer_types():
        return []
    raw = lib.llama_print_system_info()
    features = cpu_features(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))
    return repack_tensors([(t.name, t.type_name, tuple(t.shape)) for t in read_gguf(path).tensors], features)


def repacked_bytes(path: Path | str, lib: Any = None) -> int:
    """Bytes of the weights CPU_REPACK copies out of `path` on this CPU (a second copy in RAM beside the
    mapped file); 0 when the build has no CPU_REPACK or nothing qualifies."""
    from ondevice.gguf.reader import read_gguf

    names = set(repack_plan(path, lib))
    return sum(t.n_bytes for t in read_gguf(path).tensors if t.name in names) if names else 0


def place_weights(mparams: Any, path: Path, verdict: Verdict, lib: Any = None) -> TensorOverrides | None:
    """Apply the verdict to llama_model_params: "all" leaves llama.cpp's choice; "repack" and "none"
    turn the extra buffer types off, and "repack" places by name what CPU_REPACK takes. Returns
    the override array, which must stay alive until llama.cpp has loaded the model."""
    if verdict.mode == "all":
        return None
    mparams.use_extra_bufts = False
    names = repack_plan(path, lib) if verdict.mode == "repack" else []
    if not names:
        return None
    overrides = TensorOverrides(names, extra_buffer_types()[REPACK])
    mparams.tensor_buft_overrides = overrides.pointer
    return overrides


def new_context(
    model: Any,
    *,
    n_ctx: int,
    n_threads: int,
    n_batch: int | None = None,
    n_ubatch: int | None = None,
    n_seq_max: int = 1,
    flash_attn_type: int | None = None,
    type_k: int | None = None,
    type_v: int | None = None,
    lib: Any = None,
) -> tuple[Any, bool | None]:
    """A context on `model`; None arguments keep llama.cpp's defaults. Returns (context pointer,
    flash attention in use: llama.cpp resolves "auto" while it builds the context, and says which in
    its log; None if it did not say). Raises ModelLoadError."""
    if lib is None:
        import llama_cpp as lib
    cparams = lib.llama_context_default_params()
    cparams.n_ctx = n_ctx
    cparams.n_seq_max = n_seq_max
    cparams.n_threads = cparams.n_threads_batch = n_threads
    cparams.no_perf = True
    for field, value in (
        ("n_batch", n_batch),
        ("n_ubatch", n_ubatch),
        ("flash_attn_type", flash_attn_type),
        ("type_k", type_k),
        ("type_v", type_v),
    ):
        if value is not None:
            setattr(cparams, field, value)
    resolved: list[bool] = []

    def on_log(text: str) -> None:
        if "Flash Attention enabled" in text or "Flash Attention not supported" in text:
            resolved.append("enabled" in text)

    with ErrorLines() as errors, log_listener(on_log):
        ctx = lib.llama_init_from_model(model, cparams)
    _interrupted_after(ctx, lib.llama_free)
    if not ctx:
        raise ModelLoadError(f"llama.cpp could not create a context of {n_ctx} tokens{errors.detail()}")
    fa_type = cparams.flash_attn_type
    if fa_type == lib.LLAMA_FLASH_ATTN_TYPE_AUTO:
        return ctx, (resolved[-1] if resolved else None)
    return ctx, fa_type == lib.LLAMA_FLASH_ATTN_TYPE_ENABLED


class ErrorLines(logging.Handler):
    """Keeps llama.cpp's error lines while inside, for the ModelLoadError message."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def __enter__(self) -> ErrorLines:
        _log.addHandler(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _log.removeHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.lines) < 5:
            self.lines.append(record.getMessage().strip())

    def detail(self) -> str:
        return f": {self.lines[-1]}" if self.lines else ""


def _interrupted_after(handle: Any, free: Any) -> None:
    """A Ctrl-C that landed in llama.cpp's log callback during the call that made `handle`: free it, then raise."""
    try:
        raise_pending_interrupt()
    except KeyboardInterrupt:
        if handle:
            free(handle)
        raise
