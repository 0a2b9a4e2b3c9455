"""Run llama-cpp-python's OpenAI-compatible server with this machine's crash-guard verdict applied.

Why this exists: `python -m llama_cpp.server` builds its own `llama_model_params`, and none of
its settings turns off llama.cpp's extra CPU buffer types. On a machine whose guard verdict is
"repack" or "none" (ondevice.llama.guard: e.g. AMX tiles faulting with SIGILL), a plain server
dies on its first matrix product. This launcher patches the model load of llama_cpp in its own
process as ondevice.llama.model.load_model does (use_extra_bufts off; in "repack" mode the
weights CPU_REPACK takes placed there by name), then hands over to the server's main() with the
same arguments, so a server bench compares like with like against the in-process engine.

    python -m ondevice.llama.server --model M.gguf --host 127.0.0.1 --port 8000 [server options]

It is a tool for benchmarks and tests (bench --url), not a product feature: the product does not serve.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

__all__ = ["apply_verdict", "main"]

_keep: list[Any] = []  # override arrays llama.cpp reads while it loads


def apply_verdict(lib: Any = None) -> str:
    """Patch lib.llama_model_load_from_file (llama_cpp's low-level module) to honour the verdict; returns the mode."""
    from ondevice.llama.guard import cpu_buffer_verdict
    from ondevice.llama.model import place_weights

    if lib is None:
        import llama_cpp.llama_cpp as lib
    verdict = cpu_buffer_verdict()
    if verdict.mode == "unusable":
        raise SystemExit(f"ondevice: {verdict.note or 'llama.cpp crashed in its self-test on this machine'}")
    if verdict.mode == "all":
        return verdict.mode
    original = lib.llama_model_load_from_file

    def load(path: bytes, params: Any) -> Any:
        _keep.append(place_weights(params, Path(path.decode()), verdict))
        return original(path, params)

    lib.llama_model_load_from_file = load
    return verdict.mode


def main(argv: list[str] | None = None) -> None:
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    mode = apply_verdict()
    logging.getLogger("ondevice.llama.server").info("CPU buffer types %s (crash guard)", mode)
    from llama_cpp.server.__main__ import main as server_main

    sys.argv = ["llama_cpp.server", *(sys.argv[1:] if argv is None else argv)]
    server_main()


if __name__ == "__main__":
    main()
