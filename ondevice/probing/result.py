"""What a probe measured, as frozen data that round-trips through JSON (the cache)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from ondevice.probing.hardware import GPUInfo, HostInfo, LlamaDevice
from ondevice.probing.host import ComputeProbe, DiskProbe, MemoryProbe
from ondevice.probing.nameplate import Nameplate, compute_lookup
from ondevice.roofline import Calibration

__all__ = ["KernelPoint", "KernelProbe", "ProbeResult", "SCHEMA_VERSION", "SMALL_TERMS"]

SCHEMA_VERSION = 5  # 5: attention as a table of per-score seconds by head dims (attn_score_s); the cost per row
# The step-time terms besides the bandwidths: fields of KernelProbe and of roofline.Calibration
# by these names, and the keys of kernel.fit_points' result.
SMALL_TERMS = ("t0_s", "layer_s", "vocab_s", "row_s", "attn_score_s")


@dataclass(frozen=True)
class KernelPoint:
    """One synthetic model decoded through llama.cpp (one run)."""

    weight_type: str  # matrix weight type of the synthetic model: "Q4_0", "Q8_0", "F16"
    decode_bytes: int  # weight bytes one decode step reads (ModelSpec.decode_weight_bytes)
    kv_bytes: int  # KV bytes one step reads at the context used
    step_s: float  # median decode step time, seconds
    n_tokens: int  # decode steps timed
    n_ctx: int = 0  # context at the middle of the timed steps, tokens
    attn_scores: int = 0  # attention scores per step at n_ctx (roofline.attention_scores)
    head_dims: int = 0  # key + value head dimensions of the model (roofline.attention_head_dims)
    role: str = ""  # "sized", "narrow", "tiny" or "attn": what the fit used the run for; "prefill" / "attn-prefill":
    # a prefill of n_tokens prompt tokens that took step_s seconds (the prefill rates' fit)
    rows: int = 0  # matrix rows one step computes (ModelSpec.decode_rows_by_type, summed)


@dataclass(frozen=True)
class KernelProbe:
    """Effective bandwidth the runtime's own kernels reach, per weight type, and t0."""

    backend: str  # backend the synthetic models ran on ("CPU", "CUDA", "Metal", ...)
    n_threads: int  # llama.cpp threads
    n_gpu_layers: int  # layers offloaded (0 on CPU, -1 = all)
    type_gbs: dict[str, float]  # weight type -> effective GB/s (slope of the two-size fit)
    t0_s: float  # fixed per-token cost, seconds (intercept of the fit, >= 0)
    layer_s: float  # extra cost per transformer block per token, seconds (>= 0)
    vocab_s: float  # extra cost per vocabulary entry per token (logits, sampling), seconds (>= 0)
    attn_score_s: tuple[tuple[int, float], ...]  # (key + value head dims of an attention model, seconds per
    # attention score (query head x context token x layer), >= 0), growing dims (roofline.score_s interpolates)
    fit_rms_rel: float  # root-mean-square relative residual of the fit (0.02 = 2%)
    points: tuple[KernelPoint, ...]  # every measurement the fit used
    elapsed_s: float  # wall time of the kernel probe, seconds (models from cache or built)
    pass_spread: float = 0.0  # how far apart the passes were: median over the sized runs of
    # slowest / fastest pass - 1 (0.1 = 10%); a shared or busy machine shows it here
    cpu_buffers: str = (
        "all"  # extra CPU buffer types the runs used ("all", "repack", "none": the crash guard's verdict)
    )
    type_gflops: dict[str, float] = field(default_factory=dict)  # weight type -> batched matrix-product GFLOP/s
    # in prefill (kernel.fit_prefill; empty in probes cached before prefill was measured)
    attn_gflops: float | None = None  # batched attention GFLOP/s in prefill (None: not measured)
    step_ratios: dict[str, dict[int, float]] = field(default_factory=dict)  # weight type -> {n tokens: time of one
    # llama_decode of n new tokens / of one} (kernel.measure_steps; empty in older probes)
    row_s: float = 0.0  # extra cost per matrix row per token (a dot product's set-up and sum), seconds (>= 0)
    batch_row_s: float = 0.0  # in a multi-token step, per token past the first: extra cost per matrix row beyond what
    # rows of batch_row_width weights would hold, seconds (>= 0)
    batch_row_width: float = 0.0  # weights per matrix row of the sized models (KernelPlan.row_width; 0 in older probes,
    # whose batch_row_s every row paid, past the step ratios)
    repacked_types: tuple[str, ...] = ()  # weight types whose sized model CPU_REPACK took (kernel.repacked_types;
    # () in older probes)
    type_cached_gbs: dict[str, float] = field(default_factory=dict)  # weight type -> GB/s of its decode kernel on
    # weights the caches hold (the cached models): how far the caches can speed that type up

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["points"] = [asdict(p) for p in self.points]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> KernelProbe:
        ratios = {t: {int(n): float(r) for n, r in table.items()} for t, table in (d.get("step_ratios") or {}).items()}
        return cls(
            **{
                **_known(cls, d),
                "points": tuple(KernelPoint(**_known(KernelPoint, p)) for p in d["points"]),
                "step_ratios": ratios,
                "repacked_types": tuple(d.get("repacked_types") or ()),
                "attn_score_s": tuple((int(dims), float(sec)) for dims, sec in d["attn_score_s"]),
            }
        )


