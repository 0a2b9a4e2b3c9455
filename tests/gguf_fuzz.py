"""Seeded GGUF mutants, and a child process that hands them to llama.cpp: what the fuzz tests share.

Each mutant is one kind of damage to a small model that loads: random header bytes, extreme
64-bit values, truncation, other alignments (laid out for the alignment or left stale), nested
metadata arrays (deep, many, lying counts, unknown item types), damaged tensor infos (dims, type
ids, names, offsets, data sizes) and damaged hyperparameters or vocabulary arrays.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from gguf import GGUFValueType as VT
from gguf import Keys

from ondevice.gguf.reader import read_gguf
from tests.gguf_craft import SCALAR_DTYPES, Parts, array, join, kv, offsets, scalar, split, string

__all__ = ["KINDS", "mutants", "damaged_vocabulary", "load_in_child"]

_SCALARS = [vt for vt in VT if vt not in (VT.STRING, VT.ARRAY)]
_EXTREMES = [0, 1, 2, 31, 33, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**62, 2**63, 2**64 - 1]
_ALIGNMENTS = [0, 1, 2, 3, 4, 8, 12, 16, 24, 32, 48, 64, 128, 256, 4096, 2**31, 2**32 - 1]


def mutants(model: Path, n: int, seed: int) -> Iterator[tuple[str, bytes]]:
    """n (kind, file bytes) pairs, the kinds in turn; the same seed gives the same files."""
    original = model.read_bytes()
    parts = split(model)
    header_end = read_gguf(model).data_offset
    rng = np.random.default_rng(seed)
    for case in range(n):
        kind = KINDS[case % len(KINDS)]
        yield kind, _MUTATORS[kind](rng, original, parts.copy(), header_end)


def damaged_vocabulary(tiny_model, folder, seed: int):
    """The tiny model with its vocabulary damaged at random (one of several ways, by seed)."""
    import random

    from ondevice.quant.synth import synthetic_vocab

    rng = random.Random(seed)
    tokens: list[str | bytes] = list(synthetic_vocab(512)[0])
    how = rng.choice(["duplicate", "empty", "nul", "not-utf8", "same", "long", "model"])
    picks = rng.sample(range(len(tokens)), rng.randint(1, 50))
    for i in picks:
        tokens[i] = {
            "duplicate": tokens[(i + 1) % len(tokens)],
            "empty": "",
            "nul": f"{tokens[i]}\x00{i}",
            "not-utf8": bytes([0x80 + rng.randrange(0x7F), 0xFF]),
            "same": tokens[0],
            "long": "x" * rng.randint(1000, 70000),
            "model": tokens[i],
        }[how]
    parts = split(tiny_model)
    entry = kv("tokenizer.ggml.tokens", VT.ARRAY, array(VT.STRING, [string(t) for t in tokens]))
    parts.kvs = [e for e in parts.kvs if b"tokenizer.ggml.tokens" not in e[:40]] + [entry]
    if how == "model":
        model = rng.choice(["gpt2", "bert", "t5", "rwkv", "plamo2", "none", "", "llama\x00"])
        parts.kvs = [e for e in parts.kvs if b"tokenizer.ggml.model" not in e[:40]]
        parts.kvs.append(kv("tokenizer.ggml.model", VT.STRING, string(model)))
    path = folder / f"vocab-{seed}.gguf"
    path.write_bytes(join(parts))
    return path


def _pick(rng: np.random.Generator, options: list):
    return options[int(rng.integers(0, len(options)))]


def _flip(rng, data: bytes, parts: Parts, header_end: int) -> bytes:
    out = bytearray(data)
    for pos in rng.integers(0, header_end, size=int(rng.integers(1, 8))):
        out[pos] = int(rng.integers(0, 256))
    return bytes(out)


def _extreme(rng, data: bytes, parts: Parts, header_end: int) -> bytes:
    out = bytearray(data)
    pos = int(rng.integers(0, header_end - 8))
    out[pos : pos + 8] = _pick(rng, _EXTREMES).to_bytes(8, "little")
    return bytes(out)


def _truncate(rng, data: bytes, parts: Parts, header_end: int) -> bytes:
    return data[: int(rng.integers(0, len(data)))]


def _alignment(rng, data: bytes, parts: Parts, header_end: int) -> bytes:
    value = _pick(rng, _ALIGNMENTS)
    vtype = VT.UINT32 if rng.random() < 0.8 else _pick(rng, [VT.UINT8, VT.UINT16, VT.UINT64, VT.INT32, VT.STRING])
    if vtype == VT.STRING:
        body = string(str(value))
    else:
        dtype = SCALAR_DTYPES[vtype]
        value %= 1 << (8 * dtype.itemsize - (dtype.kind == "i"))  # what the type can hold
        body = scalar(vtype, value)
    parts.kvs.insert(int(rng.integers(0, len(parts.kvs) + 1)), kv("general.alignment", vtype, body))
    parts.kvs.append(kv("fuzz.pad", VT.STRING, string(b"p" * int(rng.integers(0, 64)))))  # moves the header end
    proper = vtype == VT.UINT32 and 0 < value <= 4096 and not value & (value - 1)
    layout = value if proper and rng.random() < 0.7 else _pick(rng, [8, 16, 32, 64])  # else stale padding/offsets
    return join(parts, layout_alignment=layout)


def _nested_body(rng, depth: int) -> bytes:
    """An array body (item type, count, items), nested up to 6 deep; sometimes its count lies,
    its item type is unknown, or it holds thousands of empty arrays."""
    lie = _pick(rng, [1, 2**20, 2**40, 2**63]) if rng.random() < 0.1 else 0
    if depth >= 6 or rng.random() < 0.35:
        item = _pick(rng, _SCALARS + [VT.STRING])
        n = int(rng.integers(0, 5))
        items = [string(b"s" * int(rng.integers(0, 4))) if item == VT.STRING else scalar(item, 1) for _ in range(n)]
        item_type = _pick(rng, [13, 255, 2**31]) if rng.random() < 0.05 else int(item)
        return array(item_type, items, count=n + lie)
    r = rng.random()
    n = int(rng.integers(0, 5)) if r < 0.9 else int(rng.integers(1000, 20000)) if r < 0.98 else 70000
    inner = [_nested_body(rng, depth + 1) for _ in range(n)] if n < 50 else [array(VT.UINT8, [])] * n
    return array(VT.ARRAY, inner, count=n + lie)


def _nested(rng, data: bytes, parts: Parts, header_end: int) -> bytes:
    for _ in range(int(rng.integers(1, 3))):
        body = _nested_body(rng, 1)
        key = f"fuzz.nested{int(rng.integers(0, 100))}"
        parts.kvs.insert(int(rng.integers(0, len(parts.kvs) + 1)), kv(key, VT.ARRAY, body))
    return join(parts)


def _tensor(rng, data: bytes, parts: Parts, header_end: int) -> bytes:
    t = _pick(rng, parts.tensors)
    what = int(rng.integers(0, 9))
    if what == 0:  # number of dims
        t.dims = _pick(rng, [[], t.dims[:1], t.dims + [1], t.dims + [1, 1, 1], t.dims + [2]])
    elif what == 1:  # one dim
        t.dims[int(rng.integers(0, len(t.dims)))] = _pick(rng, _EXTREMES + [t.dims[0] * 2, 16])
    elif what == 2:  # type id
        t.type_id = _pick(rng, [int(rng.integers(0, 48)), 4, 5, 2**31, 2**32 - 1])
    elif what == 3:  # name
        other = _pick(rng, parts.tensors).name
        t.name = _pick(
            rng,
            [
                other,
                b"",
                b"x" * int(rng.integers(60, 70)),
                b"\xff\xfe.weight",
                b"blk.9.attn_q.weight",
                b"blk.0.nonsense.weight",
                t.name + b"\x00x",
            ],
        )
    elif what == 4:  # offset
        at = offsets(parts)[parts.tensors.index(t)]
        t.offset = max(0, at + _pick(rng, [-32, -16, -8, -1, 1, 8, 16, 32, 64, 4096, 2**40]))
    elif what == 5:  # data size (moves the tensors after it)
        t.data = t.data[: int(rng.integers(0, len(t.data)))]
    elif what == 6:  # drop a tensor
        parts.tensors.remove(t)
    elif what == 7:  # swap two tensors' places in the table
        i, j = rng.integers(0, len(parts.tensors), size=2)
        parts.tensors[i], parts.tensors[j] = parts.tensors[j], parts.tensors[i]
    else:  # a count that lies
        return join(parts, n_tensors=len(parts.tensors) + _pick(rng, [-1, 1, 2**20]))
    return join(parts)


def _key(entry: bytes) -> bytes:
    (n,) = struct.unpack_from("<Q", entry, 0)
    return entry[8 : 8 + n]


def _metadata(rng, data: bytes, parts: Parts, header_end: int) -> bytes:
    i = int(rng.integers(0, len(parts.kvs)))
    key = _key(parts.kvs[i])
    what = int(rng.integers(0, 6))
    if what == 0:  # another scalar value, maybe of another type
        vtype = _pick(rng, [VT.UINT32, VT.UINT32, VT.INT32, VT.UINT64, VT.FLOAT32, VT.BOOL, VT.UINT8])
        value = _pick(rng, [0, 1, 2, 3, 7, 64, 511, 512, 513, 2**16, 2**31 - 1, 2**32 - 1])
        if vtype in (VT.INT32,):
            value = min(value, 2**31 - 1) * _pick(rng, [1, -1])
        elif vtype in (VT.UINT8, VT.BOOL):
            value %= 2 if vtype == VT.BOOL else 256
        parts.kvs[i] = kv(key, vtype, scalar(vtype, value))
    elif what == 1:  # a string
        parts.kvs[i] = kv(key, VT.STRING, string(_pick(rng, [b"", b"llama", b"gemma3", b"gpt2", b"\xff" * 5])))
    elif what == 2:  # an array of ints (per-layer values, token types, ids)
        n = _pick(rng, [0, 1, 2, 3, 511, 512, 513])
        vals = rng.integers(-3, 600, size=n) if rng.random() < 0.5 else np.full(n, _pick(rng, [0, 1, 6, 99, 2**31 - 1]))
        parts.kvs[i] = kv(key, VT.ARRAY, array(VT.INT32, [scalar(VT.INT32, int(v)) for v in vals]))
    elif what == 3:  # an array of strings (vocabulary, merges)
        n = _pick(rng, [0, 1, 259, 511, 512, 513])
        toks = [
            _pick(rng, [b"a", b"", b"<s>", b"\xff", b"ab"]) + str(j).encode() * int(rng.random() < 0.9)
            for j in range(n)
        ]
        parts.kvs[i] = kv(key, VT.ARRAY, array(VT.STRING, [string(t) for t in toks]))
    elif what == 4:  # drop it
        del parts.kvs[i]
    else:  # twice, or an empty key
        parts.kvs.insert(i, _pick(rng, [parts.kvs[i], kv(b"", VT.UINT32, scalar(VT.UINT32, 1))]))
    return join(parts)


# hyperparameters llama.cpp reads for every architecture (some only asserted, not checked)
_HPARAMS = [
    Keys.LLM.BLOCK_COUNT,
    Keys.LLM.NEXTN_PREDICT_LAYERS,
    Keys.LLM.EXPERT_COUNT,
    Keys.LLM.EXPERT_USED_COUNT,
    Keys.LLM.EXPERT_GROUP_COUNT,
    Keys.LLM.EXPERT_GROUP_USED_COUNT,
    Keys.LLM.CONTEXT_LENGTH,
    Keys.LLM.EMBEDDING_LENGTH,
    Keys.LLM.FEED_FORWARD_LENGTH,
    Keys.Attention.HEAD_COUNT,
    Keys.Attention.HEAD_COUNT_KV,
    Keys.Attention.KEY_LENGTH,
    Keys.Attention.VALUE_LENGTH,
    Keys.Attention.SLIDING_WINDOW,
    Keys.Rope.DIMENSION_COUNT,
    Keys.Rope.SCALING_TYPE,
]


def _hparams(rng, data: bytes, parts: Parts, header_end: int) -> bytes:
    for _ in range(int(rng.integers(1, 4))):
        key = _pick(rng, _HPARAMS).format(arch="llama")
        if key.endswith(".type"):
            entry = kv(key, VT.STRING, string(_pick(rng, [b"none", b"linear", b"yarn", b"longrope", b"", b"bogus"])))
        elif rng.random() < 0.2:  # per layer
            vals = [_pick(rng, [0, 1, 2, 4, 8]) for _ in range(_pick(rng, [1, 2, 2, 3]))]
            entry = kv(key, VT.ARRAY, array(VT.UINT32, [scalar(VT.UINT32, v) for v in vals]))
        else:
            entry = kv(
                key,
                VT.UINT32,
                scalar(VT.UINT32, _pick(rng, [0, 1, 2, 3, 4, 8, 16, 64, 511, 512, 513, 1024, 1025, 2**31])),
            )
        at = next((i for i, e in enumerate(parts.kvs) if _key(e) == key.encode()), None)
        if at is None:
            parts.kvs.append(entry)
        else:
            parts.kvs[at] = entry
    return join(parts)


_MUTATORS: dict[str, Callable[..., bytes]] = {
    "flip": _flip,
    "extreme": _extreme,
    "truncate": _truncate,
    "alignment": _alignment,
    "nested": _nested,
    "tensor": _tensor,
    "metadata": _metadata,
    "hparams": _hparams,
}
KINDS = tuple(_MUTATORS)

# Loads each path named on stdin through the one model-open path, plain CPU buffers; says
# "begin i" before and "loaded i" / "refused i" after, so a death names the file it died on.
_LOADER = """
import sys
from pathlib import Path
import llama_cpp
from ondevice.core.errors import ModelLoadError
from ondevice.llama.guard import Verdict
from ondevice.llama.model import load_model
for line in sys.stdin:
    index, path = line.rstrip("\\n").split(" ", 1)
    print("begin", index, flush=True)
    try:
        model, _ = load_model(Path(path), n_gpu_layers=0, verdict=Verdict("none", "test", "fuzz"), first_open=False)
    except ModelLoadError:
        print("refused", index, flush=True)
    else:
        llama_cpp.llama_model_free(model)
        print("loaded", index, flush=True)
