"""Host and accelerator detection: OS, CPU, RAM, caches, Apple chip, GPUs, llama.cpp backend.

Each source is read through a small parser of its recorded output (sysctl, nvidia-smi,
rocm-smi, llama.cpp's system info, /proc/cpuinfo, sysfs cache sizes), so detection on
machines we do not have is tested against recorded outputs. A command that is missing,
fails or prints something unexpected leaves its fields unknown (None) and a warning.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import psutil

from ondevice.llama.build import build_info
from ondevice.llama.devices import LlamaDevice, is_gpu_backend, llama_devices
from ondevice.llama.devices import default_threads as llama_default_threads

__all__ = [
    "GPUInfo",
    "HostInfo",
    "LlamaDevice",
    "llama_devices",
    "detect",
    "parse_sysctl",
    "parse_nvidia_smi",
    "parse_rocm_smi",
    "parse_system_info",
    "parse_cpuinfo",
    "parse_cache_size",
    "default_threads",
    "NVIDIA_SMI_ARGS",
    "ROCM_SMI_ARGS",
    "SYSCTL_KEYS",
]

NVIDIA_SMI_ARGS = ("--query-gpu=name,memory.total,memory.free,driver_version", "--format=csv,noheader,nounits")
ROCM_SMI_ARGS = ("--showproductname", "--showmeminfo", "vram", "--json")
SYSCTL_KEYS = (
    "machdep.cpu.brand_string",
    "hw.memsize",
    "hw.physicalcpu",
    "hw.logicalcpu",
    "hw.perflevel0.physicalcpu",
    "hw.l2cachesize",
    "hw.l3cachesize",
    "hw.perflevel0.l2cachesize",
)
_MIB = 1 << 20

Runner = Callable[[list[str]], "str | None"]  # argv -> stdout, or None when it cannot run


@dataclass(frozen=True)
class GPUInfo:
    vendor: str  # "NVIDIA", "AMD", "Apple"
    name: str  # as the driver prints it
    vram_total_bytes: int | None  # device memory, bytes (None: unknown)
    vram_free_bytes: int | None  # free device memory when detected, bytes
    driver: str | None = None  # driver version or GFX version


@dataclass(frozen=True)
class HostInfo:
    os: str  # "Linux 6.1.0", "Darwin 24.1.0", ...
    machine: str  # "x86_64", "arm64", ...
    cpu_model: str | None  # CPU model name
    physical_cores: int | None  # physical cores (performance cores on Apple silicon: see perf_cores)
    logical_cores: int | None  # hardware threads
    perf_cores: int | None  # Apple silicon performance cores (None elsewhere)
    ram_total_bytes: int | None  # system RAM, bytes
    ram_available_bytes: int | None  # RAM available when detected, bytes
    llc_bytes: int | None  # last-level cache one core sees, bytes
    apple_chip: str | None  # "Apple M2 Pro" on Apple silicon
    unified_memory: bool  # GPU shares system RAM (Apple silicon)
    gpus: tuple[GPUInfo, ...]  # discrete/integrated GPUs found by nvidia-smi / rocm-smi / sysctl
    llama_backends: tuple[str, ...]  # backends in llama.cpp's system info, e.g. ("CUDA", "CPU")
    llama_features: dict[str, str]  # "CPU.AVX2" -> "1", "CUDA.ARCHS" -> "890", ...
    llama_cpp_version: str | None  # llama-cpp-python version
    llama_devices: tuple[LlamaDevice, ...] = ()  # devices ggml registered (empty when unknown)
    warnings: tuple[str, ...] = field(default=())  # what could not be detected, and why

    @property
    def accelerator_backend(self) -> str:
        """The GPU backend llama.cpp was built with ("CUDA", "Metal", "Vulkan", ...) or "CPU"."""
        return next((b for b in self.llama_backends if is_gpu_backend(b)), "CPU")

    @property
    def chip_name(self) -> str | None:
        """The name whose nameplate bandwidth applies to offloaded decode."""
        return self.apple_chip or (self.gpus[0].name if self.gpus else None)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            gpus=[asdict(g) for g in self.gpus],
            llama_backends=list(self.llama_backends),
            llama_devices=[asdict(x) for x in self.llama_devices],
            warnings=list(self.warnings),
            accelerator_backend=self.accelerator_backend,
        )
        return d


# ---------- parsers of recorded outputs ----------


def parse_sysctl(text: str) -> dict[str, str]:
    """`sysctl k1 k2 ...` output ("key: value" lines) -> {key: value}."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and "." in key and " " not in key.strip():  # real keys are dotted: hw.memsize
            out[key.strip()] = value.strip()
    return out


