"""A model's twin: the header copied exactly (names, shapes, types, every key with its value type),
valid random data that loads and generates in llama.cpp, the shape key, the layer tools, and the
per-tensor types of a file type from llama.cpp's quantizer dry run against the real quantizer."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFValueType, Keys
from ondevice.quant.header import Field, Header, TensorSpec, data_layout, encode_header, read_header
from ondevice.quant.quantize import quantize
from ondevice.quant.synth import SynthConfig, build_synthetic_model
from ondevice.quant.twin import (
    ModelData,
    is_gain,
    layer_signatures,
    matching_blocks,
    quantized_header,
    reduce_layers,
    shape_key,
    write_twin,
)

from ondevice.core.errors import QuantError, SpecError
from ondevice.llama.logits import LogitsModel
from ondevice.llama.quantize import parse_tensor_types

# Rows of 256 so the k-quants apply without fallbacks; 8 blocks so Q4_K_M's mix differs between blocks.
WIDE = SynthConfig(d_model=256, n_head=4, n_head_kv=2, d_ff=256, n_layer=8, n_vocab=512, seed=5)
SMALL = replace(WIDE, n_layer=2)  # the twin of each quantized type
# llama.cpp's quantizer applies these without an importance matrix
TYPES = ("Q4_0", "Q4_1", "Q5_K_M", "Q6_K", "Q8_0", "F16", "IQ4_XS", "Q3_K_M", "Q2_K")


@pytest.fixture(scope="module")
def tdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("twin")


@pytest.fixture(scope="module")
def wide(tdir) -> Path:
    return build_synthetic_model(WIDE, tdir / "wide-f16.gguf")


@pytest.fixture(scope="module")
def models(tdir) -> dict[str, Path]:
    small = build_synthetic_model(SMALL, tdir / "small-f16.gguf")
    return {t: quantize(small, tdir / f"small-{t}.gguf", t, threads=2) for t in TYPES}


def _generates(path: Path) -> None:
    """Loads through the engine and generates; the logits of a short window are finite and not all equal (the
    activations vary, as a real model's do)."""
    from ondevice.engine import load

    with load(path, n_ctx=256, n_threads=1) as eng:
        g = eng.generate("The tower is", max_tokens=4, temperature=0, ignore_eos=True)
    assert len(g.timings.itl_s) == 3
    with LogitsModel(path, n_ctx=256, n_threads=1) as m:
        logits = m.window_logits([1, 300, 301, 302, 303], 1)
    assert np.isfinite(logits).all() and logits.std() > 0


@pytest.mark.parametrize("qtype", TYPES)
def test_twin_has_the_model_header_and_generates(models, tdir, qtype):
    model = read_header(models[qtype])
    twin_path = write_twin(model, tdir / f"twin-{qtype}.gguf", seed=1)
    twin = read_header(twin_path)
    assert twin.fields == model.fields  # every key, value and value type, in order
    assert twin.tensors == model.tensors  # names, shapes, types, in order
    assert twin_path.stat().st_size == models[qtype].stat().st_size
    assert shape_key(twin) == shape_key(model)
    _generates(twin_path)


def test_header_reads_and_writes_back_byte_for_byte(models):
    path = models["Q4_K_M"] if "Q4_K_M" in models else models["Q5_K_M"]
    header = read_header(path)
    raw = encode_header(header)
    start, offsets = data_layout(header, len(raw))
    with open(path, "rb") as f:
        assert f.read(start)[: len(raw)] == raw
    from ondevice.gguf.reader import read_gguf

    assert [t.offset - start for t in read_gguf(path).tensors] == offsets


def test_twin_bytes_follow_the_seed(wide, tdir):
    header = read_header(wide)
    a = write_twin(header, tdir / "seed-a.gguf", seed=7).read_bytes()
    b = write_twin(header, tdir / "seed-b.gguf", seed=7).read_bytes()
    c = write_twin(header, tdir / "seed-c.gguf", seed=8).read_bytes()
    assert a == b and a != c and len(a) == len(c)


def test_sparse_twin_is_the_header_and_a_hole_of_full_size(models, tdir):
    header = read_header(models["Q8_0"])
    full = write_twin(header, tdir / "full.gguf")
    sparse = write_twin(header, tdir / "sparse.gguf", sparse=True)
    assert sparse.stat().st_size == full.stat().st_size
    assert read_header(sparse) == header
    start, _ = data_layout(header, len(encode_header(header)))
    data = np.fromfile(sparse, dtype=np.uint8, offset=start)
    assert data.size and not data.any()


def test_the_embedding_is_written_even_when_the_head_is_not_tied_to_it(wide, tdir):
    # a token reads one row of it, but zeros there make every activation zero and attention faster than real
    path = write_twin(read_header(wide), tdir / "twin.gguf")
    assert _tensor_bytes(path, "token_embd.weight").any() and _tensor_bytes(path, "output.weight").any()
    _generates(path)


def test_gains_are_written_around_one_and_weights_as_a_trained_model_holds_them(wide, tdir):
    # gains of a weight's size (0.02) shrink every activation to near zero, and a value-dependent kernel (GELU's
    # table, exp's range checks) then runs faster than on the model: a Gemma 3 270M twin prefilled ~10% faster
    path = write_twin(read_header(wide), tdir / "gains.gguf")
    header = read_header(path)
    gains = [t for t in header.tensors if is_gain(t.name)]
    assert {t.name for t in gains} >= {"output_norm.weight", "blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"}
    for t in gains:
        values = _tensor_bytes(path, t.name).view(np.float32)
        assert 0.9 < values.mean() < 1.1 and values.min() > 0
    q = _tensor_bytes(path, "blk.0.attn_q.weight").view(np.float16).astype(np.float32)
    assert abs(q.mean()) < 0.005 and 0.015 < q.std() < 0.025


@pytest.mark.parametrize(
    "name, gain",
    [
        ("blk.0.attn_norm.weight", True),
        ("blk.7.attn_q_norm.weight", True),
        ("blk.1.post_ffw_norm.weight", True),
        ("output_norm.weight", True),
        ("token_embd_norm.weight", True),
        ("rope_freqs.weight", True),
        ("rope_factors_long.weight", True),
        ("blk.0.attn_norm.bias", False),
        ("blk.0.attn_q.weight", False),
        ("blk.0.attn_q.bias", False),
        ("blk.0.ffn_gate_inp.weight", False),
        ("token_embd.weight", False),
        ("output.weight", False),
    ],
)
def test_gains_are_told_by_their_names(name, gain):
    assert is_gain(name) is gain


def _tensor_bytes(path: Path, name: str) -> np.ndarray:
    from ondevice.gguf.reader import read_gguf

    t = next(t for t in read_gguf(path).tensors if t.name == name)
    return np.fromfile(path, dtype=np.uint8, count=t.n_bytes, offset=t.offset)


# ---------- the shape key ----------


def _with_field(header: Header, key: str, field: Field) -> Header:
    return Header({**header.fields, key: field}, header.tensors)


def test_shape_key_follows_what_decides_speed_only(wide):
    header = read_header(wide)
    key = shape_key(header)
    assert len(key) == 16 and key == shape_key(read_header(wide))
    same = [
        _with_field(header, Keys.General.NAME, Field.string("another name")),
        _with_field(header, Keys.General.FILE_TYPE, Field.u32(7)),
        _with_field(header, Keys.Tokenizer.CHAT_TEMPLATE, Field.string("{{ messages }}")),
        _with_field(header, Keys.Tokenizer.LIST, replace(header.fields[Keys.Tokenizer.LIST], value=("x",) * 512)),
        _with_field(header, "llama.block_count", Field(GGUFValueType.INT32, WIDE.n_layer)),  # width of an int
        Header(dict(reversed(list(header.fields.items()))), header.tensors[::-1]),  # order
    ]
    assert {shape_key(h) for h in same} == {key}
    different = [
        _with_field(header, "llama.rope.freq_base", Field.f32(500000.0)),
        _with_field(header, Keys.Tokenizer.LIST, replace(header.fields[Keys.Tokenizer.LIST], value=("x",) * 511)),
        Header(
            header.fields, tuple(replace(t, type="Q8_0") if t.name == "output.weight" else t for t in header.tensors)
        ),
        Header(header.fields, header.tensors[:-1]),
        Header(
            header.fields,
            tuple(replace(t, name="x." + t.name) if t.name == "output.weight" else t for t in header.tensors),
        ),
    ]
    keys = [shape_key(h) for h in different]
    assert key not in keys and len(set(keys)) == len(keys)


def test_shape_key_counts_a_float32_as_the_file_holds_it(wide):
    header = read_header(wide)
    eps = header.fields["llama.attention.layer_norm_rms_epsilon"].value  # 1e-5 read back as float32
    assert eps != 1e-5
    assert shape_key(_with_field(header, "llama.attention.layer_norm_rms_epsilon", Field.f32(1e-5))) == shape_key(
        header
    )


# ---------- layers ----------


def test_layer_signatures_show_q4_k_m_mix(wide, tdir):
    header = read_header(quantize(wide, tdir / "wide-Q4_K_M.gguf", "Q4_K_M", threads=2, force=True))
    sigs = layer_signatures(header)
    assert len(sigs) == WIDE.n_layer
    assert len(set(sigs)) == 2  # attn_v and ffn_down get Q6_K in some blocks
    types = {dict((s, t) for s, _, t in sig)["attn_v.weight"] for sig in sigs}
    assert types == {"Q4_K", "Q6_K"}
    assert all(sig[0][0] == "attn_k.weight" and sig[0][1] == (256, 128) for sig in sigs)


def _header_with_signatures(pattern: str) -> Header:
    """A header whose block i has attn_v of type Q6_K where pattern[i] is 'b', else Q4_K."""
    tensors = [TensorSpec("token_embd.weight", (256, 512), "Q4_K")]
    for i, c in enumerate(pattern):
        tensors.append(TensorSpec(f"blk.{i}.attn_v.weight", (256, 256), "Q6_K" if c == "b" else "Q4_K"))
        tensors.append(TensorSpec(f"blk.{i}.attn_norm.weight", (256,), "F32"))
    fields = {
        Keys.General.ARCHITECTURE: Field.string("llama"),
        "llama.block_count": Field.u32(len(pattern)),
        "llama.attention.head_count_kv": Field.array(range(len(pattern)), GGUFValueType.UINT32),
        "llama.rope.dimension_sections": Field.array([1] * len(pattern), GGUFValueType.INT32),
    }
    return Header(fields, tuple(tensors))


def test_matching_blocks_apportion_signatures_by_largest_remainder():
    header = _header_with_signatures("bbaaaaab")  # 3 of 8 blocks "b"
    assert matching_blocks(header, 8) == list(range(8))
    picks = matching_blocks(header, 3)  # 3 * 5/8 = 1.875 "a", 3 * 3/8 = 1.125 "b": 2 and 1
    kinds = "".join("bbaaaaab"[i] for i in picks)
    assert sorted(kinds) == ["a", "a", "b"] and picks == sorted(picks)
    picks = matching_blocks(header, 4)  # 2.5 and 1.5: the tie goes to the signature met first ("b")
    assert sorted("bbaaaaab"[i] for i in picks) == ["a", "a", "b", "b"]
    for k in (0, 9):
        with pytest.raises(SpecError, match="1..8"):
            matching_blocks(header, k)


def test_reduce_layers_cuts_blocks_and_per_layer_arrays():
    header = _header_with_signatures("bbaaaaab")
    small = reduce_layers(header, 3, [2, 0, 7])
    assert small.n_layer == 3
    assert small.fields["llama.block_count"].type == GGUFValueType.UINT32
    assert small.fields["llama.attention.head_count_kv"].value == (0, 1, 2)
    assert small.fields["llama.rope.dimension_sections"].value == (1,) * 8  # not per layer
    names = [t.name for t in small.tensors]
    assert names == ["token_embd.weight"] + [
        f"blk.{i}.{s}" for i in range(3) for s in ("attn_v.weight", "attn_norm.weight")
    ]
    v_types = [t.type for t in small.tensors if t.name.endswith("attn_v.weight")]
    assert v_types == ["Q4_K", "Q6_K", "Q6_K"]  # from blocks 2, 0 and 7
    assert reduce_layers(header, 8) == Header(
        {**header.fields, "llama.block_count": Field.u32(8)}, header.tensors
    )  # the whole model: itself


@pytest.mark.parametrize(
    "n_keep, types_from, match",
    [(0, None, "1..8"), (9, None, "1..8"), (2, [0], "2 block indices"), (2, [0, 8], "2 block indices")],
)
def test_reduce_layers_refuses_bad_arguments(n_keep, types_from, match):
    with pytest.raises(SpecError, match=match):
        reduce_layers(_header_with_signatures("bbaaaaab"), n_keep, types_from)


def test_reduce_layers_refuses_a_type_that_does_not_fit():
    header = _header_with_signatures("ab")
    tensors = tuple(replace(t, shape=(32, 256)) if t.name == "blk.0.attn_v.weight" else t for t in header.tensors)
    tensors = tuple(replace(t, type="Q8_0") if t.name == "blk.0.attn_v.weight" else t for t in tensors)
    with pytest.raises(SpecError, match="cannot hold Q6_K"):
        reduce_layers(Header(header.fields, tensors), 1, [1])


def test_reduced_twin_of_a_quant_mix_loads_and_generates(wide, tdir):
    header = read_header(quantize(wide, tdir / "mix.gguf", "Q4_K_M", threads=2, force=True))
    small = reduce_layers(header, 3, matching_blocks(header, 3))
    assert read_header(write_twin(small, tdir / "small.gguf")) == small
    _generates(tdir / "small.gguf")


# ---------- a twin of a model you have: its own bytes ----------


def test_a_twin_of_every_block_with_its_models_data_is_the_model_byte_for_byte(models, tdir):
    model = models["Q5_K_M"]
    twin = write_twin(read_header(model), tdir / "own.gguf", model=ModelData(model))
    assert twin.read_bytes() == model.read_bytes()


def test_a_reduced_twin_holds_the_bytes_of_the_blocks_it_stands_for(wide, tdir):
    model = quantize(wide, tdir / "mix-own.gguf", "Q4_K_M", threads=2, force=True)
    header = read_header(model)
    small = reduce_layers(header, 2, [5, 2])  # twin blocks 0 and 1 with the types of the model's blocks 5 and 2
    own = ModelData(model, (0, 2))  # ... and the data of its blocks 0 and 2 where the types agree
    twin = write_twin(small, tdir / "own-small.gguf", model=own)
    assert read_header(twin) == small
    copied = {}
    for t in small.tensors:
        origin = t.name.replace("blk.1.", "blk.2.")
        model_type = next(m.type for m in header.tensors if m.name == origin)
        copied[t.name] = np.array_equal(_tensor_bytes(twin, t.name), _tensor_bytes(model, origin))
        assert copied[t.name] == (model_type == t.type), t.name  # the model's bytes where the type fits, else random
    assert copied["blk.1.ffn_down.weight"] and not copied["blk.0.ffn_down.weight"]  # Q4_K_M: block 0's is Q6_K
    assert copied["token_embd.weight"]
    _generates(twin)


def test_model_data_maps_each_twin_block_to_its_models():
    own = ModelData(Path("m.gguf"), (3, 0, 7))
    assert [own.origin(f"blk.{i}.attn_q.weight") for i in range(3)] == [f"blk.{b}.attn_q.weight" for b in (3, 0, 7)]
    assert own.origin("token_embd.weight") == "token_embd.weight"  # outside the blocks: its namesake
    assert ModelData(Path("m.gguf")).origin("blk.1.ffn_up.weight") == "blk.1.ffn_up.weight"


# ---------- per-tensor types of a file type, from the quantizer's dry run ----------

SHAPES = {
    "gqa": SynthConfig(d_model=256, n_head=8, n_head_kv=2, d_ff=256, n_layer=8, n_vocab=512, seed=1),
    "rows-not-256": SynthConfig(d_model=320, n_head=5, n_head_kv=1, d_ff=640, n_layer=3, n_vocab=600, seed=2),
    "rows-not-32": SynthConfig(d_model=256, n_head=4, n_head_kv=4, d_ff=200, n_layer=2, n_vocab=512, seed=3),
    "tied": SynthConfig(d_model=256, n_head=4, n_head_kv=1, d_ff=512, n_layer=3, tied_output=True, seed=4),
}
CASES = [("gqa", t) for t in ("Q4_K_M", "Q5_K_S", "Q3_K_L", "Q2_K", "IQ4_XS")]
CASES += [("rows-not-256", t) for t in ("Q4_K_M", "Q6_K", "IQ4_XS", "Q3_K_M")]
CASES += [("rows-not-32", t) for t in ("Q4_K_M", "Q8_0", "Q4_0")] + [("tied", t) for t in ("Q4_K_M", "Q4_0", "Q6_K")]


@pytest.mark.parametrize("shape, qtype", CASES)
def test_quantized_header_types_equal_the_quantizer(tdir, shape, qtype):
    src = build_synthetic_model(SHAPES[shape], tdir / f"src-{shape}.gguf")
    real = read_header(quantize(src, tdir / f"real-{shape}-{qtype}.gguf", qtype, threads=2, force=True))
    predicted = quantized_header(read_header(src), qtype)
    assert predicted.tensors == real.tensors  # each tensor's type, in the quantizer's order
    assert predicted.fields == real.fields  # file type and quantization version as the quantizer sets them


def test_quantized_header_refuses_a_quantized_header_and_an_unknown_type(models):
    with pytest.raises(QuantError, match="already quantized"):
        quantized_header(read_header(models["Q8_0"]), "Q4_K_M")
    with pytest.raises(QuantError, match="unknown quantization type"):
        quantized_header(read_header(models["F16"]), "Q9_K")


def test_parse_tensor_types_reads_kept_quantized_and_fallback_lines():
    log = (
        "warning: blk.0.ffn_down.weight - ncols 200 not divisible by 256 (required for type q4_K) "
        "-> falling back to q5_0\n"
        "[   1/   3] output.weight                - [   256,    512,      1,      1], type =    f16, "
        "size =     0.25 MiB ->     0.10 MiB (q6_K)\n"
        "[   2/   3] output_norm.weight           - [   256,      1,      1,      1], type =    f32, "
        "size =    0.001 MiB\n"
        "[   3/   3] blk.0.ffn_down.weight        - [   200,    256,      1,      1], type =    f16, "
        "size =     0.10 MiB ->     0.03 MiB (iq4_nl)\n"
    )
    assert parse_tensor_types(log) == {
        "output.weight": "Q6_K",
        "output_norm.weight": "F32",
        "blk.0.ffn_down.weight": "IQ4_NL",
    }
