"""Shared fixtures: tiny synthetic models (built once per session) and the default model."""

from __future__ import annotations

from pathlib import Path

import pytest
from ondevice.quant.synth import SynthConfig, build_synthetic_model


@pytest.fixture(scope="session", autouse=True)
def user_dirs(tmp_path_factory) -> dict[str, Path]:
    """The user's cache, config and data folders, and the user registry, point into a temporary
    folder for the whole run: no test reads the developer's probe results or history, and none
    writes there (the default model is assembled once into this cache)."""
    root = tmp_path_factory.mktemp("user")
    dirs = {name: root / name for name in ("cache", "config", "data")}
    with pytest.MonkeyPatch.context() as mp:
        for name, path in dirs.items():
            mp.setenv(f"ONDEVICE_{name.upper()}_DIR", str(path))
        mp.delenv("ONDEVICE_MODELS", raising=False)
        mp.delenv("ONDEVICE_CPU_BUFFERS", raising=False)
        yield dirs


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("synth")


@pytest.fixture(scope="session")
def tiny_model(synth_dir) -> Path:
    """A 2-layer F16 llama (d_model 64, vocab 512): loads and generates in milliseconds."""
    return build_synthetic_model(SynthConfig(), synth_dir / "tiny-f16.gguf")


@pytest.fixture(scope="module")
def engine(tiny_model):
    """An engine on the tiny model (256 tokens of context, one thread), one per test module.
    Modules that need another model define their own `engine`."""
    from ondevice.engine import load

    eng = load(tiny_model, n_ctx=256, n_threads=1)
    assert eng.n_ctx == 256
    yield eng
    eng.close()


@pytest.fixture(scope="session")
def tiny_model_f32(synth_dir) -> Path:
    return build_synthetic_model(SynthConfig(dtype="F32", seed=1), synth_dir / "tiny-f32.gguf")


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The real default model (Gemma 3 270M Q4_K_M), materialised from its PyPI package."""
    from ondevice.models.materialize import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def offload_backend() -> str:
    """Where a default load (n_gpu_layers "auto") runs the layers with this llama.cpp build: "CPU"
    on a CPU-only build, else the GPU backend the build reports (CUDA, Metal, Vulkan, ...)."""
    import llama_cpp

    from ondevice.llama.devices import detect_backends

    if not llama_cpp.llama_supports_gpu_offload():
        return "CPU"
    first = detect_backends(llama_cpp)[0]
    return "CPU" if first.upper() in ("CPU", "BLAS", "RPC") else first
