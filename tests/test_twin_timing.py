"""Timing a model from its header alone: two twins of fewer blocks, timed in pairs, extrapolated to the model's
blocks (probing.twins.time_header); the twin files are scratch and do not stay behind."""

from __future__ import annotations

from dataclasses import replace

import pytest
from ondevice.quant.hfconfig import header_from_hf_config
from ondevice.quant.twin import quantized_header, write_twin

from ondevice.core import paths
from ondevice.gguf.spec import inspect
from ondevice.probing import twins as twins_mod
from ondevice.probing.plans import TimingPlan
from ondevice.probing.twins import time_header
from tests.test_twin_hfconfig import tiny_config

PLAN = TimingPlan(name="quick", chunks=(1, 16), chain=1, short_prompt=8, decode_steps=4, batch=(2,), rounds=1)


@pytest.fixture(autouse=True)
def one_pair_of_attention_bursts(monkeypatch):
    """A tiny twin's steps take microseconds, so its attention would be the median of the most pairs of bursts the
    budget allows; these tests count bursts and script their figures one pair a round (test_the_attention_is_the_median
    ... sets the budget itself)."""
    import ondevice.probing.timing as timing_mod

    monkeypatch.setattr(timing_mod, "_ATTENTION_BUDGET_S", 0.0)


def _tiny_shape(tmp_path, config_name: str, blocks: int):
    """(header, spec) of a public config at tiny widths, `blocks` blocks, Q8_0 (the spec read from a sparse file)."""
    config = tiny_config(config_name) | {"num_hidden_layers": blocks}
    header = quantized_header(header_from_hf_config(config), "Q8_0")
    return header, inspect(write_twin(header, tmp_path / "model.gguf", sparse=True))


def test_a_header_is_timed_on_two_twins_and_extrapolated_to_its_blocks(tmp_path, monkeypatch):
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(paths, "SHARED_MEMORY_DIR", shm)
    header, spec = _tiny_shape(tmp_path, "llama-3.1-8b", 6)
    work = tmp_path / "twins"
    cells = []  # the fewer twin's decode cells the extrapolation multiplies by the blocks
    extrapolate = twins_mod.extrapolate_layers
    monkeypatch.setattr(twins_mod, "extrapolate_layers", lambda *a: cells.append(a[-1]) or extrapolate(*a))
    timing, info = time_header(
        header, spec, plan=PLAN, work_dir=work, engine_args={"n_ctx": 256, "n_threads": 1}, blocks=(1, 3)
    )
    assert timing.source == "twins" and timing.layers == (1, 3) and info.spec.n_layer == 1
    # the twins' engine (CPU, flash attention, f16 cache) decodes at the cost of the padded KV view: so do the
    # cells its attention per cell is multiplied over, and the prediction read from the timing
    assert (timing.kv_pad, timing.kv_pad_from) == (256, 512)
    assert [cells[0](n) for n in (100, 300, 600)] == [100, 512, 768]
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


def test_the_twins_share_one_file_of_what_lies_outside_their_blocks(tmp_path, monkeypatch):
    """Each twin is a model split in two whose second file (the embedding, output head and norm) is one file
    written once; the engines load both twins through it, and nothing stays behind."""
    import os

    import ondevice.quant.twin as twin_mod

    import ondevice.engine
    from ondevice.gguf.reader import read_gguf

    header, spec = _tiny_shape(tmp_path, "llama-3.1-8b", 5)
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(paths, "SHARED_MEMORY_DIR", shm)
    written: list = []
    real_write, real_load = twin_mod.write_twin, ondevice.engine.load
    monkeypatch.setattr(
        twin_mod, "write_twin", lambda h, path, **k: written.append((h, path)) or real_write(h, path, **k)
    )
    loaded: list = []

    def load(path, **kwargs):
        g = read_gguf(path)
        loaded.append((g.get("llama.block_count"), [os.stat(f.path).st_ino for f in g.files]))
        return real_load(path, **kwargs)

    monkeypatch.setattr(ondevice.engine, "load", load)
    work = tmp_path / "twins"
    args = {"n_ctx": 256, "n_threads": 1}
    time_header(header, spec, plan=replace(PLAN, batch=()), work_dir=work, engine_args=args, blocks=(1, 3))
    blocks = [sorted({t.name.split(".")[1] for t in h.tensors if t.name.startswith("blk.")}) for h, _p in written]
    assert blocks == [[], ["0"], ["0", "1", "2"]]  # what lies outside the blocks, once; then each twin's blocks
    assert [n for n, _inodes in loaded] == [1, 3]  # (the fewer twin's short-context partner is its sibling: no load)
    assert len({inodes[1] for _n, inodes in loaded}) == 1 and len({inodes[0] for _n, inodes in loaded}) == 2
    assert not list(shm.rglob("*.gguf")) and not list(work.rglob("*.gguf"))  # written, then removed


