"""Entry point: parse arguments, dispatch, turn typed errors into one line + exit 2."""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import threading

from ondevice.core.errors import OndeviceError
from ondevice.llama.log import LOG_NAME  # the logger llama.cpp's lines go to (no llama.cpp import)

# Each module exposes register(subparsers); a registered parser sets `func(args) -> int`.
_COMMAND_MODULES = (
    "ondevice.cli.models",
    "ondevice.cli.info",
    "ondevice.cli.run",
    "ondevice.cli.chat",
    "ondevice.cli.bench",
    "ondevice.cli.quant",
    "ondevice.cli.probe",
    "ondevice.cli.predict",
    "ondevice.cli.twin",
)

EXIT_BAD_INPUT = 2
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, as a shell reports a process SIGTERM ended


class Terminated(KeyboardInterrupt):
    """SIGTERM, taken down Ctrl-C's path: the work stops, what finished is kept and said, the exit is 143."""


_terminated = threading.Event()  # a SIGTERM arrived during this command (a command may catch it and return 130)


def _raise_terminated(_signum, _frame) -> None:
    _terminated.set()
    raise Terminated


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ondevice",
        description="Run quantized GGUF models locally and see why they are as fast as they are.",
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        type=str.upper,
        choices=LOG_LEVELS,
        metavar="LEVEL",
        help=f"{', '.join(LOG_LEVELS)} (any case; default WARNING; llama.cpp's own lines at INFO and DEBUG)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # SIGTERM takes Ctrl-C's path from the start: one landing while the commands are imported or the
    # arguments parsed is said and exits 143 too, as a Ctrl-C there exits 130, never a traceback
    on_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if on_main_thread else None
    _terminated.clear()
    try:
        code = _dispatch(argv)
        return EXIT_TERMINATED if code == EXIT_INTERRUPTED and _terminated.is_set() else code
    except KeyboardInterrupt:
        terminated = _terminated.is_set()
        print(f"ondevice: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    finally:
        if on_main_thread:
            signal.signal(signal.SIGTERM, previous)


def _dispatch(argv: list[str] | None) -> int:
    """Parse and run the command; a typed error is one line and exit 2."""
    parser = build_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        _take_late_positionals(parser, args, extras)
    args.argv = ["ondevice", *(sys.argv[1:] if argv is None else argv)]  # as typed, for result records
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    _configure_logging(getattr(logging, args.log_level))
    try:
        return int(args.func(args) or 0)
    except OndeviceError as exc:
        print(f"ondevice: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a path the system refuses (name too long, permission denied): one line, not a traceback
        if exc.filename is None:
            raise
        print(f"ondevice: error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _take_late_positionals(parser: argparse.ArgumentParser, args: argparse.Namespace, extras: list[str]) -> None:
    """argparse fills a positional list only up to the first option: in `run MODEL -n 2 PROMPT`,
    PROMPT comes back unrecognized. A command that names its list in `late_positionals` gets
    such words appended; an unknown option is still an error (argparse's usage line, exit 2)."""
    dest = getattr(args, "late_positionals", None)
    words = [a for a in extras if a == "-" or not a.startswith("-")] if isinstance(dest, str) else []
    unknown = [a for a in extras if a not in words]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if isinstance(dest, str):
        getattr(args, dest).extend(words)


def _configure_logging(level: int) -> None:
    """Log records to stderr from `level` up. llama.cpp's own lines (logger ondevice.llama_cpp) only
    at INFO or lower: below that its warnings are dropped, and its errors reach only the load code,
    which quotes the one that matters in its one-line error (and the chat's log file)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    if level > logging.INFO:
        handler.addFilter(lambda record: not record.name.startswith(LOG_NAME))
    logging.basicConfig(level=level, handlers=[handler])
    logging.getLogger(LOG_NAME).setLevel(level if level <= logging.INFO else logging.ERROR)


if __name__ == "__main__":
    sys.exit(main())
