"""Host detection from recorded command outputs (machines we do not have), and the nameplate table."""

from __future__ import annotations

from pathlib import Path

import pytest

from ondevice.probing import hardware
from ondevice.probing.hardware import (
    detect,
    parse_cache_size,
    parse_cpuinfo,
    parse_nvidia_smi,
    parse_rocm_smi,
    parse_sysctl,
    parse_system_info,
)
from ondevice.probing.nameplate import NAMEPLATE_GBS, lookup

DATA = Path(__file__).parent / "data" / "hw"
MIB = 1 << 20


def rec(name: str) -> str:
    return (DATA / name).read_text()


def runner(outputs: dict[str, str | None]):
    """A fake command runner: argv[0] -> recorded stdout (None = command missing)."""
    calls: list[list[str]] = []

    def run(argv: list[str]) -> str | None:
        calls.append(argv)
        return outputs.get(argv[0])

    run.calls = calls
    return run


def test_sysctl_apple_silicon():
    v = parse_sysctl(rec("sysctl_m2_pro.txt"))
    assert v["machdep.cpu.brand_string"] == "Apple M2 Pro"
    assert v["hw.memsize"] == "34359738368" and v["hw.perflevel0.physicalcpu"] == "8"


def test_sysctl_ignores_error_lines():
    assert parse_sysctl(rec("sysctl_garbage.txt")) == {}


def test_nvidia_smi_one_and_two_gpus():
    (g,) = parse_nvidia_smi(rec("nvidia_smi_rtx4090.csv"))
    assert (g.vendor, g.name, g.vram_total_bytes, g.vram_free_bytes, g.driver) == (
        "NVIDIA",
        "NVIDIA GeForce RTX 4090",
        24564 * MIB,
        23817 * MIB,
        "550.54.15",
    )
    two = parse_nvidia_smi(rec("nvidia_smi_two.csv"))
    assert [x.name for x in two] == ["NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3060"]
    assert two[1].vram_total_bytes == 12288 * MIB


def test_recorded_h200_with_a_cuda_13_build():
    """Recorded on an NVIDIA H200 machine (driver 580.159.04) with llama-cpp-python 0.3.36 built
    with -DGGML_CUDA=on for sm_90, CUDA 13.0: its nvidia-smi line and llama_print_system_info()."""
    (g,) = parse_nvidia_smi(rec("nvidia_smi_h200.csv"))
    assert (g.name, g.vram_total_bytes, g.vram_free_bytes, g.driver) == (
        "NVIDIA H200",
        143771 * MIB,
        143156 * MIB,
        "580.159.04",
    )
    backends, f = parse_system_info(rec("sysinfo_cuda13_h200.txt"))
    assert backends == ("CUDA", "CPU")
    assert f["CUDA.ARCHS"] == "900" and f["CUDA.FA_QUANTS"] == "q4_0-q4_0,q8_0-q8_0,f16-f16,bf16-bf16"
    assert f["CPU.AMX_INT8"] == "1" and f["CPU.AVX512_BF16"] == "1"


def test_nvidia_smi_driver_error_gives_nothing():
    assert parse_nvidia_smi(rec("nvidia_smi_error.txt")) == ()


def test_rocm_smi_json():
    (g,) = parse_rocm_smi(rec("rocm_smi_7900xt.json"))
    assert (g.vendor, g.name, g.vram_total_bytes, g.driver) == ("AMD", "Radeon RX 7900 XT", 21458059264, "gfx1100")
    assert g.vram_free_bytes == 21458059264 - 27856896


def test_rocm_smi_not_json():
    assert parse_rocm_smi(rec("rocm_smi_not_json.txt")) == ()
    assert parse_rocm_smi("[1, 2]") == ()


@pytest.mark.parametrize(
    "name, backends",
    [
        ("sysinfo_cuda.txt", ("CUDA", "CPU")),
        ("sysinfo_metal.txt", ("Metal", "CPU")),
        ("sysinfo_vulkan.txt", ("Vulkan", "CPU")),
        ("sysinfo_cpu.txt", ("CPU",)),
        ("sysinfo_blas.txt", ("BLAS", "CPU")),
    ],
)
def test_system_info_backends(name, backends):
    got, features = parse_system_info(rec(name))
    assert got == backends
    assert all("." in k for k in features)