def test_twins_stop_after_the_rounds_agree_and_time_batches_in_the_first_round_only(tmp_path, monkeypatch):
    import ondevice.probing.timing as timing_mod
    from ondevice.engine.batch import BatchContext
    from ondevice.llama import firstopen

    children: list = []
    real_child = firstopen.open_vocab_only_in_child
    monkeypatch.setattr(firstopen, "open_vocab_only_in_child", lambda p: children.append(p) or real_child(p))
    batches: list = []
    real_batch = BatchContext.generate
    monkeypatch.setattr(BatchContext, "generate", lambda self, *a, **k: batches.append(1) or real_batch(self, *a, **k))
    header, spec = _tiny_shape(tmp_path, "llama-3.1-8b", 7)  # a shape no other test times
    plan = replace(PLAN, rounds=3, min_rounds=2, batch_rounds=1)
    rounds: dict[bool, list[str]] = {}
    for agree in (True, False):
        unsettled = set() if agree else {("chunk", 16)}
        monkeypatch.setattr(timing_mod, "unsettled", lambda _diffs, _longest, u=unsettled: u)
        said: list[str] = []
        args = {"n_ctx": 256, "n_threads": 1}
        timing, _info = time_header(
            header, spec, plan=plan, work_dir=tmp_path / "w", engine_args=args, blocks=(1, 3), progress=said.append
        )
        rounds[agree] = [line for line in said if "round" in line]
        assert [b for b, _s in timing.batch] == [2]
    assert len(rounds[True]) == 2 and len(rounds[False]) == 3
    assert "disagree" in rounds[False][2] and not any("disagree" in line for line in rounds[False][:2])
    assert len(batches) == 2 * 2  # the first round of each timing, on both twins
    # the first-open check ran once for all four twin files: its verdict is kept under the header's shape
    assert len(children) == 1


