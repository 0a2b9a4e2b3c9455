"""Hostile GGUF input (issue 13), the load path: what llama.cpp asserts on (aborts) instead
of refusing is refused by the load check before llama.cpp opens the file. Each case here
aborted llama.cpp in a child process before the check knew it."""

from __future__ import annotations

import struct

import pytest
from gguf import GGUFValueType as VT
from gguf import Keys
from ondevice.quant.synth import SynthConfig, build_synthetic_model, synthetic_vocab

from ondevice.core.errors import GGUFFormatError
from ondevice.gguf.loadcheck import inspect_for_load
from ondevice.gguf.reader import read_gguf
from ondevice.gguf.spec import inspect
from tests.gguf_craft import Parts, array, join, kv, scalar, split, string
from tests.gguf_fuzz import load_in_child

MMAP_ALIGNMENT_BYTES = 32  # where llama.cpp's CPU buffer over the mapped file must start (ggml TENSOR_ALIGNMENT)


def with_alignment(parts: Parts, alignment: int, data_mod_32: int | None) -> bytes:
    """The model laid out for `alignment`, a padding key chosen so that its data section starts
    `data_mod_32` bytes past a 32-byte boundary (None: any)."""
    for pad in range(64):
        p = parts.copy()
        p.kvs += [
            kv("general.alignment", VT.UINT32, scalar(VT.UINT32, alignment)),
            kv("x.pad", VT.STRING, string("p" * pad)),
        ]
        data = join(p, layout_alignment=alignment)
        start = len(data) - sum(-(-len(t.data) // alignment) * alignment for t in p.tensors)
        if data_mod_32 is None or start % MMAP_ALIGNMENT_BYTES == data_mod_32:
            return data
    raise AssertionError(f"no padding puts the data at {data_mod_32} mod 32 with alignment {alignment}")


ALIGNMENT_CASES = [(a, 0) for a in (1, 2, 4, 8, 16, 32, 64, 128)] + [(1, 5), (2, 6), (4, 12), (8, 8), (8, 24), (16, 16)]


def test_alignments_llama_cpp_cannot_map_are_refused_and_the_rest_load(tiny_model, tmp_path):
    """general.alignment 1..16 let the tensor data start off a 32-byte boundary, and llama.cpp
    aborts (GGML_ASSERT "buffer pointer must be aligned") on such a file: the load check
    refuses it. Every other layout either loads in a child process or is refused by us."""
    parts = split(tiny_model)
    to_load, refused = [], []
    for alignment, mod in ALIGNMENT_CASES:
        path = tmp_path / f"a{alignment}-{mod}.gguf"
        path.write_bytes(with_alignment(parts, alignment, mod))
        assert read_gguf(path).alignment == alignment  # the header itself is fine: `info` shows it
        try:
            inspect_for_load(path)
        except GGUFFormatError as exc:
            assert "32-byte" in str(exc), exc
            refused.append((alignment, mod))
        else:
            to_load.append(path)
    assert refused == [(a, m) for a, m in ALIGNMENT_CASES if m], refused
    outcomes = load_in_child(to_load)
    assert [outcomes[i][0] for i in range(len(to_load))] == ["loaded"] * len(to_load), outcomes


def test_stale_alignment_rewritten_in_place_is_refused(tiny_model, tmp_path):
    """general.alignment changed without moving the data: 64 leaves offsets unaligned (refused
    by the reader); 1..8 move the data section under the tensors (refused by the load check)."""
    parts = split(tiny_model)
    for alignment in (1, 2, 4, 8, 64):
        p = parts.copy()
        p.kvs.append(kv("general.alignment", VT.UINT32, scalar(VT.UINT32, alignment)))
        p.kvs.append(kv("x.pad", VT.STRING, string("p" * 3)))
        path = tmp_path / f"stale{alignment}.gguf"
        path.write_bytes(join(p, layout_alignment=32))
        with pytest.raises(GGUFFormatError):
            inspect_for_load(path)


def u32(key: str, value: int) -> bytes:
    return kv(key.format(arch="llama"), VT.UINT32, scalar(VT.UINT32, value))


def f32(key: str, value: float) -> bytes:
    return kv(key.format(arch="llama"), VT.FLOAT32, scalar(VT.FLOAT32, value))


def with_tokens(tokens: list[str]) -> bytes:
    return kv("tokenizer.ggml.tokens", VT.ARRAY, array(VT.STRING, [string(t) for t in tokens]))


_TOKENS = synthetic_vocab(512)[0]
# one thing each that llama.cpp asserts (aborts on) while it loads, instead of refusing it
ASSERTED = {
    "nextn layers > layers": [u32(Keys.LLM.NEXTN_PREDICT_LAYERS, 3)],
    "experts used, no experts": [u32(Keys.LLM.EXPERT_USED_COUNT, 2)],
    "more used than experts": [u32(Keys.LLM.EXPERT_COUNT, 2), u32(Keys.LLM.EXPERT_USED_COUNT, 4)],
    "experts, none used": [u32(Keys.LLM.EXPERT_COUNT, 4)],
    "too many experts": [u32(Keys.LLM.EXPERT_COUNT, 1025), u32(Keys.LLM.EXPERT_USED_COUNT, 2)],
    "expert groups >= experts": [
        u32(Keys.LLM.EXPERT_COUNT, 4),
        u32(Keys.LLM.EXPERT_USED_COUNT, 2),
        u32(Keys.LLM.EXPERT_GROUP_COUNT, 4),
    ],
    "expert groups, no experts": [u32(Keys.LLM.EXPERT_GROUP_COUNT, 2)],
    "unknown RoPE scaling": [kv(Keys.Rope.SCALING_TYPE.format(arch="llama"), VT.STRING, string("bogus"))],
    "two equal tokens": [with_tokens(_TOKENS[:300] + [_TOKENS[299]] + _TOKENS[301:])],
    "tokens equal up to a NUL": [with_tokens(_TOKENS[:300] + [_TOKENS[299] + "\x00x"] + _TOKENS[301:])],
    "empty token named like its stand-in": [with_tokens(_TOKENS[:300] + ["", "[EMPTY_300]"] + _TOKENS[302:])],
    "RMS norm epsilon NaN": [f32(Keys.Attention.LAYERNORM_RMS_EPS, float("nan"))],
    "RMS norm epsilon negative": [f32(Keys.Attention.LAYERNORM_RMS_EPS, -1e-5)],
    "norm epsilon negative": [f32(Keys.Attention.LAYERNORM_EPS, -1.0)],
    "tokenizer model none with tokens": [kv(Keys.Tokenizer.MODEL, VT.STRING, string("none"))],
    "every token empty": [with_tokens([""] * len(_TOKENS))],
    "a token not UTF-8": [
        kv(
            "tokenizer.ggml.tokens",
            VT.ARRAY,
            array(
                VT.STRING,
                [string(t) for t in _TOKENS[:300]] + [string(b"\xff\xfe")] + [string(t) for t in _TOKENS[301:]],
            ),
        )
    ],
}


@pytest.mark.parametrize("case", list(ASSERTED))
def test_what_llama_cpp_asserts_is_refused_before_loading(tiny_model, tmp_path, case):
    parts = split(tiny_model)
    for entry in ASSERTED[case]:  # replace the key if the model has it, else add it
        key = entry[8 : 8 + struct.unpack_from("<Q", entry)[0]]
        parts.kvs = [e for e in parts.kvs if e[8 : 8 + struct.unpack_from("<Q", e)[0]] != key] + [entry]
    path = tmp_path / "m.gguf"
    path.write_bytes(join(parts))
    inspect(path)  # `info` still describes it
    with pytest.raises(GGUFFormatError):
        inspect_for_load(path)


def test_more_layers_than_llama_cpp_supports_is_refused(tmp_path):
    """llama.cpp asserts 0 < block_count <= LLAMA_MAX_LAYERS (512); a 513-layer model whose
    tensors are all there is refused (512 layers load: checked by hand, a few seconds more)."""
    small = SynthConfig(d_model=32, n_head=1, n_head_kv=1, d_ff=32, n_vocab=259, n_layer=513)
    over = build_synthetic_model(small, tmp_path / "l513.gguf")
    with pytest.raises(GGUFFormatError, match="513 layers"):
        inspect_for_load(over)


def test_token_list_of_another_type_is_refused(tiny_model, tmp_path):
    parts = split(tiny_model)
    parts.kvs = [e for e in parts.kvs if b"tokenizer.ggml.tokens" not in e[:40]] + [u32("tokenizer.ggml.tokens", 7)]
    path = tmp_path / "m.gguf"
    path.write_bytes(join(parts))
    with pytest.raises(GGUFFormatError, match="not an array of strings"):
        inspect_for_load(path)
