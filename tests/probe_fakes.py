"""Hand-made probe results for the probe/roofline tests (no measurement)."""

from __future__ import annotations

import time

from ondevice.probing.hardware import GPUInfo, HostInfo, LlamaDevice
from ondevice.probing.host import ComputeProbe, MemoryProbe
from ondevice.probing.result import ProbeResult
from ondevice.roofline.attention import chunk_cells, decode_spans
from ondevice.roofline.timing import ShapeTiming


def fake_host(**kw) -> HostInfo:
    base = dict(
        os="Linux 6.1",
        machine="x86_64",
        cpu_model="Test CPU",
        physical_cores=4,
        logical_cores=8,
        perf_cores=None,
        ram_total_bytes=16 * 10**9,
        ram_available_bytes=8 * 10**9,
        llc_bytes=32 << 20,
        apple_chip=None,
        unified_memory=False,
        gpus=(),
        llama_backends=("CPU",),
        llama_features={"CPU.AVX2": "1"},
        llama_cpp_version="0.3.36",
        warnings=(),
    )
    base.update(kw)
    return HostInfo(**base)


def fake_result(
    *,
    build: str,
    backend: str = "CPU",
    full: bool = True,
    read_gbs: float = 20.0,
    host: HostInfo | None = None,
    created: float | None = None,
) -> ProbeResult:
    """A host probe as `ondevice probe` (full) or a first run (memory only) would cache it."""
    return ProbeResult(
        host=host or fake_host(),
        backend=backend,
        build_id=build,
        created_unix_s=created if created is not None else time.time() - 90,
        memory=MemoryProbe(
            read_gbs=read_gbs, copy_gbs=read_gbs * 0.9, n_threads=4, array_bytes=256 << 20, passes=5, elapsed_s=2.0
        ),
        compute=ComputeProbe(f32_gflops=100.0, matrix_n=1024, elapsed_s=0.5) if full else None,
    )


# A model's true speed for the timing tests: decode a + b x spans; a chunk m(k) + k / 512 x c x (cells of a full
# chunk at its position beyond those from an empty cache); a batch step w(B).
TRUTH = {"a": 0.012, "b": 2e-8, "m0": 0.010, "m1": 1.3e-3, "c": 4e-8, "w0": 0.010, "w1": 3e-3}
CHUNKS = (1, 4, 16, 64, 128, 512)


def true_decode_s(spec, n_ctx: int, p=TRUTH) -> float:
    return p["a"] + p["b"] * decode_spans(spec, n_ctx)


def true_matmul_s(k: int, p=TRUTH) -> float:
    return p["m0"] + p["m1"] * k  # linear in k: what interpolating between measured chunks recovers exactly


def true_chunk_s(spec, pos: int, k: int, p=TRUTH) -> float:
    return true_matmul_s(k, p) + k / 512 * p["c"] * (chunk_cells(spec, pos, 512) - chunk_cells(spec, 0, 512))


def true_batch_s(b: int, p=TRUTH) -> float:
    return p["w0"] + p["w1"] * b


def fake_timing(spec, p=TRUTH, *, batch=(2, 4, 8, 16), batch_ctx: int = 20, **kw) -> ShapeTiming:
    """A ShapeTiming holding the true figures at the points the full plan times."""
    return ShapeTiming(
        decode=((24, true_decode_s(spec, 24, p)), (2056, true_decode_s(spec, 2056, p))),
        prefill=tuple((0, k, true_chunk_s(spec, 0, k, p)) for k in CHUNKS)
        + tuple((pos, 512, true_chunk_s(spec, pos, 512, p)) for pos in (512, 1024, 1536)),
        batch=tuple((b, true_batch_s(b, p)) for b in batch),
        batch_ctx=batch_ctx,
        **kw,
    )


def nvidia_host() -> HostInfo:
    return fake_host(
        gpus=(GPUInfo("NVIDIA", "NVIDIA GeForce RTX 4090", 24 << 30, 20 << 30, "550"),),
        llama_backends=("CUDA", "CPU"),
        llama_devices=(LlamaDevice("CUDA0", "NVIDIA GeForce RTX 4090", "GPU", 24 << 30, 20 << 30),),
    )