def test_a_third_round_times_only_what_the_first_two_disagree_on(tmp_path, monkeypatch):
    import ondevice.probing.timing as timing_mod

    asked: list[tuple[int, int]] = []  # (blocks of the engine, prompt tokens) of every prompt timed
    real_first = timing_mod.first_token_s
    monkeypatch.setattr(
        timing_mod,
        "first_token_s",
        lambda eng, ids, reuse, max_tokens=1: (
            asked.append((eng.info.spec.n_layer, len(ids))) or real_first(eng, ids, reuse, max_tokens)
        ),
    )
    bursts: list[int] = []  # blocks of the first engine of every pair of decode bursts
    real_bursts = timing_mod._decode_bursts
    monkeypatch.setattr(
        timing_mod,
        "_decode_bursts",
        lambda a, a_ids, b, b_ids, steps: bursts.append(a.info.spec.n_layer) or real_bursts(a, a_ids, b, b_ids, steps),
    )
    header, spec = _tiny_shape(tmp_path, "llama-3.1-8b", 5)
    plan = replace(PLAN, batch=(), rounds=3, min_rounds=2)
    seen: dict[str, tuple[list, list]] = {}
    cases = (("none", set()), ("chunk", {("chunk", 16)}), ("blocks", {("blocks",)}), ("attention", {("attention",)}))
    for name, unsettled in cases:
        monkeypatch.setattr(timing_mod, "unsettled", lambda _diffs, _longest, u=unsettled: u)
        asked.clear(), bursts.clear()
        args = {"n_ctx": 256, "n_threads": 1}
        time_header(header, spec, plan=plan, work_dir=tmp_path / "w", engine_args=args, blocks=(1, 3))
        seen[name] = (list(asked), list(bursts))
    two_asked, two_bursts = seen["none"]  # two full rounds
    assert two_bursts == [1, 3, 1, 3]  # each round: long vs short context on the fewer, then more vs fewer blocks
    # attention: the chain on the fewer twin again (its longest chunk from an empty cache, the link on top), then
    # its long context against its sibling's short one (few_again)
    thirds = (("chunk", ([(1, 16), (3, 16)], [])), ("blocks", ([], [3])), ("attention", ([(1, 16), (1, 32)], [1])))
    for name, (third_asked, third_bursts) in thirds:
        asked_here, bursts_here = seen[name]
        assert asked_here[: len(two_asked)] == two_asked and bursts_here[:4] == two_bursts
        assert sorted(asked_here[len(two_asked) :]) == third_asked and bursts_here[4:] == third_bursts


def test_a_third_round_outvotes_a_round_whose_long_context_decode_disagrees(tmp_path, monkeypatch):
    """One round's attention (what the long context adds to the fewer twin's decode step, multiplied by the model's
    blocks) far from the other's: a third round times the chain and its decode again, and the median of three keeps
    the two that agree, where two rounds' mean would carry half of the odd one."""
    import ondevice.probing.timing as timing_mod

    added = iter([0.010, 0.030, 0.012])  # seconds the long context adds, round by round
    short_s = 0.001

    def bursts(a, a_ids, b, b_ids, steps):
        if len(a_ids) != len(b_ids):  # long context against short: the attention
            return short_s + next(added), short_s
        return 2 * short_s, short_s  # more blocks against fewer: a level that agrees

    monkeypatch.setattr(timing_mod, "_decode_bursts", bursts)
    fewer: list = []  # the fewer twin's timing (the extrapolation of these made-up figures is not the point)
    monkeypatch.setattr(twins_mod, "extrapolate_layers", lambda *a: fewer.append(a[0]) or a[0])
    header, spec = _tiny_shape(tmp_path, "llama-3.1-8b", 5)
    plan = replace(PLAN, batch=(), rounds=3, min_rounds=2)
    said: list[str] = []
    args = {"n_ctx": 256, "n_threads": 1}
    time_header(header, spec, plan=plan, work_dir=tmp_path / "w", engine_args=args, blocks=(1, 3), progress=said.append)
    assert any("round 3" in line for line in said)
    decode = dict(fewer[0].decode)
    short_ctx = plan.short_prompt + plan.decode_steps // 2
    long_ctx = max(decode)  # after the chain: 16 + 16 tokens, then half the decode steps
    assert long_ctx == 32 + plan.decode_steps // 2
    assert decode[long_ctx] - decode[short_ctx] == pytest.approx(0.012, abs=0.001)  # not 0.020, the first two's mean