def parse_nvidia_smi(text: str) -> tuple[GPUInfo, ...]:
    """`nvidia-smi --query-gpu=name,memory.total,memory.free,driver_version --format=csv,noheader,nounits`.

    Memory is in MiB. Lines that do not have four fields are skipped.
    """
    gpus = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4 or not parts[0]:
            continue
        gpus.append(GPUInfo("NVIDIA", parts[0], _mib(parts[1]), _mib(parts[2]), parts[3] or None))
    return tuple(gpus)


def parse_rocm_smi(text: str) -> tuple[GPUInfo, ...]:
    """`rocm-smi --showproductname --showmeminfo vram --json` -> GPUs (bytes are given in B)."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return ()
    if not isinstance(data, dict):
        return ()
    gpus = []
    for card, fields in sorted(data.items()):
        if not card.startswith("card") or not isinstance(fields, dict):
            continue
        name = fields.get("Card Series") or fields.get("Card series") or fields.get("Card Model") or card
        total = _int(fields.get("VRAM Total Memory (B)"))
        used = _int(fields.get("VRAM Total Used Memory (B)"))
        free = total - used if total is not None and used is not None else None
        gpus.append(GPUInfo("AMD", str(name), total, free, fields.get("GFX Version")))
    return tuple(gpus)


def parse_system_info(text: str) -> tuple[tuple[str, ...], dict[str, str]]:
    """llama_print_system_info(): "CUDA : ARCHS = 890 | ... | CPU : AVX2 = 1 | ..." ->
    (backends in order, {"BACKEND.KEY": value})."""
    backends: list[str] = []
    features: dict[str, str] = {}
    current = None
    for segment in text.split("|"):
        segment = segment.strip()
        if not segment:
            continue
        while " : " in segment:  # "NAME : KEY = V"; a backend without features prints "NAME : " alone
            head, _, segment = segment.partition(" : ")
            current = head.strip()
            if current and current not in backends:
                backends.append(current)
            segment = segment.strip()
        key, eq, value = segment.partition("=")
        if current and eq and key.strip():
            features[f"{current}.{key.strip()}"] = value.strip()
    return tuple(backends), features


def parse_cpuinfo(text: str) -> str | None:
    """/proc/cpuinfo -> the first "model name" (x86) or "Hardware"/"Model" (ARM) value."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip():
            found.setdefault(key.strip().lower(), value.strip())
    return found.get("model name") or found.get("hardware") or found.get("model") if found else None


def parse_cache_size(text: str) -> int | None:
    """sysfs cache size ("32768K", "1M", "512") -> bytes."""
    s = text.strip().upper()
    scale = {"K": 1024, "M": _MIB, "G": 1 << 30}.get(s[-1:], 1)
    digits = s[:-1] if s[-1:] in "KMG" else s
    return int(digits) * scale if digits.isdigit() else None


def _mib(s: str) -> int | None:
    v = _int(s)
    return v * _MIB if v is not None else None


def _int(s) -> int | None:
    try:
        return int(str(s).strip())
    except (TypeError, ValueError):
        return None


# ---------- live detection ----------