@dataclass(frozen=True)
class ProbeResult:
    """One machine + backend + llama.cpp build, measured."""

    host: HostInfo  # what was detected
    backend: str  # backend these results are for
    build_id: str  # llama.cpp build fingerprint (version + system info hash)
    created_unix_s: float  # when the probe ran, seconds since the epoch
    memory: MemoryProbe  # host memory bandwidth
    compute: ComputeProbe  # host f32 GFLOP/s
    kernel: KernelProbe | None  # llama.cpp decode on synthetic models (None: not run)
    nameplate: Nameplate | None = None  # maker's figure for the chip, when known (not measured)
    read_curve: tuple[tuple[int, float], ...] = ()  # (working-set bytes, host read GB/s), 2 MiB up to the memory
    # probe's array size: what the caches add (probing.readcurve; measured with the kernel probe)
    disk: DiskProbe | None = (
        None  # sequential read of the cache dir's disk (None: not measured, or a cache from before it)
    )
    from_cache: bool = field(default=False, compare=False)  # loaded from the cache rather than run now

    @property
    def age_s(self) -> float:
        """Seconds since the probe ran."""
        return max(0.0, time.time() - self.created_unix_s)

    @property
    def ceiling_gbs(self) -> float:
        """The bandwidth of the pure roofline bound, GB/s.

        The best figure measured on this machine: host read/copy (the read curve's DRAM-sized read too:
        a shared machine's bandwidth moves by 2x from one minute to the next) and the kernels'
        raw rate on the models that dwarf the caches (bytes / step time, t0 included). On a GPU backend the nameplate figure
        (a physical bound of the device memory) is used when known and higher.
        """
        measured = [self.memory.read_gbs, self.memory.copy_gbs] + [g for _b, g in self.read_curve[-1:]]  # its DRAM size
        if self.kernel:
            measured += [
                (p.decode_bytes + p.kv_bytes) / p.step_s / 1e9
                for p in self.kernel.points
                if p.step_s > 0 and p.role in ("sized", "")
            ]  # tiny models read from cache
        best = max(measured)
        if self.backend.upper() != "CPU" and self.nameplate:
            best = max(best, self.nameplate.bandwidth_gbs)
        return best

    @property
    def device_fp16_tflops(self) -> float | None:
        """The offload device's nameplate peak FP16 TFLOPS on a GPU backend (TTFT floor); None on
        the CPU backend or for a device the table does not know."""
        if self.backend.upper() == "CPU" or not self.nameplate:
            return None
        hit = compute_lookup(self.nameplate.chip)
        return hit.fp16_tflops if hit else None

    def calibration(self) -> Calibration | None:
        """The roofline's calibration; None without a kernel probe."""
        if self.kernel is None or not self.kernel.type_gbs:
            return None
        kv = self.kernel.type_gbs.get("F16")
        return Calibration(
            backend=self.backend,
            ceiling_gbs=self.ceiling_gbs,
            type_gbs=dict(self.kernel.type_gbs),
            kv_gbs=kv,
            **{name: getattr(self.kernel, name) for name in SMALL_TERMS},
            compute_gflops=self.compute.f32_gflops,
            type_gflops=dict(self.kernel.type_gflops),
            attn_gflops=self.kernel.attn_gflops,
            batch_row_s=self.kernel.batch_row_s,
            batch_row_width=self.kernel.batch_row_width,
            repacked_types=tuple(self.kernel.repacked_types),
            type_cached_gbs=dict(self.kernel.type_cached_gbs),
            read_curve=self.read_curve if self.backend.upper() == "CPU" else (),  # the host's caches, not a GPU's
            step_ratios={t: tuple(sorted(table.items())) for t, table in self.kernel.step_ratios.items()},
        )

    def host_calibration(self) -> Calibration:
        """A calibration from the host probe alone (no kernel probe): the ceiling bandwidth and the
        host's compute; the step times are then the bound itself (source "bound")."""
        return Calibration(
            backend=self.backend, ceiling_gbs=self.ceiling_gbs, compute_gflops=self.compute.f32_gflops, source="bound"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "host": self.host.to_dict(),
            "backend": self.backend,
            "build_id": self.build_id,
            "created_unix_s": self.created_unix_s,
            "memory": self.memory.to_dict(),
            "compute": self.compute.to_dict(),
            "kernel": self.kernel.to_dict() if self.kernel else None,
            "nameplate": self.nameplate.to_dict() if self.nameplate else None,
            "read_curve": [list(p) for p in self.read_curve],
            "disk": self.disk.to_dict() if self.disk else None,
            "ceiling_gbs": self.ceiling_gbs,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, from_cache: bool = False) -> ProbeResult:
        """Inverse of to_dict. Raises KeyError/TypeError/ValueError on a malformed dict."""
        if d.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"probe schema {d.get('schema')!r} is not {SCHEMA_VERSION}")
        h = _known(HostInfo, d["host"])
        h.update(
            gpus=tuple(GPUInfo(**_known(GPUInfo, g)) for g in h["gpus"]),
            llama_devices=tuple(LlamaDevice(**_known(LlamaDevice, x)) for x in h.get("llama_devices", ())),
            llama_backends=tuple(h["llama_backends"]),
            warnings=tuple(h.get("warnings", ())),
        )
        return cls(
            host=HostInfo(**h),
            backend=str(d["backend"]),
            build_id=str(d["build_id"]),
            created_unix_s=float(d["created_unix_s"]),
            memory=MemoryProbe(**_known(MemoryProbe, d["memory"])),
            compute=ComputeProbe(**_known(ComputeProbe, d["compute"])),
            kernel=KernelProbe.from_dict(d["kernel"]) if d.get("kernel") else None,
            nameplate=Nameplate(**_known(Nameplate, d["nameplate"])) if d.get("nameplate") else None,
            read_curve=tuple((int(b), float(g)) for b, g in d.get("read_curve") or ()),
            disk=DiskProbe(**_known(DiskProbe, d["disk"])) if d.get("disk") else None,
            from_cache=from_cache,
        )


def _known(cls, d: dict[str, Any]) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in d.items() if k in names}
