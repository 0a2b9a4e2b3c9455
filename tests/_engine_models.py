"""Test models for the engine: a synthetic llama whose greedy output is chosen token by token.

`build_successor_model` starts from ondevice.quant.synth's tiny F32 llama and rewrites its weights
in place: every block matrix is zero (attention and FFN add nothing to the residual), the
embedding of each "from" token is a one-hot vector, and the output head maps that vector
to the wanted next token. The logits are then 80 for the successor and 0 elsewhere, so
greedy decoding follows the chains exactly; a token that is in no chain predicts token 0.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gguf import GGUFReader
from ondevice.quant.synth import SynthConfig, build_synthetic_model, synthetic_vocab

__all__ = ["build_successor_model", "token_id", "byte_ids", "chain_text", "BOS", "EOS"]

BOS, EOS = 1, 2
_N_VOCAB = 512
_D_MODEL = 64


def token_id(piece: str) -> int:
    """Id of a vocabulary piece of the synthetic vocab ("\u2581" marks a leading space)."""
    tokens, _, _ = synthetic_vocab(_N_VOCAB)
    return tokens.index(piece)


def byte_ids(text: str) -> list[int]:
    """The byte-fallback token ids spelling `text` in UTF-8 (byte b is token 3 + b)."""
    return [3 + b for b in text.encode("utf-8")]


def build_successor_model(path: Path, chains: Sequence[Sequence[int]], chat_template: str | None = None) -> Path:
    """Write a model where, greedily, each chain element is followed by the next one."""
    cfg = SynthConfig(dtype="F32", n_vocab=_N_VOCAB, d_model=_D_MODEL, n_layer=1, seed=0, chat_template=chat_template)
    build_synthetic_model(cfg, path)
    successor: dict[int, int] = {}
    for chain in chains:
        for a, b in zip(chain, chain[1:]):
            if successor.setdefault(a, b) != b:
                raise ValueError(f"token {a} cannot have two successors ({successor[a]} and {b})")
    if len(successor) > _D_MODEL:
        raise ValueError(f"at most {_D_MODEL} distinct 'from' tokens")
    reader = GGUFReader(path, "r+")
    tensors = {t.name: t.data for t in reader.tensors}
    for name, data in tensors.items():
        if name.startswith("blk.") and not name.endswith("norm.weight"):
            data[...] = 0
    emb, head = tensors["token_embd.weight"], tensors["output.weight"]  # (n_vocab, d_model) each
    assert emb.shape == (_N_VOCAB, _D_MODEL) and head.shape == (_N_VOCAB, _D_MODEL)
    emb[...] = 0
    head[...] = 0
    for dim, (a, b) in enumerate(sorted(successor.items())):
        emb[a, dim] = 1.0
        head[b, dim] = 10.0
    reader.data.flush()
    del reader, tensors, emb, head
    return path


def chain_text(ids: Sequence[int]) -> bytes:
    """The bytes a chain of synthetic-vocab ids spells (for expectations)."""
    tokens, _, _ = synthetic_vocab(_N_VOCAB)
    out = bytearray()
    for i in ids:
        piece = tokens[i]
        if piece.startswith("<0x") and piece.endswith(">"):
            out.append(int(piece[3:-1], 16))
        elif piece.startswith("<"):
            continue
        else:
            out += piece.replace("\u2581", " ").encode("utf-8")
    return bytes(out)


def successor_engine(folder: Path, chains: Sequence[Sequence[int]]) -> Iterator[Any]:
    """A fixture's body: the successor model of `chains` in `folder`, loaded (n_ctx 256, one
    thread) for the fixture's scope and closed after."""
    from ondevice.engine import load

    with load(build_successor_model(folder / "succ.gguf", chains), n_ctx=256, n_threads=1) as eng:
        yield eng
