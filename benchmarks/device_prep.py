"""Prepare, on a machine with PyPI, what benchmarks/device_check.py needs on a GPU machine that has none.

    python -m benchmarks.device_prep            # fills .device/ (git-ignored), about 20 MB

The device machine has Python, numpy, psutil, CMake, ninja, nvcc and scikit-build-core, but no network:
so .device/ gets llama-cpp-python's source (its sdist without llama.cpp's vocabularies, docs, tests and
benches: 77 MB -> about 12 MB), wheels of this project's other pure-Python dependencies, and the header
of the default model (metadata, tokenizer and tensor table: its weights, 240 MB, do not travel; the check
fills the data section with zeros, which a GPU decodes exactly as fast). Carry it with the run:
carry [".device"], command `python3 -m benchmarks.device_check`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON = "llama-cpp-python==0.3.36"
# pure-Python packages the device image lacks (or has too old): pinned to what this checkout tests with
WHEELS = (
    "gguf==0.19.0",
    "textual==8.2.8",
    "rich==15.0.0",
    "platformdirs==4.14.9",
    "diskcache==5.6.3",
    "mdit-py-plugins==0.5.0",
    "linkify-it-py==2.0.3",
    "uc-micro-py==1.0.3",
)
# llama.cpp source folders a llama-cpp-python build does not read
STRIP = (
    ".git",
    "vendor/llama.cpp/.git",
    "vendor/llama.cpp/models",
    "vendor/llama.cpp/docs",
    "vendor/llama.cpp/tests",
    "vendor/llama.cpp/benches",
    "vendor/llama.cpp/tools/server/public",
    "vendor/llama.cpp/tools/server/webui",
    "vendor/llama.cpp/examples",
    "vendor/llama.cpp/.devops",
    "vendor/llama.cpp/media",
    "examples",
    "docs",
)


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def stripped_sdist(dest: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        pip("download", "--no-deps", "--no-binary", ":all:", LLAMA_CPP_PYTHON, "-d", tmp)
        (src,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
        out = dest / src.name.replace(".tar.gz", "-stripped.tar.gz")
        with tarfile.open(src) as tin, tarfile.open(out, "w:gz", compresslevel=9) as tout:
            for m in tin.getmembers():
                rel = m.name.split("/", 1)[1] if "/" in m.name else ""
                if any(rel == s or rel.startswith(s + "/") for s in STRIP):
                    continue
                tout.addfile(m, tin.extractfile(m) if m.isfile() else None)
    return out


def default_header(dest: Path) -> Path:
    """The default model's bytes before its tensor data, and its size: the check rebuilds a zero-weight copy."""
    from ondevice.gguf.spec import inspect
    from ondevice.models.materialize import resolve_model

    path = resolve_model(None)
    spec = inspect(path)
    head = dest / "default-header.gguf"
    with open(path, "rb") as f:
        head.write_bytes(f.read(spec.header_bytes))
    (dest / "default-header.json").write_text(
        json.dumps({"name": path.name, "file_bytes": path.stat().st_size, "header_bytes": spec.header_bytes})
    )
    return head


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=Path(__file__).resolve().parents[1] / ".device")
    args = ap.parse_args(argv)
    if args.dest.exists():
        shutil.rmtree(args.dest)
    (args.dest / "wheels").mkdir(parents=True)
    print("sdist:", stripped_sdist(args.dest))
    pip("download", "--no-deps", "--only-binary=:all:", "-d", str(args.dest / "wheels"), *WHEELS)
    print("default model header:", default_header(args.dest))
    total = sum(p.stat().st_size for p in args.dest.rglob("*") if p.is_file())
    print(f".device/: {total / 2**20:.1f} MiB (the device tool carries 64 MiB with the working tree)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
