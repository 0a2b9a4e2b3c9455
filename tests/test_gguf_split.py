"""A model split over several GGUF files (llama.cpp's gguf-split naming and keys): read from its first file
as one model, checked as llama.cpp's loader checks it, loaded and run; and the twins of a large model sharing
their second file (quant.twin.split_outside_blocks)."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFValueType, Keys
from ondevice.quant.header import Field, Header, read_header
from ondevice.quant.synth import SynthConfig, build_synthetic_model
from ondevice.quant.twin import reduce_layers, shape_key, split_outside_blocks, write_twin

from ondevice.cli.main import main
from ondevice.core.errors import GGUFFormatError, ModelNotFoundError
from ondevice.gguf.loadcheck import inspect_for_load
from ondevice.gguf.reader import read_gguf, split_path, split_paths
from ondevice.gguf.spec import inspect

CONFIG = SynthConfig(d_model=256, n_head=4, n_head_kv=2, d_ff=256, n_layer=3, n_vocab=512, seed=7)
NO, COUNT, TENSORS = Keys.Split.LLM_KV_SPLIT_NO, Keys.Split.LLM_KV_SPLIT_COUNT, Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    return build_synthetic_model(CONFIG, tmp_path_factory.mktemp("split") / "whole.gguf")


def _write_split(header: Header, folder: Path, *, sparse: bool = True, prefix: str = "model") -> Path:
    first, second = split_outside_blocks(header)
    write_twin(second, split_path(folder / prefix, 1, 2), sparse=sparse)
    return write_twin(first, split_path(folder / prefix, 0, 2), sparse=sparse)


def _with(header: Header, **fields: Field | None) -> Header:
    """header with keys set (None: removed); keys named with '__' for '.'."""
    out = dict(header.fields)
    for key, value in fields.items():
        key = key.replace("__", ".")
        out.pop(key, None)
        if value is not None:
            out[key] = value
    return Header(out, header.tensors)


def test_split_paths_follow_llama_cpp_naming(tmp_path):
    assert split_path(tmp_path / "m", 0, 3) == tmp_path / "m-00001-of-00003.gguf"
    assert split_paths(tmp_path / "m-00001-of-00003.gguf", 3)[2] == tmp_path / "m-00003-of-00003.gguf"
    with pytest.raises(GGUFFormatError, match="must be named <name>-00001-of-00002.gguf"):
        split_paths(tmp_path / "m.gguf", 2)


def test_a_split_model_reads_as_the_whole_model(whole, tmp_path):
    header = read_header(whole)
    first = _write_split(header, tmp_path)
    g = read_gguf(first)
    assert [(t.name, t.shape, t.ggml_type) for t in g.tensors] == [
        (t.name, t.shape, t.ggml_type) for part in g.files for t in part.tensors
    ]
    assert sorted(t.name for t in g.tensors) == sorted(t.name for t in header.tensors)
    assert {t.split for t in g.tensors if t.name.startswith("blk.")} == {0}
    assert {t.split for t in g.tensors if t.name == "token_embd.weight"} == {1}
    assert [f.path.name for f in g.files] == ["model-00001-of-00002.gguf", "model-00002-of-00002.gguf"]
    assert g.model_file_bytes == sum(p.stat().st_size for p in split_paths(first, 2))
    one, two = inspect(whole), inspect(first)
    for field in ("n_layer", "n_params", "weight_bytes", "decode_weight_bytes", "head_bytes", "n_tensors", "n_vocab"):
        assert getattr(two, field) == getattr(one, field), field
    assert two.file_bytes == g.model_file_bytes and two.header_bytes == sum(f.data_offset for f in g.files)
    back = read_header(first)  # the model's header as one file: no split keys, every tensor
    assert not [key for key in back.fields if key.startswith("split.")]
    assert sorted(back.tensors, key=lambda t: t.name) == sorted(header.tensors, key=lambda t: t.name)
    assert shape_key(back) == shape_key(header)


def test_a_split_model_loads_and_generates_in_llama_cpp(whole, tmp_path):
    from ondevice.engine import load

    first = _write_split(read_header(whole), tmp_path, sparse=False)
    assert inspect_for_load(first).n_layer == CONFIG.n_layer
    with load(first, n_ctx=256, n_threads=1) as eng:
        g = eng.generate("The tower is", max_tokens=4, temperature=0, ignore_eos=True)
    assert len(g.timings.itl_s) == 3


def test_twins_of_different_blocks_share_one_second_file(whole, tmp_path):
    header = read_header(whole)
    twins = [reduce_layers(header, n) for n in (1, 2)]
    few, more = (split_outside_blocks(twin) for twin in twins)
    assert few[1] == more[1] and {t.name for t in few[1].tensors} == {
        "token_embd.weight",
        "output_norm.weight",
        "output.weight",
    }
    assert [h.value(TENSORS) for h, _second in (few, more)] == [len(twin.tensors) for twin in twins]
    assert not [t for t in few[0].tensors + more[0].tensors if not t.name.startswith("blk.")]
    assert few[0].fields[NO].type == GGUFValueType.UINT16 and few[0].fields[TENSORS].type == GGUFValueType.INT32


@pytest.mark.parametrize(
    ("change", "error", "match"),
    [
        ({"first": {"split__no": Field(GGUFValueType.UINT16, 1)}}, GGUFFormatError, "opened by its first file"),
        ({"second": {"split__no": Field(GGUFValueType.UINT16, 0)}}, GGUFFormatError, "split.no is 0, expected 1"),
        ({"second": {"split__no": None}}, GGUFFormatError, "split.no is None, expected 1"),
        ({"first": {"split__tensors__count": Field(GGUFValueType.INT32, 5)}}, GGUFFormatError, "5 but the 2 files"),
        ({"first": {"split__count": Field(GGUFValueType.UINT16, 3)}}, GGUFFormatError, "must be named"),
        ({"remove": True}, ModelNotFoundError, "split 2 of 2 is missing"),
        ({"duplicate": True}, GGUFFormatError, "in more than one of its 2 split files"),
    ],
)
def test_a_broken_split_model_is_refused_with_one_line(whole, tmp_path, capsys, change, error, match):
    first_h, second_h = split_outside_blocks(read_header(whole))
    first_h = _with(first_h, **change.get("first", {}))
    second_h = _with(second_h, **change.get("second", {}))
    if change.get("duplicate"):
        second_h = Header(second_h.fields, (*second_h.tensors, first_h.tensors[0]))
        first_h = _with(first_h, split__tensors__count=Field(GGUFValueType.INT32, first_h.value(TENSORS) + 1))
    second = write_twin(second_h, split_path(tmp_path / "m", 1, 2), sparse=True)
    first = write_twin(first_h, split_path(tmp_path / "m", 0, 2), sparse=True)
    if change.get("remove"):
        second.unlink()
    with pytest.raises(error, match=match):
        read_gguf(first)
    assert main(["info", str(first)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and match.split(" ")[0] in err[0]


@pytest.mark.parametrize(
    "name, files",
    [
        ("m.gguf", ["m.gguf"]),
        ("m-00001-of-00003.gguf", ["m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"]),
        ("m-00002-of-00003.gguf", ["m-00002-of-00003.gguf"]),  # not the first: llama.cpp opens a model by its first
        ("m-00001-of-00001.gguf", ["m-00001-of-00001.gguf"]),
        ("-00001-of-00002.gguf", ["-00001-of-00002.gguf"]),  # no name before the split postfix
    ],
)
def test_model_files_are_a_split_models_every_file_by_name(tmp_path, name, files):
    from ondevice.gguf.reader import model_files

    assert model_files(tmp_path / name) == [tmp_path / f for f in files]  # by name alone: none of them exists
