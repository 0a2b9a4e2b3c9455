"""`ondevice chat [MODEL]`: the terminal chat with live latency stats (Textual, imported lazily).

ondevice chat                                   # the chat model (registry default_chat: an instruct model)
ondevice chat MODEL --system "You are terse." --temperature 0.7
ondevice chat --resume                          # reopen the last conversation
ondevice chat --list                            # saved conversations, then exit
ondevice chat --export ID --out chat.md         # Markdown (or .json), then exit
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

from ondevice.cli.engine_args import add_engine_args, add_retime_arg, engine_kwargs
from ondevice.cli.sampling_args import add_sampling_args, sampling_settings
from ondevice.core.errors import InvalidParameterError
from ondevice.core.paths import check_destination
from ondevice.core.textclean import printable
from ondevice.engine.sampling import CHAT_MAX_TOKENS

__all__ = ["register", "run"]


def register(sub) -> None:
    p = sub.add_parser(
        "chat",
        help="chat in the terminal, with live latency stats",
        description="A terminal chat (Textual) showing TTFT, every inter-token gap and the predicted ceiling.",
    )
    p.add_argument(
        "model", nargs="?", help="registry name or .gguf path (default: the registry's chat model, an instruct model)"
    )
    p.add_argument(
        "--system",
        default=None,
        help=f'system prompt (default: none; with the built-in chat model, "{CHAT_MODEL_SYSTEM}"; "" for none)',
    )
    add_sampling_args(p)
    p.add_argument(
        "-n",
        "--max-tokens",
        type=int,
        default=CHAT_MAX_TOKENS,
        help=f"tokens per answer at most (default {CHAT_MAX_TOKENS})",
    )
    p.add_argument(
        "-c",
        "--n-ctx",
        type=int,
        default=None,
        help="context window in tokens, 256 up to the model's trained context; 0 = the trained context "
        "(default 4096, or the trained context when smaller)",
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: physical cores)")
    p.add_argument("--n-gpu-layers", default="auto", help="'auto' (all when the build can offload), or a count")
    add_retime_arg(p)
    p.add_argument(
        "--resume",
        nargs="?",
        const="last",
        default=None,
        metavar="ID",
        help="reopen the last conversation, or the one with this id",
    )
    p.add_argument("--no-history", action="store_true", help="do not save this chat")
    p.add_argument("--history-db", type=Path, default=None, help=argparse.SUPPRESS)  # tests, scripts
    p.add_argument("--list", action="store_true", help="list saved conversations and exit")
    p.add_argument("--export", metavar="ID", help="write a saved conversation to --out and exit")
    p.add_argument("--out", type=Path, help="export file: .md (Markdown) or .json; its folder must exist")
    p.add_argument("--force", action="store_true", help="replace an existing --out file (refused without it)")
    p.add_argument(
        "--speculative",
        choices=("lookup",),
        default=None,
        help="speculative decoding by prompt lookup (the answers are what plain decoding gives; "
        "the stats panel shows the acceptance)",
    )
    add_engine_args(p)
    p.set_defaults(func=run)


# The built-in chat model (135M parameters) answers a question under a plain assistant system prompt; under its
# template's own default it tends to list things about the subject instead.
CHAT_MODEL_SYSTEM = "You are a helpful assistant."


def system_prompt(args) -> str | None:
    """--system as given; without it, the built-in chat model gets CHAT_MODEL_SYSTEM (another model: none)."""
    if args.system is not None or args.model is not None:
        return args.system
    return CHAT_MODEL_SYSTEM


def run(args) -> int:
    from ondevice.tui.session import ChatSettings
    from ondevice.tui.store import HistoryStore

    sampling = sampling_settings(args)
    settings = ChatSettings(
        system_prompt(args), sampling["temperature"], sampling["top_p"], args.max_tokens, args.speculative
    ).validated()
    # the settings screen edits temperature and top_p; the other sampler flags hold for the whole session
    fixed = {k: v for k, v in sampling.items() if not hasattr(settings, k)}
    from ondevice.engine.loader import resolve_n_ctx

    if args.n_ctx is not None:
        resolve_n_ctx(args.n_ctx)  # the same rule as `run` and load(); the trained context once the model is known
    if args.list or args.export:
        return _history_command(args)
    layers = args.n_gpu_layers if args.n_gpu_layers == "auto" else _int_arg("--n-gpu-layers", args.n_gpu_layers)
    from ondevice.models.materialize import resolve_chat_model

    path = resolve_chat_model(args.model)  # a bad model name fails here: one line, exit 2
    if args.n_ctx is not None:  # before the screen is taken, not as a load error under it
        from ondevice.gguf.spec import inspect

        resolve_n_ctx(args.n_ctx, inspect(path).n_ctx_train)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise InvalidParameterError(
            "ondevice chat needs a terminal (stdin and stdout must be a TTY); use `ondevice run` in scripts"
        )
    store = None if args.no_history else HistoryStore(args.history_db)
    resume = _resume_id(store, args.resume)
    load_kwargs = {"n_ctx": args.n_ctx, "n_threads": args.threads, "n_gpu_layers": layers, "retime": args.retime}
    load_kwargs |= engine_kwargs(args)
    if load_kwargs.pop("fit"):  # chosen before the app takes the screen, and said on the terminal
        load_kwargs.update(_fit(path, load_kwargs))
    from ondevice.llama.guard import cpu_buffer_verdict

    cpu_buffer_verdict()  # a first-contact self-test, and its one line, before the app takes the screen
    return _run_app(path, settings, store, resume, load_kwargs, fixed)


def _fit(path: Path, kw: dict) -> dict:
    """--fit: the context and offload that fit, said in one line; engine.load's n_ctx and n_gpu_layers."""
    from ondevice.engine.loader import resolve_n_ctx
    from ondevice.engine.memcheck import plan_fit
    from ondevice.gguf.spec import inspect

    spec = inspect(path).with_kv_cache(kw["cache_type_k"], kw["cache_type_v"])
    choice = plan_fit(
        path,
        spec,
        ctx_max=resolve_n_ctx(kw["n_ctx"] or 0, spec.n_ctx_train),
        n_ubatch=kw["n_ubatch"],
        flash_attn=kw["flash_attn"],
        n_gpu_layers=kw["n_gpu_layers"],
    )
    print(f"ondevice: --fit: {choice.reason}", file=sys.stderr, flush=True)
    return {"n_ctx": choice.n_ctx, "n_gpu_layers": choice.n_gpu_layers if kw["n_gpu_layers"] != 0 else 0}


