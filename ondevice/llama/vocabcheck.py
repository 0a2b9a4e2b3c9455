"""The first-open check's child: `python -m ondevice.llama.vocabcheck PATH`.

Opens PATH with llama.cpp vocab-only (the architecture, hyperparameters and vocabulary are read
and checked, no weights: fast even for a large model) and round-trips a short text through the
tokenizer. What llama.cpp asserts on instead of refusing (GGML_ASSERT, an uncaught C++ exception)
kills this child by a signal, not the caller. Exit 0 = opened; exit 3 = llama.cpp refused the
file (the caller's own load says why); death by a signal = it aborts llama.cpp.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

SAMPLE_TEXT = "Hello, world! 123 ünïcödé\n\tend"  # letters, digits, punctuation, non-ASCII, whitespace


def every_byte_text() -> str:
    """Text whose UTF-8 holds every byte value but 0 and the never-used 0xC0, 0xC1, 0xF5-0xFF: each
    code point below 0x800, then one for each lead byte of the longer forms. A tokenizer that falls
    back to byte tokens for what its vocabulary lacks needs each of them (llama.cpp aborts where one is
    missing, std::out_of_range from byte_to_token, on the first text that needs it)."""
    three = [chr(cp) for cp in (0x800, *range(0x1000, 0x10000, 0x1000))]  # leads E0 to EF, no surrogate
    four = [chr(0x10000 * k) for k in range(1, 17, 3)]  # leads F0 to F4
    return "".join(chr(cp) for cp in range(1, 0x800)) + "".join(three + four)


REFUSED_EXIT = 3


def open_vocab_only(path: Path) -> int:
    import llama_cpp as lib

    from ondevice.llama.model import load_vocab_only

    model = load_vocab_only(path, lib)
    if not model:
        return REFUSED_EXIT
    try:
        _round_trip(lib, lib.llama_model_get_vocab(model))
    finally:
        lib.llama_model_free(model)
    return 0


def _round_trip(lib, vocab) -> None:
    """Tokenize SAMPLE_TEXT and every byte value, then turn every token of the vocabulary back into text
    (what generation does with each token it samples; a few hundred milliseconds for the largest vocabularies)."""
    for sample in (SAMPLE_TEXT, every_byte_text()):
        text = sample.encode()
        ids = (lib.llama_token * (len(text) + 8))()
        lib.llama_tokenize(vocab, text, len(text), ids, len(ids), True, True)
    piece = ctypes.create_string_buffer(256)
    for token in range(lib.llama_vocab_n_tokens(vocab)):
        lib.llama_token_to_piece(vocab, token, piece, len(piece), 0, True)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m ondevice.llama.vocabcheck",
        description="the first-open child",
        epilog=f"exit 0: opened; exit {REFUSED_EXIT}: llama.cpp refused the file; killed by a signal: it aborts",
    )
    parser.add_argument("path", type=Path, help="the GGUF file to open vocab-only")
    return open_vocab_only(parser.parse_args(argv).path)  # the parent reads the exit status, nothing printed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