def test_the_attention_is_the_median_of_as_many_pairs_of_bursts_as_the_budget_fits(tmp_path, monkeypatch):
    """A small twin's attention (its long-context step minus its short one) is the median over several pairs of
    bursts, so one pair caught at an odd moment moves neither the round nor, multiplied by the blocks, the model."""
    import ondevice.probing.timing as timing_mod

    monkeypatch.setattr(timing_mod, "_ATTENTION_BUDGET_S", 1e6)  # room for the most pairs, whatever a step takes
    added = iter([0.010, 0.011, 0.002, 0.012, 0.030])  # seconds the long context adds, pair by pair
    short_s, pairs = 0.001, []

    def bursts(a, a_ids, b, b_ids, steps):
        if len(a_ids) != len(b_ids):  # long context against short: the attention
            pairs.append(steps)
            return short_s + next(added), short_s
        return 2 * short_s, short_s

    monkeypatch.setattr(timing_mod, "_decode_bursts", bursts)
    fewer: list = []
    monkeypatch.setattr(twins_mod, "extrapolate_layers", lambda *a: fewer.append(a[0]) or a[0])
    header, spec = _tiny_shape(tmp_path, "llama-3.1-8b", 5)
    plan = replace(PLAN, batch=())
    time_header(
        header, spec, plan=plan, work_dir=tmp_path / "w", engine_args={"n_ctx": 256, "n_threads": 1}, blocks=(1, 3)
    )
    assert pairs == [plan.decode_steps] * timing_mod._ATTENTION_BURSTS == [4] * 5
    decode = dict(fewer[0].decode)
    short_ctx, long_ctx = plan.short_prompt + plan.decode_steps // 2, max(decode)
    assert decode[long_ctx] - decode[short_ctx] == pytest.approx(0.011, abs=0.0005)  # not the mean, 0.013


@pytest.mark.parametrize(
    ("budget_s", "pair_s", "pairs"),
    [
        (1.0, 0.8, 1),  # an 8B's one-block twin: 16 steps of ~25 ms on each engine
        (1.0, 0.32, 3),  # a 3B's: ~10 ms
        (1.0, 0.19, 5),  # a 360M F32's: ~6 ms, the most
        (1.0, 0.001, 5),
        (0.0, 0.19, 1),  # no budget: one pair, as the whole-model timing has
        (1.0, 0.0, 1),  # no step figure: one pair
    ],
)
def test_the_pairs_of_attention_bursts_fit_the_budget(budget_s, pair_s, pairs):
    from ondevice.probing.timing import _attention_pairs

    assert _attention_pairs(budget_s, pair_s) == pairs


@pytest.mark.parametrize("config_name", ["llama-3.1-8b", "qwen3-30b-a3b"])
def test_only_the_fewer_twin_is_warmed_up_with_its_longest_chunk_unless_experts_are_routed(
    tmp_path, monkeypatch, config_name
):
    """A pass of the longest chunk touches an engine's compute buffers before the first round times it; on a dense
    model's more-block twin that pass takes long enough for the touch to be lost in it, and warming it so costs as
    much as the point: it is warmed with a few tokens, like the decode-only engine. A mixture of experts' is warmed
    with the chunk all the same: a few tokens route through a few experts, the chunk through most."""
    from ondevice.engine.engine import Engine

    first: dict[int, int] = {}  # id(engine) -> tokens of its first prompt after load's own warm-up request
    blocks: dict[int, int] = {}
    loading: set[int] = set()
    real, real_warm_up = Engine.generate, Engine._warm_up

    def generate(self, prompt, **kwargs):
        if id(self) not in loading:
            first.setdefault(id(self), len(prompt))
            blocks[id(self)] = self.info.spec.n_layer
        return real(self, prompt, **kwargs)

    def warm_up(self):
        loading.add(id(self))
        try:
            real_warm_up(self)
        finally:
            loading.discard(id(self))

    monkeypatch.setattr(Engine, "generate", generate)
    monkeypatch.setattr(Engine, "_warm_up", warm_up)
    header, spec = _tiny_shape(tmp_path, config_name, 6)
    plan = replace(PLAN, chunks=(1, 32), batch=(), rounds=2)
    args = {"n_ctx": 256, "n_threads": 1}
    time_header(header, spec, plan=plan, work_dir=tmp_path / "w", engine_args=args, blocks=(1, 3))
    warmed = sorted((blocks[e], n) for e, n in first.items())
    more = 32 if spec.n_expert else 8
    assert warmed == [(1, 8), (1, 32), (3, more)]  # the fewer twin with its longest chunk, its sibling with 8


