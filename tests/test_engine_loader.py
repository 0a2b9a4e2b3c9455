"""What depends on the llama.cpp build: backend names, GPU offload counts, the thread default
(ondevice.llama.devices)."""

from __future__ import annotations

import pytest

from ondevice.core.errors import InvalidParameterError
from ondevice.llama import devices


class FakeLib:
    def __init__(self, gpu: bool, system_info: bytes = b""):
        self._gpu, self._info = gpu, system_info

    def llama_supports_gpu_offload(self) -> bool:
        return self._gpu

    def llama_print_system_info(self) -> bytes:
        return self._info


class Spec:
    n_layer = 18


def test_backends_from_devices_put_gpus_first(monkeypatch):
    monkeypatch.setattr(devices, "_device_backends", lambda: ["CPU", "Metal", "BLAS"])
    assert devices.detect_backends(FakeLib(True)) == ["Metal", "CPU", "BLAS"]


def test_backends_fall_back_to_system_info(monkeypatch):
    monkeypatch.setattr(devices, "_device_backends", lambda: [])
    info = b"CUDA : ARCHS = 890 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | CPU : SSE3 = 1 | AVX2 = 1 | "
    assert devices.detect_backends(FakeLib(True, info)) == ["CUDA", "CPU"]
    assert devices.detect_backends(FakeLib(False, b"")) == ["CPU"]


def test_this_build_reports_its_cpu_device():
    import llama_cpp

    assert "CPU" in devices.detect_backends(llama_cpp)


@pytest.mark.parametrize(
    "requested, gpu, expected",
    [
        ("auto", True, (-1, 19)),
        ("auto", False, (0, 0)),
        (5, True, (5, 5)),
        (100, True, (100, 19)),
        (-1, True, (-1, 19)),
        (0, True, (0, 0)),
        (7, False, (0, 0)),
    ],
)
def test_gpu_layer_counts(requested, gpu, expected):
    assert devices.gpu_layers(FakeLib(gpu), requested, Spec.n_layer) == expected


def test_gpu_layers_rejects_nonsense():
    with pytest.raises(InvalidParameterError, match="n_gpu_layers"):
        devices.gpu_layers(FakeLib(True), True, Spec.n_layer)


def test_default_threads_is_positive_and_bounded():
    import os

    n = devices.default_threads()
    assert 1 <= n <= (os.cpu_count() or 1)


def test_load_warms_the_model_up_and_leaves_the_cache_empty(tiny_model, monkeypatch):
    """A warm-up request at load (the weights faulted in there, and what a process's first request pays once, not in
    the first request's TTFT), then an empty cache and the draw seeds as they were: the first request computes its
    whole prompt and draws as request 0."""
    from ondevice.engine import Engine, load

    calls = []
    real = Engine._warm_up
    monkeypatch.setattr(Engine, "_warm_up", lambda self: calls.append(self) or real(self))
    with load(tiny_model, n_ctx=256, n_threads=1) as eng:
        assert calls == [eng] and eng.kv_cache_tokens == 0 and eng._requests == 0
        g = eng.generate([1, 5, 9, 13], max_tokens=2, ignore_eos=True)
        assert g.cached_prompt_tokens == 0 and g.timings.prefill_tok_s


def test_a_failed_warm_up_is_a_load_error_and_frees_the_model(tiny_model, monkeypatch):
    from ondevice.core.errors import EngineError, ModelLoadError
    from ondevice.engine import Engine, load

    closed = []
    real_close = Engine.close

    def fail(self, *a, **kw):
        raise EngineError("llama_decode failed (code 1) on the prompt at token 0 of 1")

    monkeypatch.setattr(Engine, "generate", fail)
    monkeypatch.setattr(Engine, "close", lambda self: closed.append(self) or real_close(self))
    with pytest.raises(ModelLoadError, match="warm-up request failed"):
        load(tiny_model, n_ctx=256, n_threads=1)
    assert len(closed) == 1 and closed[0]._closed