"""


def load_in_child(paths: list[Path], timeout_s: float = 600) -> dict[int, tuple[str, str]]:
    """Index of each path -> (outcome, detail): "loaded", "llama_refused" (llama.cpp said no and
    the process lived on) or "crashed" (the child died while loading it: detail has the exit
    status and llama.cpp's last words). After a crash a new child goes on with the rest."""
    env = dict(os.environ, GGML_NO_BACKTRACE="1")  # no gdb backtrace on abort: faster, quieter
    results: dict[int, tuple[str, str]] = {}
    pending = list(range(len(paths)))
    while pending:
        feed = "".join(f"{i} {paths[i]}\n" for i in pending)
        out = subprocess.run(
            [sys.executable, "-c", _LOADER], input=feed, capture_output=True, text=True, timeout=timeout_s, env=env
        )
        begun = None
        for line in out.stdout.splitlines():
            word, index = line.split()
            if word == "begin":
                begun = int(index)
            else:
                results[int(index)] = ("loaded" if word == "loaded" else "llama_refused", "")
                begun = None
        if begun is None:
            if out.returncode != 0 or any(i not in results for i in pending):
                raise AssertionError(f"loader child failed outside any load (rc {out.returncode}): {out.stderr[-800:]}")
        else:
            last = [ln for ln in out.stderr.splitlines() if ln.strip()][-3:]
            results[begun] = ("crashed", f"rc {out.returncode}: {' | '.join(last)}")
        pending = [i for i in pending if i not in results]
    return results
