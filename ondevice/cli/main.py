"""Entry point: parse arguments, dispatch, turn typed errors into one line + exit 2."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ondevice.errors import OndeviceError

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
)

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ondevice",
        description="Run quantized GGUF models locally and see why they are as fast as they are.",
    )
    parser.add_argument("--log-level", default="WARNING", help="log level for ondevice and llama.cpp (default WARNING)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = ["ondevice", *(sys.argv[1:] if argv is None else argv)]  # as typed, for result records
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    level = getattr(logging, str(args.log_level).upper(), logging.WARNING)
    logging.basicConfig(level=level, stream=sys.stderr, format="%(name)s: %(message)s")
    # llama.cpp's own warnings (model-file quirks, cache layout) only at --log-level INFO or lower
    logging.getLogger("ondevice.llama_cpp").setLevel(level if level <= logging.INFO else logging.ERROR)
    try:
        return int(args.func(args) or 0)
    except OndeviceError as exc:
        print(f"ondevice: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("ondevice: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
