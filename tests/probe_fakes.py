"""Hand-made probe results for the probe/roofline tests (no measurement)."""

from __future__ import annotations

import time

from ondevice.probing.hardware import GPUInfo, HostInfo, LlamaDevice
from ondevice.probing.host import ComputeProbe, MemoryProbe
from ondevice.probing.kernel import KernelPlan
from ondevice.probing.result import KernelPoint, KernelProbe, ProbeResult
from ondevice.roofline import score_s


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
    kernel: bool = True,
    read_gbs: float = 20.0,
    host: HostInfo | None = None,
    created: float | None = None,
) -> ProbeResult:
    k = None
    if kernel:
        k = KernelProbe(
            backend=backend,
            n_threads=4,
            n_gpu_layers=0 if backend == "CPU" else -1,
            type_gbs={"Q4_0": 10.0, "Q8_0": 14.0, "F16": 16.0},
            t0_s=1e-4,
            layer_s=2e-5,
            vocab_s=1e-9,
            attn_score_s=((128, 1e-10), (512, 1.5e-10)),
            fit_rms_rel=0.01,
            points=(KernelPoint("F16", 400_000_000, 1_000_000, 0.03, 32),),
            elapsed_s=20.0,
        )
    return ProbeResult(
        host=host or fake_host(),
        backend=backend,
        build_id=build,
        created_unix_s=created if created is not None else time.time() - 90,
        memory=MemoryProbe(
            read_gbs=read_gbs, copy_gbs=read_gbs * 0.9, n_threads=4, array_bytes=256 << 20, passes=5, elapsed_s=2.0
        ),
        compute=ComputeProbe(f32_gflops=100.0, matrix_n=1024, elapsed_s=0.5),
        kernel=k,
    )


def nvidia_host() -> HostInfo:
    return fake_host(
        gpus=(GPUInfo("NVIDIA", "NVIDIA GeForce RTX 4090", 24 << 30, 20 << 30, "550"),),
        llama_backends=("CUDA", "CPU"),
        llama_devices=(LlamaDevice("CUDA0", "NVIDIA GeForce RTX 4090", "GPU", 24 << 30, 20 << 30),),
    )


# Known step-time model for the kernel-probe pipeline tests.
TRUE = {
    "type_gbs": {"Q4_0": 9.0, "Q8_0": 13.0, "F16": 15.0},
    "t0_s": 2e-4,
    "layer_s": 3e-5,
    "vocab_s": 2e-9,
    "row_s": 4e-9,
    "batch_row_s": 1.5e-9,
    "type_cached_gbs": {"Q4_0": 14.0, "Q8_0": 30.0, "F16": 40.0},
    "attn_score_s": ((64, 1.0e-8), (128, 1.2e-8), (256, 3.5e-8), (512, 1.5e-8)),  # not a line: as measured
    "type_gflops": {"Q4_0": 120.0, "Q8_0": 150.0, "F16": 60.0},
    "attn_gflops": 40.0,
    "step_ratios": {
        "Q4_0": {2: 1.6, 3: 2.1, 4: 1.5, 8: 2.3, 16: 3.5},
        "Q8_0": {2: 1.9, 3: 2.2, 4: 2.1, 8: 2.8, 16: 4.4},
        "F16": {2: 1.3, 3: 1.5, 4: 1.6, 8: 2.0, 16: 2.9},
    },
}
TINY = KernelPlan(
    d_model=256,
    n_head=4,
    n_head_kv=2,
    d_ff=512,
    n_layer=2,
    tiny_layers=(1, 4),
    tiny_vocab=1024,
    attn_shapes=((128, 4, 2, 2), (128, 2, 1, 2), (128, 1, 1, 2)),
    attn_d_ff=64,
    n_long=64,
    n_prompt=8,
    n_tokens=4,
    n_warmup=1,
    narrow=(64, 2, 1, 128),
    narrow_layers=6,
    cached=(64, 2, 1, 128),
    cached_bytes=40_000,
    types=("Q4_0", "Q8_0", "F16"),
)


def model_time(
    t: str, nbytes: int, n_layer: int, n_vocab: int, attn_scores: int = 0, head_dims: int = 0, p=TRUE, rows: int = 0
) -> float:
    return (
        nbytes / (p["type_gbs"][t] * 1e9)
        + p["t0_s"]
        + n_layer * p["layer_s"]
        + n_vocab * p["vocab_s"]
        + rows * p["row_s"]
        + attn_scores * score_s(p["attn_score_s"], head_dims)
    )


def fake_measure(calls: list | None = None):
    """A stand-in for kernel.measure: the step time of model_time() for the file's bytes."""
    from ondevice.gguf.spec import inspect
    from ondevice.roofline import attention_head_dims, attention_scores

    def measure(path, plan, *, n_prompt, n_threads, n_gpu_layers, decode=True):
        spec = inspect(path)
        main = path.name.rsplit("-", 1)[1].removesuffix(".gguf")
        n = plan.mid_context(n_prompt)
        if calls is not None:
            calls.append((path.name, n_prompt))
        nbytes = 0 if path.name.startswith("tiny-") else spec.decode_weight_bytes + spec.kv_read_bytes(n)  # cached
        if path.name.startswith("cached-"):  # read from the caches at the type kernel's own speed
            nbytes = nbytes * TRUE["type_gbs"][main] / TRUE["type_cached_gbs"][main]
        step = model_time(
            main,
            nbytes,
            spec.n_layer,
            spec.n_vocab,
            attention_scores(spec, n),
            attention_head_dims(spec),
            rows=sum(spec.decode_rows_by_type.values()),
        )
        return (step if decode else 0.0), "CPU", 3, spec, true_prefill_s(spec, n_prompt)

    return measure


def fake_measure_pair(path, plan, n_prompts, *, n_threads, n_gpu_layers):
    """A stand-in for kernel.measure_pair: kernel.measure (as a test has replaced it) at both prompt lengths."""
    from ondevice.probing import kernel

    short, long = (
        kernel.measure(path, plan, n_prompt=n, n_threads=n_threads, n_gpu_layers=n_gpu_layers) for n in n_prompts
    )
    return (short[0], long[0]), (short[4], long[4]), short[1], short[2], short[3]


def true_prefill_s(spec, n_prompt: int, p=TRUE) -> float:
    """The prefill time the roofline's own arithmetic gives with the known terms above."""
    from ondevice.roofline import Calibration, Predictor

    small = {k: p[k] for k in ("t0_s", "layer_s", "vocab_s", "row_s", "attn_score_s")}
    cal = Calibration(
        "CPU",
        ceiling_gbs=max(p["type_gbs"].values()),
        type_gbs=p["type_gbs"],
        kv_gbs=p["type_gbs"]["F16"],
        type_gflops=p["type_gflops"],
        attn_gflops=p["attn_gflops"],
        batch_row_s=p["batch_row_s"],
        batch_row_width=TINY.row_width(),  # rows narrower than TINY's sized ones pay batch_row_s
        step_ratios={t: tuple(sorted(r.items())) for t, r in p["step_ratios"].items()},
        **small,
    )
    return Predictor(spec, cal).prefill_s(n_prompt, n_batch=512)


def fake_measure_steps(path, plan, *, n_threads, n_gpu_layers):
    """A stand-in for kernel.measure_steps: the known ratios of the file's main type."""
    main = path.name.rsplit("-", 1)[1].removesuffix(".gguf")
    return {n: r for n, r in TRUE["step_ratios"][main].items() if n in plan.step_tokens}
