"""The file-type mixes a spec from numbers predicts with (roofline.spec.QUANT_MIXES) against llama.cpp's own choice:
its quantizer's dry run on Llama 3.1 8B's header (a sparse file, no data), for every file type this build has."""

from __future__ import annotations

import math

import pytest
from ondevice.quant.hfconfig import header_from_hf_config
from ondevice.quant.quantize import file_type, file_types
from ondevice.quant.twin import quantized_header, write_twin

from ondevice.core.errors import QuantError
from ondevice.llama.quantize import supports_file_type, tensor_types
from ondevice.roofline.model import bits_per_weight
from ondevice.roofline.spec import QUANT_MIXES, mix_bits_per_weight
from tests.hf_headers import hf_config

# MXFP4_MOE's mix is a mixture of experts' (a dense block's matrices get Q8_0); a float file's blocks are its one type
NOT_A_DENSE_MIX = {"MXFP4_MOE", "F32"}


@pytest.fixture(scope="module")
def dry_runs(tmp_path_factory):
    """{file type: (bits per weight over the blocks' matrices, the output head's type)} from llama.cpp's dry run."""
    header = header_from_hf_config(hf_config("llama-3.1-8b"))
    sizes = {t.name: math.prod(t.shape) for t in header.tensors}
    src = write_twin(header, tmp_path_factory.mktemp("mixes") / "llama-8b.gguf", sparse=True)
    out = {}
    for name, ftype in file_types(header_only=True).items():
        if name in NOT_A_DENSE_MIX or not supports_file_type(ftype.name, ftype.value):
            continue
        rc, types = tensor_types(src, ftype.value)
        if rc != 0:  # a type this build lists but does not quantize to
            continue
        blocks = {n: t for n, t in types.items() if n.startswith("blk.") and t != "F32"}
        bits = sum(sizes[n] * bits_per_weight(t) for n, t in blocks.items()) / sum(sizes[n] for n in blocks)
        out[name] = (bits, types["output.weight"])
    return out


def test_every_file_type_llama_cpp_quantizes_to_has_a_mix(dry_runs):
    assert {"Q4_K_M", "IQ2_XXS", "IQ1_M", "IQ3_M", "TQ1_0", "Q2_K_S"} <= set(dry_runs)
    assert set(dry_runs) <= set(QUANT_MIXES)


def test_each_mix_reads_as_many_bits_as_llama_cpps_choice(dry_runs):
    for name, (bits, head) in dry_runs.items():
        mix, mix_head = QUANT_MIXES[name]
        assert mix_bits_per_weight(mix) == pytest.approx(bits, rel=0.02), name
        assert mix_head == head, name


def test_a_header_takes_the_types_quantizing_to_needs_an_importance_matrix_for():
    header = quantized_header(header_from_hf_config(hf_config("qwen2.5-0.5b")), "IQ2_XXS")
    assert "IQ2_XXS" in {t.type for t in header.tensors}
    assert "IQ2_XXS" in file_types(header_only=True) and "IQ2_XXS" not in file_types()
    with pytest.raises(QuantError, match="needs an importance matrix"):
        file_type("iq2_xxs")