def _run_app(path: Path, settings, store, resume: int | None, load_kwargs: dict, sampling: dict) -> int:
    from ondevice.tui.app import ChatApp

    def factory():
        from ondevice.api import load

        return load(path, **load_kwargs)

    app = ChatApp(
        factory, settings=settings, store=store, model_label=path.name, resume=resume, extra_sampling=sampling
    )
    try:
        with _log_to_file():
            app.run()
    finally:
        if app.controller.engine is not None:
            app.controller.engine.close()
        if store is not None:
            store.close()
    return 0


def _resume_id(store, resume: str | None) -> int | None:
    if resume is None:
        return None
    if store is None:
        raise InvalidParameterError("--resume needs the history (drop --no-history)")
    if resume == "last":
        cid = store.last_conversation_id()
        if cid is None:
            raise InvalidParameterError("--resume: no saved conversation yet")
        return cid
    cid = _int_arg("--resume", resume)
    _say_damage(store.path, store.load(cid).notes)  # HistoryError (one line, exit 2) when there is no such one
    return cid


MAX_DAMAGE_LINES = 5  # a badly damaged database is said in a few lines, not one per row


def _say_damage(db: Path, notes) -> None:
    """The values a damaged history database had replaced or left out, on stderr (the command goes on)."""
    notes = list(notes)
    for note in notes[:MAX_DAMAGE_LINES]:
        print(f"ondevice: history {db}: {printable(note)}", file=sys.stderr)
    if len(notes) > MAX_DAMAGE_LINES:
        print(f"ondevice: history {db}: {len(notes) - MAX_DAMAGE_LINES} more damaged values", file=sys.stderr)


def _history_command(args) -> int:
    import time

    from ondevice.tui.store import HistoryStore

    store = HistoryStore(args.history_db)
    try:
        if args.export:
            if args.out is None:
                raise InvalidParameterError("--export needs --out FILE (.md or .json)")
            # the rule for every file the CLI writes: an existing file only with --force, never a
            # directory or special file, and the folder must already exist
            check_destination(args.out, force=args.force)
            cid = _int_arg("--export", args.export)
            _say_damage(store.path, store.load(cid).notes)
            print(store.export(cid, args.out))
            return 0
        found = store.list_conversations(limit=1000)
        _say_damage(store.path, [note for c in found for note in c.notes])
        for c in found:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(c.updated_at))
            print(f"{c.id:>5}  {when}  {c.n_messages:>3} msg  {printable(c.model)}  {printable(c.title)}")
        return 0
    finally:
        store.close()


@contextlib.contextmanager
def _log_to_file() -> Iterator[None]:
    """While the TUI owns the terminal, log records go to chat.log in the data dir, not to stderr."""
    from ondevice.core import paths

    root = logging.getLogger()
    saved = root.handlers[:]
    try:
        folder = paths.data_dir()
        folder.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(folder / "chat.log", encoding="utf-8")
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.handlers = [handler]
    try:
        yield
    finally:
        root.handlers = saved
        handler.close()


def _int_arg(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidParameterError(f"{name} must be an integer, not {value!r}") from None