def test_system_info_features():
    _, f = parse_system_info(rec("sysinfo_cuda.txt"))
    assert f["CUDA.ARCHS"] == "890" and f["CPU.AVX2"] == "1" and f["CPU.OPENMP"] == "1"
    assert parse_system_info("nonsense without separators") == ((), {})


def test_cpuinfo_and_cache_sizes():
    assert parse_cpuinfo(rec("proc_cpuinfo_epyc.txt")) == "AMD EPYC"
    assert parse_cpuinfo(rec("proc_cpuinfo_rpi.txt")) == "BCM2835"
    assert parse_cpuinfo("") is None
    assert parse_cache_size("32768K\n") == 32 * MIB
    assert parse_cache_size("1M") == MIB
    assert parse_cache_size("512") == 512
    assert parse_cache_size("big") is None


def test_detect_macos_apple_silicon(monkeypatch):
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(12)), raising=False)  # all 12 cores usable
    info = detect(
        run=runner({"sysctl": rec("sysctl_m2_pro.txt")}), system_info=rec("sysinfo_metal.txt"), system="Darwin"
    )
    assert info.apple_chip == "Apple M2 Pro" and info.unified_memory
    assert info.ram_total_bytes == 32 << 30 and info.physical_cores == 12 and info.perf_cores == 8
    assert info.llc_bytes == 16 * MIB
    assert info.accelerator_backend == "Metal" and info.chip_name == "Apple M2 Pro"
    assert hardware.default_threads(info) == 8
    assert lookup(info.chip_name).bandwidth_gbs == 200.0


def test_detect_intel_mac():
    info = detect(
        run=runner({"sysctl": rec("sysctl_intel_mac.txt")}), system_info=rec("sysinfo_cpu.txt"), system="Darwin"
    )
    assert info.apple_chip is None and not info.unified_memory and info.gpus == ()
    assert info.cpu_model.startswith("Intel(R) Core(TM) i9") and info.llc_bytes == 16 * MIB


def test_detect_macos_sysctl_missing_still_reports():
    info = detect(run=runner({}), system_info=rec("sysinfo_metal.txt"), system="Darwin")
    assert info.apple_chip is None
    assert any("sysctl" in w for w in info.warnings)
    assert info.ram_total_bytes  # from psutil


def test_detect_linux_nvidia_and_rocm(tmp_path):
    fake_sys(tmp_path)
    run = runner({"nvidia-smi": rec("nvidia_smi_two.csv"), "rocm-smi": rec("rocm_smi_7900xt.json")})
    info = detect(run=run, system_info=rec("sysinfo_cuda.txt"), system="Linux", sys_root=tmp_path)
    assert [g.vendor for g in info.gpus] == ["NVIDIA", "NVIDIA", "AMD"]
    assert info.cpu_model == "AMD EPYC" and info.llc_bytes == 32 * MIB
    assert info.accelerator_backend == "CUDA" and info.chip_name == "NVIDIA GeForce RTX 3090"
    assert ["nvidia-smi", *hardware.NVIDIA_SMI_ARGS] in run.calls


def test_detect_the_recorded_h200(tmp_path):
    fake_sys(tmp_path)
    info = detect(
        run=runner({"nvidia-smi": rec("nvidia_smi_h200.csv")}),
        system_info=rec("sysinfo_cuda13_h200.txt"),
        system="Linux",
        sys_root=tmp_path,
    )
    assert info.accelerator_backend == "CUDA" and info.chip_name == "NVIDIA H200"
    assert info.gpus[0].vram_total_bytes == 143771 * MIB and not info.unified_memory


