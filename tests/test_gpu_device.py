"""On a GPU build only (`pytest -m gpu`; skipped elsewhere): offload, device memory against the estimate,
partial offload, and the fit, on tiny synthetic models. benchmarks/device_check.py runs these on the device."""

from __future__ import annotations

import pytest
from ondevice.quant.synth import SynthConfig, build_synthetic_model

from ondevice.engine import load
from ondevice.engine.memcheck import free_memory
from ondevice.gguf.spec import inspect
from ondevice.roofline.memory import memory_need

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gpu(offload_backend) -> str:
    if offload_backend == "CPU":
        pytest.skip("this llama.cpp build offloads nothing (a CPU build)")
    return offload_backend


@pytest.fixture(scope="module")
def wide_model(synth_dir):
    """Wide enough that its weights and buffers dwarf a backend's own allocations (about 200 MB)."""
    cfg = SynthConfig(d_model=1024, n_layer=8, n_head=8, n_head_kv=8, d_ff=4096, n_vocab=32000, n_ctx_train=4096)
    return build_synthetic_model(cfg, synth_dir / "gpu-wide.gguf")


def test_auto_offloads_every_layer(gpu, tiny_model):
    eng = load(tiny_model, n_ctx=256, predictor=None)
    try:
        assert eng.info.backend == gpu and eng.info.n_gpu_layers == inspect(tiny_model).n_layer + 1
        assert eng.generate("hello", max_tokens=4, temperature=0).timings.output_tokens == 4
    finally:
        eng.close()


def test_partial_offload_is_honoured(gpu, tiny_model):
    eng = load(tiny_model, n_ctx=256, n_gpu_layers=1, predictor=None)
    try:
        assert eng.info.n_gpu_layers == 1
    finally:
        eng.close()


def test_device_memory_used_is_the_estimate(gpu, wide_model):
    before = free_memory(gpu).device_bytes
    eng = load(wide_model, n_ctx=4096, predictor=None)
    try:
        used = before - free_memory(gpu).device_bytes
        spec = inspect(wide_model)
        need = memory_need(spec, n_ctx=4096, backend=gpu, n_gpu_layers=spec.n_layer + 1, unified=gpu == "Metal")
        if need.device_bytes:
            assert used == pytest.approx(need.device_bytes, rel=0.10)
    finally:
        eng.close()


def test_fit_offloads_within_free_memory(gpu, wide_model):
    eng = load(wide_model, fit=True, predictor=None)
    try:
        assert eng.info.n_gpu_layers == inspect(wide_model).n_layer + 1 and "layers on the GPU" in eng.info.fit_reason
    finally:
        eng.close()