def run_command(argv: list[str], timeout_s: float = 5.0) -> str | None:
    """Run a detection command: its stdout (even with a non-zero status, as sysctl gives when one
    key is unknown), or None when it is missing, hangs or prints nothing."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.stdout.strip() or done.returncode == 0 else None


def detect(
    *, run: Runner = run_command, system_info: str | None = None, system: str | None = None, sys_root: Path = Path("/")
) -> HostInfo:
    """Detect this host. `run`, `system_info`, `system` and `sys_root` are injectable for tests."""
    system = system or platform.system()
    warnings: list[str] = []
    vm = psutil.virtual_memory()
    info = HostInfo(
        os=f"{system} {platform.release()}".strip(),
        machine=platform.machine(),
        cpu_model=None,
        physical_cores=psutil.cpu_count(logical=False),
        logical_cores=psutil.cpu_count(logical=True),
        perf_cores=None,
        ram_total_bytes=vm.total,
        ram_available_bytes=vm.available,
        llc_bytes=None,
        apple_chip=None,
        unified_memory=False,
        gpus=(),
        llama_backends=(),
        llama_features={},
        llama_cpp_version=build_info()[0],
    )
    if system == "Darwin":
        info = _apply_sysctl(info, run(["sysctl", *SYSCTL_KEYS]), warnings)
    else:
        info = replace(
            info, cpu_model=_read_cpu_model(sys_root) or platform.processor() or None, llc_bytes=_linux_llc(sys_root)
        )
    gpus = _detect_gpus(run, warnings) if system != "Darwin" else info.gpus
    live = system_info is None  # llama.cpp's own devices only when asking this process's llama.cpp
    if live:
        system_info = build_info()[1]
        if system_info is None:
            warnings.append("llama.cpp: cannot import it; backend unknown")
    backends, features = parse_system_info(system_info or "")
    if system_info and not backends:
        warnings.append("llama.cpp system info: unexpected format")
    if info.cpu_model is None:
        warnings.append("CPU model: unknown")
    return replace(
        info,
        gpus=gpus,
        llama_backends=backends,
        llama_features=features,
        llama_devices=llama_devices() if live and system_info else (),
        warnings=tuple(warnings),
    )


def _apply_sysctl(info: HostInfo, text: str | None, warnings: list[str]) -> HostInfo:
    values = parse_sysctl(text or "")
    if not values:
        warnings.append("sysctl: missing or unexpected output; Apple chip unknown")
        return info
    brand = values.get("machdep.cpu.brand_string")
    apple = brand if brand and brand.startswith("Apple") else None
    llc = (
        _int(values.get("hw.l3cachesize"))
        or _int(values.get("hw.perflevel0.l2cachesize"))
        or _int(values.get("hw.l2cachesize"))
    )
    memsize = _int(values.get("hw.memsize"))
    gpus = (GPUInfo("Apple", apple, memsize, None),) if apple else ()
    return replace(
        info,
        cpu_model=brand or info.cpu_model,
        physical_cores=_int(values.get("hw.physicalcpu")) or info.physical_cores,
        logical_cores=_int(values.get("hw.logicalcpu")) or info.logical_cores,
        perf_cores=_int(values.get("hw.perflevel0.physicalcpu")) if apple else None,
        ram_total_bytes=memsize or info.ram_total_bytes,
        llc_bytes=llc or None,
        apple_chip=apple,
        unified_memory=apple is not None,
        gpus=gpus,
    )


def _detect_gpus(run: Runner, warnings: list[str]) -> tuple[GPUInfo, ...]:
    gpus: list[GPUInfo] = []
    for tool, args, parse in (
        ("nvidia-smi", NVIDIA_SMI_ARGS, parse_nvidia_smi),
        ("rocm-smi", ROCM_SMI_ARGS, parse_rocm_smi),
    ):
        out = run([tool, *args])
        if out is None:
            continue
        found = parse(out)
        if not found:
            warnings.append(f"{tool}: unexpected output; its GPUs are unknown")
        gpus.extend(found)
    return tuple(gpus)


def _read_cpu_model(root: Path) -> str | None:
    try:
        return parse_cpuinfo((root / "proc/cpuinfo").read_text(errors="replace"))
    except OSError:
        return None


def _linux_llc(root: Path) -> int | None:
    """Largest cache level cpu0 sees (sysfs), bytes."""
    best_level, best = 0, None
    for index in sorted((root / "sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level = int((index / "level").read_text())
            size = parse_cache_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if size and level >= best_level:
            best_level, best = level, size
    return best


def default_threads(info: HostInfo | None = None) -> int:
    """One thread per performance core this process may use (ondevice.llama.devices has the rule)."""
    return llama_default_threads(info.perf_cores if info is not None else None)
