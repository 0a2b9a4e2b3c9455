"""Time a model from its header: its twin (the same tensors, names, shapes and types, random data) on this
machine. A model of few bytes is timed whole; a larger one as two twins of fewer blocks, the figures
extrapolated linearly in blocks (roofline.extrapolate_layers), so timing an 8B model takes seconds.

The twins' blocks follow the model's: as many as its layer pattern's period (so a twin's windowed and
full-context layers, and a hybrid's recurrent and attention layers, come in the model's proportion; a pattern
that never repeats, as LFM2's irregular attention layers, is timed whole), and each twin's block types in the
model's mix of quantization types (quant.twin.matching_blocks). The twin files are written in shared memory
where there is room (else the cache dir), timed, and removed; the timing is cached under the model's shape like
any other (probing.timing_for).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from ondevice.core import paths
from ondevice.gguf.spec import ModelSpec
from ondevice.roofline.timing import ShapeTiming, extrapolate_layers

__all__ = ["time_header", "twin_blocks", "WHOLE_BYTES", "window_period"]

log = logging.getLogger(__name__)
Progress = Callable[[str], None]
Opened = Callable[[Path], None]  # the first-open check of a twin file just written

WHOLE_BYTES = 768 << 20  # a model of at most this many weight bytes is timed whole (one twin, or its own file)


def window_period(spec: ModelSpec) -> int:
    """The period of a model's layer pattern (1 where every layer is alike): sliding-window and full-context
    attention, and a hybrid's recurrent layers beside those that attend (ModelSpec.attention_layers). Gemma 3's
    five windowed layers and one global layer repeat every 6 blocks; LFM2 1.2B's attention at blocks 2, 5, 8, 10,
    12 and 14 of 16 never repeats (a period repeats at least once): its period is the model (a twin of fewer
    blocks would change what a step does per block: attention over the context in some, a convolution in the
    others)."""
    n = spec.n_layer or 0
    swa = set(spec.swa_layers) if spec.sliding_window else set()
    attends = set(spec.attention_layers)
    pattern = [(i in swa, i in attends) for i in range(n)]
    if len(set(pattern)) <= 1:
        return 1
    return next((p for p in range(1, n // 2 + 1) if all(pattern[i] == pattern[i % p] for i in range(n))), n)


def twin_blocks(spec: ModelSpec, lead: int = 0) -> tuple[int, int] | None:
    """(fewer, more) blocks of the two twins of a model too large to time whole, or None (time it whole): the
    fewer is one period of its layer pattern, the more three (two periods apart: a mix of two block types comes
    out even). A twin keeps the model's first blocks: with `lead` leading blocks unlike the rest (a mixture of
    experts' dense ones, quant.twin.leading_blocks), the fewer holds them all and one period of the rest, so the two
    twins differ by blocks like the rest alone and the line through them counts the lead once (DeepSeek-V2's 1:
    twins of 2 and 4; DeepSeek-V3's 3: of 4 and 6). Not the lead alone: llama.cpp's last block runs its
    feed-forward for the output tokens only (a prompt's last), so a fewer twin ending on a dense block would time
    that block's feed-forward for one token where the model runs it for the whole chunk."""
    period = window_period(spec)
    few = period * (-(-lead // period) + 1) if lead else period
    more = few + 2 * period
    if spec.weight_bytes <= WHOLE_BYTES or (spec.n_layer or 0) <= more:
        return None
    return few, more


def time_header(
    header: Any,
    spec: ModelSpec,
    *,
    plan: Any,
    work_dir: Path,
    engine_args: dict[str, Any] | None = None,
    progress: Progress | None = None,
    blocks: tuple[int, int] | None | str = "auto",
    model_path: Path | None = None,
) -> tuple[ShapeTiming, Any]:
    """(the model's timing from twins of its header, the EngineInfo of a twin engine). blocks: "auto"
    (twin_blocks), None (one twin of every block), or (fewer, more). model_path: the model's own file, when
    there is one: the twins then hold its bytes (each twin block its model block's), not random data."""
    from ondevice.quant.twin import ModelData, leading_blocks, matching_blocks, reduce_layers, shape_key

    say = progress or (lambda _msg: None)
    if isinstance(blocks, str):  # "auto"
        blocks = twin_blocks(spec, leading_blocks(header))
    opened = partial(_vouch_for, identity=f"twin of {shape_key(header)}")
    if blocks is None:
        work_dir = paths.scratch_dir(work_dir, _data_bytes(header))
        timing, info = _time_twin(header, work_dir, f"{spec.n_layer}", plan, engine_args or {}, say, opened)
        return replace(timing, source="twin"), info
    few, more = blocks
    if plan.name == "full":  # the twins' full plan, with the batched steps only when the plan asked has them
        from ondevice.probing.plans import TWINS

        plan = TWINS if plan.batch else replace(TWINS, batch=())
    picks = [matching_blocks(header, n) for n in (few, more)]
    twins = [reduce_layers(header, len(p), p) for p in picks]
    models = [None if model_path is None else ModelData(Path(model_path), tuple(p)) for p in picks]
    work_dir = paths.scratch_dir(work_dir, _data_bytes(twins[0]) + _data_bytes(twins[1]) - _outside_bytes(header))
    with contextlib.ExitStack() as stack:
        # the twins share what lies outside their blocks (one file, _twins_sharing_outside); the first twin's
        # first-open check (a child process) runs while the second is written; the second's is then the same
        # verdict, kept under the model's shape
        outside = None if model_path is None else ModelData(Path(model_path))
        add_twin = stack.enter_context(_twins_sharing_outside(header, work_dir, outside))
        a = add_twin(twins[0], f"{few}", say, models[0])
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=1))
        checked = pool.submit(opened, a)  # (leaving the block waits for it before `a` is removed)
        b = add_twin(twins[1], f"{more}", say, models[1])
        checked.result()
        opened(b)
        with _engines((a, b), engine_args or {}) as (few_engine, many_engine):
            from ondevice.probing.timing import time_pair

            timing_few, timing_many = time_pair(few_engine, many_engine, plan, progress=say)
            cells = partial(timing_few.decode_cells, few_engine.info.spec)
            n_layer = int(spec.n_layer or more)  # a spec without a block count: the larger twin is the model
            return extrapolate_layers(timing_few, timing_many, few, more, n_layer, cells), few_engine.info


def _vouch_for(path: Path, *, identity: str) -> None:
    """The first-open check of a twin file (ondevice.llama.firstopen), its verdict kept under the model's shape:
    every twin of a header opens as the first did (the same metadata but the block count), so a model's twins
    cost one child process on this machine and build, not one per file written."""
    from ondevice.llama.firstopen import check_first_open

    check_first_open(path, identity=identity)


def _data_bytes(header: Any) -> int:
    return sum(t.n_bytes for t in header.tensors)


def _outside_bytes(header: Any) -> int:
    from ondevice.quant.twin import split_outside_blocks

    return _data_bytes(split_outside_blocks(header)[1])


_SCRATCH_NAME = re.compile(r"^twin-[0-9a-f]{16}-(p(?P<pid>\d+)-)?.*\.gguf$")  # _scratch_stem's (no pid: older)


def _scratch_stem(work_dir: Path, header: Any) -> Path:
    """Where this process writes the twins of `header` in work_dir: names of its own (the pid in them), so that
    processes timing one shape at once never share a file, and what a killed one left (it never reached its
    clean-up) is removed here first, once its process is gone (paths.remove_left_behind)."""
    from ondevice.quant.twin import shape_key

    work_dir.mkdir(parents=True, exist_ok=True)
    paths.remove_stale_temps(work_dir, owned=True)
    paths.remove_left_behind(work_dir, _SCRATCH_NAME)
    return work_dir / f"twin-{shape_key(header)}-p{os.getpid()}"


@contextlib.contextmanager
def _twins_sharing_outside(header: Any, work_dir: Path, model: Any = None) -> Iterator[Callable[..., Path]]:
    """A writer of twins of `header` (-> each twin's path), all removed after, written as models split in two
    (quant.twin.split_outside_blocks) that share their second file: what lies outside the blocks, the embedding
    and output head (most of a fewer-block twin's bytes when the vocabulary is large), is written once, and the
    engines on the twins map one copy of it. Where a file system has no hard links, a symbolic one. `model`
    (quant.twin.ModelData): the model's file, whose bytes the shared file holds; each twin is given its own."""
    from ondevice.gguf.reader import split_path
    from ondevice.quant.twin import split_outside_blocks, write_twin

    stem = _scratch_stem(work_dir, header)
    written: list[Path] = []

    def add_twin(twin: Any, tag: str, say: Progress, twin_model: Any = None) -> Path:
        first, second = split_path(f"{stem}-{tag}", 0, 2), split_path(f"{stem}-{tag}", 1, 2)
        say(f"writing a twin ({tag} blocks)")
        written.append(first)
        # a scratch file, not flushed to disk
        write_twin(split_outside_blocks(twin)[0], first, durable=False, model=twin_model)
        written.append(second)
        try:
            os.link(shared, second)
        except OSError:
            os.symlink(shared, second)
        return first

    try:
        shared = write_twin(split_outside_blocks(header)[1], f"{stem}-outside.gguf", durable=False, model=model)
        written.append(shared)
        yield add_twin
    finally:
        for path in written:
            with contextlib.suppress(OSError):
                path.unlink()


@contextlib.contextmanager
def _engines(files: tuple[Path, ...], engine_args: dict[str, Any]) -> Iterator[list[Any]]:
    """An engine on each file, all closed after."""
    from ondevice.engine import load

    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(load(path, **engine_args)) for path in files]


def _time_twin(
    header: Any, work_dir: Path, tag: str, plan: Any, engine_args: dict[str, Any], say: Progress, opened: Opened
):
    from ondevice.engine import load
    from ondevice.probing.timing import time_engine

    with _twin_file(header, work_dir, tag, say, opened) as path, load(path, **engine_args) as engine:
        return time_engine(engine, plan, progress=say), engine.info


@contextlib.contextmanager
def _twin_file(header: Any, work_dir: Path, tag: str, say: Progress, opened: Opened) -> Iterator[Path]:
    """A twin of header written in work_dir for the time of the with block (removed after, whatever happens),
    first-opened (`opened`) before it is handed out."""
    from ondevice.quant.twin import write_twin

    path = Path(f"{_scratch_stem(work_dir, header)}-{tag}.gguf")
    say(f"writing a twin ({tag} blocks)")
    write_twin(header, path, durable=False)  # a scratch file, not flushed to disk
    try:
        opened(path)
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