def test_the_more_block_twin_is_only_prefilled_its_decode_timed_in_bursts_against_the_fewer(tmp_path, monkeypatch):
    import ondevice.probing.timing as timing_mod

    asked: list[tuple[int, int]] = []  # (blocks of the engine, tokens asked) of every prompt the round times
    prompts: list[tuple[int, int, bool]] = []  # (blocks, prompt tokens, prefix reused) of the same
    real = timing_mod.first_token_s
    monkeypatch.setattr(
        timing_mod,
        "first_token_s",
        lambda eng, ids, reuse, max_tokens=1: (
            asked.append((eng.info.spec.n_layer, max_tokens))
            or prompts.append((eng.info.spec.n_layer, len(ids), reuse))
            or real(eng, ids, reuse, max_tokens)
        ),
    )
    bursts: list[tuple[int, int]] = []
    real_bursts = timing_mod._decode_bursts
    monkeypatch.setattr(
        timing_mod,
        "_decode_bursts",
        lambda a, a_ids, b, b_ids, steps: (
            bursts.append((a.info.spec.n_layer, b.info.spec.n_layer)) or real_bursts(a, a_ids, b, b_ids, steps)
        ),
    )
    header, spec = _tiny_shape(tmp_path, "llama-3.1-8b", 5)  # a shape no other test times
    args = {"n_ctx": 256, "n_threads": 1}
    timing, _info = time_header(header, spec, plan=PLAN, work_dir=tmp_path / "w", engine_args=args, blocks=(1, 3))
    many = [tokens for blocks, tokens in asked if blocks == 3]
    assert many == [1, 1]  # each chunk from an empty cache, its first token only: no short-context decode point
    # the fewer decodes after its short prompt alone, not after its chunks or links: extrapolation puts its decode
    # at every context on the line through that point and the bursts after the chain
    assert [tokens for blocks, tokens in asked if blocks == 1 and tokens > 1] == [1 + PLAN.decode_steps]
    assert bursts == [(1, 1), (3, 1)]  # long vs short context on the fewer, then more vs fewer blocks
    assert len(timing.decode) == 2 and all(s > 0 for _c, s in timing.decode)
    # the chain's link (16 tokens on 16 cached) right after a prefill of the same 16 from an empty cache: what it
    # adds, multiplied by the blocks, is measured against a moment next to it; that prefill is the longest chunk's
    # point, which the fewer twin times second, so none is made again
    link = prompts.index((1, 32, True))
    assert prompts[link - 2 : link] == [(3, 16, False), (1, 16, False)] and prompts.count((1, 16, False)) == 1


def test_rounds_agree_when_the_multiplied_differences_lie_within_ten_percent():
    from ondevice.probing.pairs import unsettled

    close = {("blocks", 24): [0.0070, 0.0076], ("prefill", 0, 512): [1.70, 1.62], ("prefill", 0, 16): [0.10, 0.105]}
    close |= {("attention", 1536): [0.0021, 0.0025]}  # within a quarter: a smaller difference, noisier
    chunks = (16, 512)
    assert unsettled(close, chunks) == set()
    assert unsettled(close | {("attention", 1536): [0.0021, 0.0028]}, chunks) == {("attention",)}
    assert unsettled(close | {("attention", 1536): [0.0021, -0.0001]}, chunks) == {("attention",)}
    assert unsettled(close | {("prefill", 0, 512): [1.88, 1.62]}, chunks) == {("chunk", 512)}
    # a shorter chunk counts as much: one round's slow moment would reach the TTFT of prompts that long
    assert unsettled(close | {("prefill", 0, 16): [0.10, 0.16]}, chunks) == {("chunk", 16)}
    assert unsettled(close | {("blocks", 24): [-0.001, 0.001]}, chunks) == {("blocks",)}  # negative: no agreement
    none_yet = {("blocks",), ("attention",), ("chunk", 512)}
    assert unsettled({("prefill", 0, 16): [0.1, 0.1]}, chunks) == none_yet  # none measured yet


