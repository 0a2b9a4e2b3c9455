"""Timing a model from its header alone: two twins of fewer blocks, timed in pairs, extrapolated to the model's
blocks (probing.twins.time_header); the twin files are scratch and do not stay behind."""

from __future__ import annotations

from dataclasses import replace

from ondevice.quant.hfconfig import header_from_hf_config
from ondevice.quant.twin import quantized_header, write_twin

from ondevice.core import paths
from ondevice.gguf.spec import inspect
from ondevice.probing.timing import TimingPlan
from ondevice.probing.twins import time_header
from tests.test_twin_hfconfig import tiny_config

PLAN = TimingPlan(name="quick", chunks=(1, 16), chain=1, short_prompt=8, decode_steps=4, batch=(2,), rounds=1)


def test_a_header_is_timed_on_two_twins_and_extrapolated_to_its_blocks(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(paths, "SHARED_MEMORY_DIR", shm)
    config = tiny_config("llama-3.1-8b") | {"num_hidden_layers": 6}
    header = quantized_header(header_from_hf_config(config), "Q8_0")
    spec = inspect(write_twin(header, tmp_path / "model.gguf", sparse=True))
    work = tmp_path / "twins"
    timing, info = time_header(
        header, spec, plan=PLAN, work_dir=work, engine_args={"n_ctx": 256, "n_threads": 1}, blocks=(1, 3)
    )
    assert timing.source == "twins" and timing.layers == (1, 3) and info.spec.n_layer == 1
    contexts = [ctx for ctx, _s in timing.decode]
    assert min(contexts) <= 16 and max(contexts) >= 32  # short decode and after the chain (16 + 16 on top)
    assert {(pos, k) for pos, k, _s in timing.prefill} == {(0, 1), (0, 16), (16, 16)}
    assert [b for b, _s in timing.batch] == [2]
    assert all(s > 0 for _c, s in timing.decode) and timing.elapsed_s > 0
    written = [f for f in shm.rglob("*") if f.is_dir()] if hasattr(paths.os, "getuid") else [work]
    assert written and not list(shm.rglob("*.gguf")) and not list(work.glob("*.gguf"))  # written, then removed
    whole, _info = time_header(
        header,
        spec,
        plan=replace(PLAN, batch=()),
        work_dir=work,
        engine_args={"n_ctx": 256, "n_threads": 1},
        blocks=None,
    )
    assert whole.source == "twin" and not list(shm.rglob("*.gguf")) and not list(work.glob("*.gguf"))