def test_detect_linux_bad_outputs_become_unknown(tmp_path):
    run = runner({"nvidia-smi": rec("nvidia_smi_error.txt"), "rocm-smi": rec("rocm_smi_not_json.txt")})
    info = detect(run=run, system_info="garbage", system="Linux", sys_root=tmp_path)
    assert info.gpus == () and info.llc_bytes is None
    assert info.llama_backends == () and info.accelerator_backend == "CPU"
    text = " | ".join(info.warnings)
    assert "nvidia-smi" in text and "rocm-smi" in text and "system info" in text
    assert info.to_dict()["accelerator_backend"] == "CPU"


def test_detect_this_machine_runs():
    info = detect()
    assert info.logical_cores and info.ram_total_bytes and info.os
    assert info.accelerator_backend in info.llama_backends or info.accelerator_backend == "CPU"


def test_run_command_missing_binary():
    assert hardware.run_command(["definitely-not-a-command-xyz"]) is None


def fake_sys(root: Path) -> None:
    (root / "proc").mkdir()
    (root / "proc/cpuinfo").write_text(rec("proc_cpuinfo_epyc.txt"))
    for i, (level, size) in enumerate([(1, "32K"), (1, "32K"), (2, "512K"), (3, "32768K")]):
        d = root / f"sys/devices/system/cpu/cpu0/cache/index{i}"
        d.mkdir(parents=True)
        (d / "level").write_text(f"{level}\n")
        (d / "size").write_text(f"{size}\n")


@pytest.mark.parametrize(
    "name, gbs",
    [
        ("Apple M1", 68.25),
        ("Apple M4 Max", 546.0),
        ("Apple M3 Pro", 150.0),
        ("NVIDIA GeForce RTX 4090", 1008.0),
        ("NVIDIA GeForce RTX 4070 Ti", 504.0),
        ("Radeon RX 7900 XTX", 960.0),
        ("AMD Radeon RX 7900 XT", 800.0),
    ],
)
def test_nameplate_lookup(name, gbs):
    n = lookup(name)
    assert n.bandwidth_gbs == gbs and n.source == "nameplate"


@pytest.mark.parametrize(
    "name", [None, "", "NVIDIA GeForce RTX 4090 Laptop GPU", "AMD EPYC", "Navi 21 [Radeon RX 6800/6800 XT / 6900 XT]"]
)
def test_nameplate_unknown_or_ambiguous(name):
    assert lookup(name) is None


def test_nameplate_covers_m1_to_m5():
    for gen in range(1, 6):
        assert f"m{gen}" in NAMEPLATE_GBS and f"m{gen} pro" in NAMEPLATE_GBS and f"m{gen} max" in NAMEPLATE_GBS


def test_llama_devices_through_a_fake_ggml():
    import ctypes
    from types import SimpleNamespace

    devs = {1: (b"CUDA0", b"NVIDIA GeForce RTX 4090", 1, 20 << 30, 24 << 30), 2: (b"CPU", b"AMD EPYC", 0, 0, 0)}

    def memory(dev, free, total):
        ctypes.cast(free, ctypes.POINTER(ctypes.c_size_t))[0] = devs[dev][3]
        ctypes.cast(total, ctypes.POINTER(ctypes.c_size_t))[0] = devs[dev][4]

    lib = SimpleNamespace(
        ggml_backend_dev_count=lambda: 2,
        ggml_backend_dev_get=lambda i: i + 1,
        ggml_backend_dev_name=lambda d: devs[d][0],
        ggml_backend_dev_description=lambda d: devs[d][1],
        ggml_backend_dev_type=lambda d: devs[d][2],
        ggml_backend_dev_memory=memory,
    )
    gpu, cpu = hardware.llama_devices(lib)
    assert (gpu.name, gpu.kind, gpu.memory_total_bytes, gpu.memory_free_bytes) == ("CUDA0", "GPU", 24 << 30, 20 << 30)
    assert (cpu.name, cpu.description, cpu.kind, cpu.memory_total_bytes) == ("CPU", "AMD EPYC", "CPU", None)
    assert hardware.llama_devices(SimpleNamespace()) == ()  # a build without the device API


def test_this_machine_lists_its_llama_devices():
    info = detect()
    assert any(d.kind == "CPU" for d in info.llama_devices)
