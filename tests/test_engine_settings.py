"""llama.cpp's speed defaults and the KV cache types: load(), the CLI flags, the roofline's KV bytes."""

from __future__ import annotations

import pytest

from ondevice.cli.main import main
from ondevice.core.errors import InvalidParameterError
from ondevice.core.kvtypes import kv_bytes_per_element, kv_is_quantized
from ondevice.engine import load
from ondevice.gguf.spec import inspect


@pytest.fixture(scope="module")
def head32_model(synth_dir):
    """Heads of 32 dimensions: a multiple of the quantized cache types' block of 32."""
    from ondevice.quant.synth import SynthConfig, build_synthetic_model

    return build_synthetic_model(
        SynthConfig(d_model=128, n_head=4, n_head_kv=2, n_ctx_train=4096, seed=5), synth_dir / "head32.gguf"
    )


def test_defaults_are_llama_cpps(head32_model, offload_backend):
    with load(head32_model, n_ctx=4096, n_threads=1) as eng:
        info = eng.info
    assert (info.n_batch, info.n_ubatch) == (2048, 512)  # llama_context_default_params
    assert info.flash_attn == "auto"
    if offload_backend == "CPU":
        assert info.flash_attn_used is True  # the CPU backend has flash attention for every head size
    else:  # a GPU backend resolves "auto" itself (CUDA has no kernel for this model's 16-dim heads)
        assert info.flash_attn_used in (True, False)
    assert (info.cache_type_k, info.cache_type_v) == ("f16", "f16")


def test_batch_sizes_and_flash_attention_as_asked(tiny_model):
    with load(tiny_model, n_ctx=512, n_threads=1, n_batch=64, n_ubatch=32, flash_attn=False) as eng:
        assert (eng.info.n_batch, eng.info.n_ubatch, eng.info.flash_attn_used) == (64, 32, False)


@pytest.mark.parametrize("k, v", [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "f16")])
def test_quantized_kv_cache_generates_and_the_spec_follows(head32_model, k, v):
    with load(head32_model, n_ctx=256, n_threads=1, cache_type_k=k, cache_type_v=v) as eng:
        g = eng.generate("the tower", max_tokens=4, temperature=0, ignore_eos=True)
        spec = eng.info.spec
    assert g.timings.output_tokens == 4
    f16 = inspect(head32_model)
    assert spec.kv_cache_types == (k, v)
    # 2 layers x 2 KV heads x 32 dims, for K and for V
    expected = 2 * 2 * 32 * (kv_bytes_per_element(k) + kv_bytes_per_element(v))
    assert spec.kv_bytes_per_token == pytest.approx(expected) and f16.kv_bytes_per_token == 2 * 2 * 32 * 4


def test_a_cache_type_the_heads_cannot_take_is_a_clear_error(tiny_model):
    from ondevice.core.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="does not divide n_embd_head_k=16"):
        load(tiny_model, n_ctx=256, cache_type_k="q8_0")


def test_a_quantized_v_cache_needs_flash_attention(tiny_model):
    with pytest.raises(InvalidParameterError, match="needs flash attention"):
        load(tiny_model, n_ctx=256, cache_type_v="q8_0", flash_attn=False)
    with pytest.raises(InvalidParameterError, match="KV cache type"):
        load(tiny_model, n_ctx=256, cache_type_k="q3_k")


def test_kv_type_arithmetic():
    assert kv_bytes_per_element("f16") == 2 and kv_bytes_per_element("Q8_0") == 34 / 32
    assert kv_bytes_per_element("q4_0") == 18 / 32 and kv_is_quantized("q4_0") and not kv_is_quantized("bf16")


def test_memory_verdict_follows_the_cache_type(default_model):
    from ondevice.roofline.prediction import memory_verdict

    spec = inspect(default_model)
    f16 = memory_verdict(spec, n_ctx=32768, n_batch=512, available_bytes=None, where="RAM")
    q8 = memory_verdict(spec.with_kv_cache("q8_0", "q8_0"), n_ctx=32768, n_batch=512, available_bytes=None, where="RAM")
    assert q8.kv_bytes == pytest.approx(f16.kv_bytes * 34 / 64, rel=1e-3)


def test_run_line_names_the_settings(head32_model, capsys):
    rc = main(
        [
            "run",
            str(head32_model),
            "hello",
            "-n",
            "3",
            "-t",
            "0",
            "--threads",
            "1",
            "--no-predict",
            "-c",
            "256",
            "-ctk",
            "q8_0",
            "-ctv",
            "Q8_0",
            "-fa",
            "on",
            "-b",
            "128",
            "-ub",
            "64",
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 0 and len(err) == 1
    assert "batch 128/64, flash attn on, KV q8_0/q8_0, CPU buffers" in err[0]


def test_predict_takes_kv_cache_types(default_model, capsys):
    assert (
        main(
            [
                "predict",
                str(default_model),
                "--bandwidth",
                "100",
                "--ctx",
                "4096",
                "-ctk",
                "q4_0",
                "-ctv",
                "q4_0",
                "--json",
            ]
        )
        == 0
    )
    import json

    out = json.loads(capsys.readouterr().out)
    f16 = inspect(default_model).kv_read_bytes(4096)
    assert out["contexts"][0]["kv_bytes"] == pytest.approx(f16 * 18 / 64, rel=1e-3)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-ctv", "q8_0", "-fa", "off"], "needs flash attention"),
        (["-b", "0"], "--n-batch must be at least 1"),
    ],
)
def test_bad_settings_are_one_line(tiny_model, capsys, argv, message):
    rc = main(["run", str(tiny_model), "hello", "-n", "2", "--no-predict", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]