def test_the_twins_of_a_model_on_disk_hold_its_own_bytes(tmp_path, monkeypatch):
    """timing_for passes the model's file: each twin block then holds the bytes of the model block it stands for
    (quant.twin.matching_blocks picks them), and the shared file the model's embedding and head."""
    import numpy as np
    import ondevice.quant.twin as twin_mod
    from gguf import GGUFReader  # reads one file of a split model, as it is

    config = tiny_config("llama-3.1-8b") | {"num_hidden_layers": 6}
    header = quantized_header(header_from_hf_config(config), "Q8_0")
    model = write_twin(header, tmp_path / "model.gguf", seed=11)  # a model with data of its own
    theirs = {t.name: t for t in GGUFReader(model).tensors}

    def bytes_of(path, t):
        return np.fromfile(path, dtype=np.uint8, count=int(t.n_bytes), offset=int(t.data_offset))

    checked: list[tuple[str, bool]] = []
    real_write = twin_mod.write_twin

    def write(h, path, **kwargs):
        out = real_write(h, path, **kwargs)
        for t in GGUFReader(out).tensors:  # every tensor of each file written holds its model tensor's bytes
            origin = kwargs["model"].origin(t.name)
            checked.append((origin, np.array_equal(bytes_of(out, t), bytes_of(model, theirs[origin]))))
        return out

    monkeypatch.setattr(twin_mod, "write_twin", write)
    args = {"n_ctx": 256, "n_threads": 1}
    time_header(
        header,
        inspect(model),
        plan=replace(PLAN, batch=()),
        work_dir=tmp_path / "w",
        engine_args=args,
        blocks=(1, 3),
        model_path=model,
    )
    assert checked and all(same for _name, same in checked)
    blocks = {name.split(".")[1] for name, _same in checked if name.startswith("blk.")}
    assert blocks == {str(b) for b in twin_mod.matching_blocks(header, 1) + twin_mod.matching_blocks(header, 3)}
    assert "token_embd.weight" in dict(checked)


def test_twin_files_a_killed_timing_left_are_removed_and_never_collide(tmp_path, monkeypatch):
    """A timing killed before its clean-up (SIGKILL, SIGTERM) leaves its twin files behind: the next timing of any
    shape removes those of processes that are gone (and, by age, those of versions whose names had no pid), keeps
    a live process's, and writes its own under names of its own, so a leftover never stands in its way."""
    import os
    import subprocess
    import sys

    from ondevice.quant.twin import shape_key

    header, spec = _tiny_shape(tmp_path, "llama-3.1-8b", 4)
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(paths, "SHARED_MEMORY_DIR", shm)
    work = paths.scratch_dir(tmp_path / "w", 1)
    work.mkdir(parents=True, exist_ok=True)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid, live_pid = int(gone.stdout), os.getppid()
    key = shape_key(header)
    dead = [work / f"twin-{key}-p{dead_pid}-{name}" for name in ("outside.gguf", "1-00002-of-00002.gguf")]
    older = work / f"twin-{key}-1-00002-of-00002.gguf"  # the name a version without pids wrote and would write
    live = work / f"twin-{key}-p{live_pid}-1-00001-of-00002.gguf"
    for path in (*dead, older, live):
        path.write_bytes(b"left behind")
    long_ago = os.stat(older).st_mtime - 2 * paths.OLD_STYLE_STALE_AFTER_S  # the killed run was a while back
    for path in (*dead, older, live):
        os.utime(path, (long_ago, long_ago))
    args = {"n_ctx": 256, "n_threads": 1}
    plan = replace(PLAN, batch=())
    timing, _info = time_header(header, spec, plan=plan, work_dir=tmp_path / "w", engine_args=args, blocks=(1, 3))
    assert timing.decode
    assert sorted(p.name for p in work.iterdir()) == [live.name]  # its own removed after, the dead ones before
