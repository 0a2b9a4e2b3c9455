"""A load that will not fit is refused before llama.cpp allocates anything; --fit chooses what fits."""

from __future__ import annotations

import json

import pytest

from ondevice.cli.main import main
from ondevice.core.errors import InsufficientMemoryError
from ondevice.engine import load, memcheck
from ondevice.engine.memcheck import FreeMemory, check_memory, free_memory
from ondevice.gguf.spec import inspect
from ondevice.llama.devices import LlamaDevice
from ondevice.roofline.memory import FIT_SHARE, memory_need


def _free(monkeypatch, host_bytes: int) -> None:
    monkeypatch.setattr(memcheck, "free_memory", lambda backend, devices=None: FreeMemory(host_bytes, None, False))


def test_a_load_that_does_not_fit_is_refused_with_the_figures(tiny_model, monkeypatch):
    _free(monkeypatch, 1000)
    with pytest.raises(
        InsufficientMemoryError, match=r"needs 0\.\d\d GB of RAM at 256 tokens.*0\.00 GB available"
    ) as e:
        load(tiny_model, n_ctx=256)
    assert e.value.needed_bytes > e.value.available_bytes == 1000 and e.value.where == "RAM"


def test_the_cli_says_it_in_one_line(tiny_model, monkeypatch, capsys):
    _free(monkeypatch, 1000)
    assert main(["run", str(tiny_model), "hello", "-n", "2", "--no-predict"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs" in err[0] and "available" in err[0] and "--fit" in err[0]


def test_fit_chooses_a_context_that_fits(tiny_model, monkeypatch):
    spec = inspect(tiny_model)
    at_256 = memory_need(spec, n_ctx=256).total_bytes
    _free(monkeypatch, int(at_256 / FIT_SHARE) + 1)  # room for 256 tokens and not for the trained 512
    eng = load(tiny_model, fit=True, predictor=None)
    try:
        assert eng.info.n_ctx == 256 and eng.info.fit_reason.startswith("context 256:")
        assert eng.info.memory_need_bytes <= at_256
    finally:
        eng.close()


def test_fit_without_a_limit_takes_the_trained_context(tiny_model, capsys):
    assert main(["run", str(tiny_model), "hello", "-n", "2", "--no-predict", "--fit"]) == 0
    err = capsys.readouterr().err
    assert "--fit: context 512 (the most asked for)" in err


def test_free_memory_reads_the_gpu_from_ggml_devices():
    devices = (
        LlamaDevice("CPU", "AMD EPYC", "CPU", None, None),
        LlamaDevice("CUDA0", "NVIDIA H200", "GPU", 143771 << 20, 143156 << 20),
    )
    free = free_memory("CUDA", devices)
    assert free.device_bytes == 143156 << 20 and not free.unified and free.host_bytes > 0
    assert free_memory("Metal", (LlamaDevice("Metal", "Apple M2", "GPU", 16 << 30, 12 << 30),)).unified
    assert free_memory("CPU", devices).device_bytes is None


def test_a_gpu_load_is_checked_against_device_memory(default_model):
    spec = inspect(default_model)
    free = FreeMemory(host_bytes=64 << 30, device_bytes=300 << 20, unified=False)  # 300 MiB of VRAM left
    with pytest.raises(InsufficientMemoryError, match="CUDA device memory at 4096 tokens of context with 19 layers"):
        check_memory(spec, free, n_ctx=4096, n_ubatch=512, flash_attn="auto", backend="CUDA", offloaded=19)
    need = check_memory(spec, free, n_ctx=4096, n_ubatch=512, flash_attn="auto", backend="CUDA", offloaded=0)
    assert need.device_bytes == 0


def test_predict_fit_for_another_machine(capsys):
    spec = [
        "--params",
        "8.03B",
        "--quant",
        "Q4_K_M",
        "--layers",
        "32",
        "--kv-heads",
        "8",
        "--head-dim",
        "128",
        "--d-model",
        "4096",
        "--vocab",
        "128256",
        "--ctx-train",
        "131072",
    ]
    assert main(["predict", *spec, "--device", "RTX 4090", "--memory", "24", "--fit", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)["fit"]
    assert fit["n_gpu_layers"] == 33 and fit["n_ctx"] >= 65536 and "all 33 layers" in fit["reason"]
    assert main(["predict", *spec, "--bandwidth", "100", "--backend", "CPU", "--memory", "2", "--fit"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not fit even at 256 tokens" in err[0]


SPEC8B = ["--params", "8B", "--quant", "Q4_K_M", "--layers", "32", "--kv-heads", "8", "--head-dim", "128"]


@pytest.mark.parametrize(
    "extra, said",
    [
        (["--device", "RTX 9999"], "not in the nameplate table"),
        (["--device", "RTX 4090", "--memory", "-1"], "--memory must be positive"),
        (["--device", "RTX 4090", "--memory", "1e12"], "beyond any machine"),
        (["--bandwidth", "1e9"], "beyond any machine"),
        (["--device", "RTX 4090", "--compute", "1e9"], "beyond any machine"),
        (["--bandwidth", "100", "--backend", "CPU", "--memory", "1", "--fit"], "does not fit even at 256 tokens"),
        (["--device", "RTX 4090", "--fit"], "--fit for another machine needs its memory"),
    ],
)
def test_bad_machine_input_is_one_line_and_exit_2(extra, said, capsys):
    assert main(["predict", *SPEC8B, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0]


class _CudaBuild:
    """llama_cpp as a CUDA build on the recorded H200 reports itself (offload on, its system info)."""

    def __init__(self, system_info: str):
        self.info = system_info.encode()

    def llama_supports_gpu_offload(self) -> bool:
        return True

    def llama_print_system_info(self) -> bytes:
        return self.info


def test_offload_decisions_on_the_recorded_h200(monkeypatch, default_model):
    from pathlib import Path

    from ondevice.llama import devices
    from ondevice.probing.hardware import parse_nvidia_smi

    hw = Path(__file__).parent / "data" / "hw"
    lib = _CudaBuild((hw / "sysinfo_cuda13_h200.txt").read_text())
    monkeypatch.setattr(devices, "_device_backends", lambda: [])  # this machine's ggml has no GPU: the recorded text
    assert devices.detect_backends(lib) == ["CUDA", "CPU"] and devices.default_backend(lib) == "CUDA"
    assert devices.gpu_layers(lib, "auto", 18) == (-1, 19) and devices.gpu_layers(lib, 5, 18) == (5, 5)
    assert devices.gpu_layers(lib, 100, 18) == (100, 19)
    assert memcheck.backend_for(lib, 19) == "CUDA" and memcheck.backend_for(lib, 0) == "CPU"
    gpu = parse_nvidia_smi((hw / "nvidia_smi_h200.csv").read_text())[0]
    h200 = (LlamaDevice("CUDA0", gpu.name, "GPU", gpu.vram_total_bytes, gpu.vram_free_bytes),)
    monkeypatch.setattr(memcheck, "llama_devices", lambda: h200)
    spec = inspect(default_model)
    choice = memcheck.plan_fit(default_model, spec, ctx_max=32768, n_ubatch=None, flash_attn="auto", lib=lib)
    assert choice.n_ctx == 32768 and choice.n_gpu_layers == 19 and "all 19 layers on the GPU" in choice.reason
    assert choice.need.device_bytes > 514 * 2**20 and choice.need.host_bytes < spec.file_bytes


def test_chat_fit_decides_before_the_app_and_says_so(tiny_model, capsys):
    from ondevice.cli.chat import _fit

    kw = {
        "n_ctx": None,
        "n_ubatch": None,
        "flash_attn": "auto",
        "n_gpu_layers": "auto",
        "cache_type_k": "f16",
        "cache_type_v": "f16",
    }
    chosen = _fit(tiny_model, kw)
    assert chosen["n_ctx"] == 512 and chosen["n_gpu_layers"] == 0
    assert capsys.readouterr().err.startswith("ondevice: --fit: context 512 (the most asked for)")
