"""The memory estimate, the verdict and --fit's choice, on the CPU and (from recorded device outputs) on GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from ondevice.core.errors import InvalidParameterError
from ondevice.gguf.spec import inspect
from ondevice.llama.memlog import parse_buffer_log
from ondevice.probing.hardware import parse_nvidia_smi
from ondevice.roofline.memory import FIT_SHARE, fit_memory, memory_need, memory_verdict
from ondevice.roofline.spec import spec_from_flags

DEVICE = Path(__file__).parent / "data" / "device"
HW = Path(__file__).parent / "data" / "hw"
MIB, GB = 1 << 20, 1e9


def llama(params=8.03e9, layers=32, ctx_train=131072, **kw):
    return spec_from_flags(
        params=params,
        quant="Q4_K_M",
        layers=layers,
        kv_heads=8,
        head_dim=128,
        d_model=4096 if params < 2e10 else 8192,
        vocab=128256,
        ctx_train=ctx_train,
        heads=32 if params < 2e10 else 64,
        **kw,
    )


def test_buffer_log_recorded_on_the_cpu():
    log = parse_buffer_log((DEVICE / "llama_log_cpu_gemma3_270m_4096.txt").read_text())
    assert log.total_bytes("model") == round(235.16 * MIB) + round(12.66 * MIB)
    assert log.total_bytes("KV") == 72 * MIB and log.total_bytes("compute") == round(514.5 * MIB)
    assert log.total_bytes("model", device="CPU_REPACK") == round(12.66 * MIB)
    assert log.device_bytes() == 0  # nothing on an accelerator


def test_buffer_log_of_a_cuda_offload():
    log = parse_buffer_log((DEVICE / "llama_log_cuda_constructed.txt").read_text().splitlines())
    assert log.device_bytes("model") == round(241.30 * MIB)
    assert log.device_bytes() == round(241.30 * MIB) + 72 * MIB + round(514.5 * MIB)
    assert log.total_bytes(device="CUDA_Host") == MIB + round(9.27 * MIB)
    assert [b.kind for b in log.lines] == ["model", "model", "output", "KV", "KV", "compute", "compute"]


def test_cpu_need_counts_touched_pages_not_the_reserved_logits(default_model):
    spec = inspect(default_model)
    need = memory_need(spec, n_ctx=4096, repacked_bytes=round(12.66 * MIB))
    assert need.weight_bytes == spec.file_bytes + round(12.66 * MIB)  # the mapped file and the repacked copy
    assert need.kv_bytes == 72 * MIB and need.device_bytes == 0 and need.host_bytes == need.total_bytes
    assert need.buffer_bytes < 150 * MIB  # llama.cpp reserves 514.5 MiB of address space; a pass writes far less


def test_gpu_full_offload_takes_the_reserved_compute_buffer(default_model):
    spec = inspect(default_model)
    need = memory_need(spec, n_ctx=4096, backend="CUDA", n_gpu_layers=spec.n_layer + 1)
    reserved = 4 * 512 * (spec.n_vocab + 2 * spec.d_model)
    assert reserved == pytest.approx(514.5 * MIB, rel=0.01)  # llama.cpp's own figure for this model
    assert need.device_bytes == need.total_bytes - need.host_bytes
    assert need.device_bytes - need.kv_bytes - reserved == spec.weight_bytes - (
        spec.weight_bytes - spec.decode_weight_bytes
    )
    assert need.host_bytes < spec.file_bytes  # the offloaded weights are read once and unmapped


def test_partial_offload_moves_memory_from_ram_to_the_gpu():
    spec = llama()
    needs = [memory_need(spec, n_ctx=8192, backend="CUDA", n_gpu_layers=k) for k in (1, 8, 16, 32, 33)]
    assert all(a.device_bytes < b.device_bytes for a, b in zip(needs, needs[1:]))
    assert all(a.host_bytes > b.host_bytes for a, b in zip(needs, needs[1:]))
    assert needs[-1].device_bytes > needs[-2].device_bytes + 4 * 512 * 128256  # the head and its logits move last


def test_unified_memory_is_one_pool():
    spec = llama()
    need = memory_need(spec, n_ctx=8192, backend="Metal", n_gpu_layers=33, unified=True)
    assert need.device_bytes == 0 and need.host_bytes == need.total_bytes
    assert need.total_bytes > spec.file_bytes + need.kv_bytes + 4 * 512 * 128256


def test_verdict_weighs_device_memory_on_a_gpu():
    spec = llama()
    vram = parse_nvidia_smi((HW / "nvidia_smi_rtx4090.csv").read_text())[0].vram_free_bytes
    v = memory_verdict(spec, n_ctx=8192, available_bytes=vram, where="VRAM", backend="CUDA", n_gpu_layers=33)
    assert v.total_bytes == v.device_bytes and v.verdict == "fits"
    big = llama(params=70.6e9, layers=80)
    assert (
        memory_verdict(big, n_ctx=8192, available_bytes=vram, where="VRAM", backend="CUDA", n_gpu_layers=81).verdict
        == "does not fit"
    )


def test_fit_on_the_cpu_takes_the_largest_context_under_the_margin():
    spec = llama()
    free = int(8 * GB)
    choice = fit_memory(spec, ctx_max=131072, host_free_bytes=free)
    assert choice.n_gpu_layers == 0 and choice.n_ctx % 256 == 0 and choice.n_ctx < 131072
    assert choice.need.total_bytes <= FIT_SHARE * free
    assert memory_need(spec, n_ctx=choice.n_ctx + 256).total_bytes > FIT_SHARE * free
    assert f"context {choice.n_ctx}" in choice.reason and "RAM" in choice.reason


def test_fit_on_an_h200_offloads_everything_at_the_trained_context():
    gpu = parse_nvidia_smi((HW / "nvidia_smi_h200.csv").read_text())[0]
    choice = fit_memory(
        llama(), ctx_max=131072, backend="CUDA", device_free_bytes=gpu.vram_free_bytes, host_free_bytes=int(64 * GB)
    )
    assert choice.n_ctx == 131072 and choice.n_gpu_layers == 33
    assert "all 33 layers on the GPU" in choice.reason and "(the most asked for)" in choice.reason


def test_fit_leaves_layers_in_ram_when_the_gpu_is_too_small():
    gpu = parse_nvidia_smi((HW / "nvidia_smi_rtx4090.csv").read_text())[0]
    big = llama(params=70.6e9, layers=80)
    choice = fit_memory(
        big, ctx_max=131072, backend="CUDA", device_free_bytes=gpu.vram_free_bytes, host_free_bytes=int(128 * GB)
    )
    assert choice.n_ctx >= 4096 and 0 < choice.n_gpu_layers < 81
    assert choice.need.device_bytes <= FIT_SHARE * gpu.vram_free_bytes
    more = memory_need(big, n_ctx=4096, backend="CUDA", n_gpu_layers=choice.n_gpu_layers + 1)
    assert more.device_bytes > FIT_SHARE * gpu.vram_free_bytes
    assert f"{choice.n_gpu_layers} of 81 layers" in choice.reason


def test_fit_refuses_with_the_figures_when_nothing_fits():
    with pytest.raises(InvalidParameterError, match=r"does not fit even at 256 tokens.*needs .* GB of RAM, 1\.00 GB"):
        fit_memory(llama(), ctx_max=8192, host_free_bytes=int(1 * GB))


RECORDED = Path(__file__).parents[1] / "benchmarks" / "data" / "memory_accuracy"


def _bench_module():
    from benchmarks import memory_accuracy

    return memory_accuracy


def test_recorded_rows_meet_the_targets_and_are_this_codes_prediction(default_model, tmp_path):
    """The rows benchmarks/memory_accuracy.py recorded on this project's CPU machine: every one of a model file
    from 50 MB up within ±10% of the RSS growth after a full context and never under by more than 5%; the rows
    of the models a test can rebuild (the default model, the 1 MB and 50 MB synthetic ones) predicted again by
    this code, to the byte."""
    import json

    bench = _bench_module()
    rows = [r for f in sorted(RECORDED.glob("*.json")) for r in json.loads(f.read_text())["rows"] if "error" not in r]
    assert len(rows) >= 20 and {r["group"] for r in rows} == {"fit", "score"}
    for r in (r for r in rows if bench._group(r) != "small"):  # model files from 50 MB up
        e_load, e_full = bench.errors(r)
        assert -0.05 <= e_full <= 0.10 and e_load >= -0.05, (r["model"], r["n_ctx"], r["kv"], e_load, e_full)
    models = bench.build_models(["synth-tiny", "synth-50MB"], tmp_path) | {"default": default_model}
    again = [r for r in rows if r["model"] in models]
    assert len(again) >= 8
    for r in again:
        assert bench.predicted(models[r["model"]], r["n_ctx"], r["kv"], r) == r["predicted"], (r["model"], r["n_ctx"])
