"""The crash guard: a native crash in a child becomes a verdict, the verdict is cached per CPU and
llama.cpp build, and loads follow it; forced settings and bad cache files end in a safe fallback."""

from __future__ import annotations

import ctypes
import json
import logging
import sys
from pathlib import Path

import pytest

from ondevice.llama import guard
from ondevice.llama.buffers import REPACK, TensorOverrides, cpu_features, repack_tensors
from ondevice.llama.guard import CheckOutcome, cpu_buffer_verdict, run_check

DATA = Path(__file__).parent / "data" / "hw"
OK = CheckOutcome(True, False, "ok")
CRASH = CheckOutcome(False, True, "crashed (SIGILL)")
HANG = CheckOutcome(False, False, "timed out after 30 s", hung=True)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch, tmp_path):
    """No verdict from the real cache or from an earlier test of this process."""
    monkeypatch.setattr(guard, "_memo", {})
    monkeypatch.delenv(guard.ENV_VAR, raising=False)
    monkeypatch.setattr(guard.paths, "cache_dir", lambda: tmp_path)


class Script:
    """A self-test that answers each mode as told, and records what was asked."""

    def __init__(self, **outcomes: CheckOutcome):
        self.outcomes, self.asked = outcomes, []

    def __call__(self, mode: str, work: Path) -> CheckOutcome:
        self.asked.append(mode)
        return self.outcomes[mode]


BOTH = ["AMX", REPACK]


# ---- the child: a real native crash ------------------------------------------------------
def test_a_child_that_dies_by_a_signal_is_a_crash():
    crash = [sys.executable, "-c", "import ctypes; ctypes.string_at(0)"]  # null dereference: SIGSEGV
    outcome = run_check("all", Path("."), argv=crash)
    assert outcome.crashed and not outcome.ok
    assert "SIGSEGV" in outcome.detail


def test_a_crash_names_the_frame_it_died_in():
    """faulthandler's traceback (the real child runs with -X faulthandler) says where: a device
    session can then tell a crash in quantizing from one in loading or decoding."""
    crash = [sys.executable, "-X", "faulthandler", "-c", "import ctypes\ndef load():\n    ctypes.string_at(0)\nload()"]
    outcome = run_check("all", Path("."), argv=crash)
    assert outcome.crashed and outcome.detail.startswith("crashed (SIGSEGV) in string_at (")  # innermost: ctypes' own


def test_the_crash_site_is_the_innermost_frame_of_a_recorded_dump():
    dump = (
        "Fatal Python error: Segmentation fault\n\n"
        "Current thread 0x00007f3a (most recent call first):\n"
        '  File "/tmp/site/ondevice/llama/model.py", line 118 in load_model\n'
        '  File "/tmp/site/ondevice/llama/selftest.py", line 42 in run_model\n'
        '  File "<frozen runpy>", line 88 in _run_code\n'
    )
    assert guard._crash_site(dump) == "load_model (model.py:118)"
    assert guard._crash_site("Segmentation fault (core dumped)\n") is None


def test_a_child_that_fails_without_a_signal_is_not_a_crash():
    outcome = run_check("all", Path("."), argv=[sys.executable, "-c", "raise SystemExit('no model')"])
    assert not outcome.ok and not outcome.crashed
    assert "no model" in outcome.detail


def test_a_child_that_hangs_is_timed_out():
    outcome = run_check("all", Path("."), argv=[sys.executable, "-c", "import time; time.sleep(30)"], timeout_s=0.5)
    assert not outcome.ok and not outcome.crashed and "timed out" in outcome.detail


def test_the_real_self_test_runs_with_plain_buffers(tmp_path):
    """The self-test itself works here (models built, loaded, decoded) with no extra buffer types."""
    assert run_check("none", tmp_path) == OK
    assert sorted(p.name for p in tmp_path.glob("*.gguf")) == [
        "selftest-f16.gguf",
        "selftest-q4_0.gguf",
        "selftest-q4_k_m.gguf",
        "selftest-q8_0.gguf",
    ]


def test_the_real_self_test_with_every_buffer_type_either_runs_or_crashes(tmp_path):
    """On an AMX machine whose hypervisor faults, "all" crashes (the case the guard exists for);
    elsewhere it runs. It must never fail in another way or hang."""
    outcome = run_check("all", tmp_path)
    assert outcome.ok or outcome.crashed, outcome.detail


# ---- the verdict -------------------------------------------------------------------------
def test_all_runs_no_note_and_stored(tmp_path):
    v = cpu_buffer_verdict(check=Script(all=OK), available=BOTH)
    assert (v.mode, v.source, v.note) == ("all", "self-test", None)
    assert json.loads(guard.verdict_path().read_text())["mode"] == "all"


def test_amx_crash_keeps_repack_and_says_so_once(caplog):
    script = Script(all=CRASH, repack=OK)
    with caplog.at_level(logging.WARNING, logger="ondevice.llama"):
        v = cpu_buffer_verdict(check=script, available=BOTH)
        again = cpu_buffer_verdict(check=script, available=BOTH)
    assert v.mode == "repack" and "AMX turned off" in v.note and "CPU_REPACK kept" in v.note
    assert again is v and script.asked == ["all", "repack"]
    assert [r.getMessage() for r in caplog.records] == [v.note]  # one line, once


def test_repack_crash_too_falls_back_to_plain_buffers():
    v = cpu_buffer_verdict(check=Script(all=CRASH, repack=CRASH, none=OK), available=BOTH)
    assert v.mode == "none" and "AMX, CPU_REPACK turned off" in v.note


def test_without_repack_in_the_build_it_is_not_tried():
    script = Script(all=CRASH, none=OK)
    assert cpu_buffer_verdict(check=script, available=["AMX"]).mode == "none"
    assert script.asked == ["all", "none"]


def test_every_mode_crashing_makes_loads_refuse(tmp_path):
    from ondevice.core.errors import ModelLoadError
    from ondevice.llama.model import load_model

    v = cpu_buffer_verdict(check=Script(all=CRASH, repack=CRASH, none=CRASH), available=BOTH)
    assert v.mode == "unusable" and "does not run here" in v.note
    with pytest.raises(ModelLoadError, match="does not run here"):
        load_model(tmp_path / "never-opened.gguf", n_gpu_layers=0, verdict=v)


def test_a_hang_loads_with_plain_buffers_and_is_stored_so_no_command_waits_again():
    v = cpu_buffer_verdict(check=Script(all=HANG), available=BOTH)
    assert v.mode == "none" and v.source == "self-test" and "hung" in v.note
    assert json.loads(guard.verdict_path().read_text())["mode"] == "none"


def test_a_stored_verdict_is_used_without_checking(monkeypatch):
    cpu_buffer_verdict(check=Script(all=CRASH, repack=OK), available=BOTH)
    monkeypatch.setattr(guard, "_memo", {})  # a new process
    v = cpu_buffer_verdict(check=Script(), available=BOTH)  # would KeyError if it checked
    assert (v.mode, v.source, v.note) == ("repack", "cache", None)


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        '{"schema": 1, "mode": "turbo", "reason": "x"}',
        '{"schema": 999, "mode": "all", "reason": "x"}',
        "[]",
        "",
    ],
)
def test_a_corrupt_or_foreign_verdict_file_means_checking_again(content):
    path = guard.verdict_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    script = Script(all=OK)
    assert cpu_buffer_verdict(check=script, available=BOTH).source == "self-test"
    assert script.asked == ["all"]
    assert json.loads(path.read_text())["mode"] == "all"  # rewritten whole
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_a_new_build_or_cpu_has_its_own_verdict(monkeypatch):
    first = guard.verdict_path()
    monkeypatch.setattr(guard, "build_info", lambda: ("0.3.99", "CPU : AVX2 = 1 | "))
    assert guard.verdict_path() != first
    monkeypatch.setattr(guard, "_cpu_fingerprint", lambda: "another cpu")
    assert len({first, guard.verdict_path()}) == 2


def test_forget_verdict_checks_again():
    script = Script(all=OK)
    cpu_buffer_verdict(check=script, available=BOTH)
    guard.forget_verdict()
    cpu_buffer_verdict(check=script, available=BOTH)
    assert script.asked == ["all", "all"]


# ---- the override ------------------------------------------------------------------------
@pytest.mark.parametrize("setting, mode", [("all", "all"), ("REPACK", "repack"), ("none", "none")])
def test_the_environment_forces_a_mode_without_checking(monkeypatch, setting, mode):
    monkeypatch.setenv(guard.ENV_VAR, setting)
    v = cpu_buffer_verdict(check=Script(), available=BOTH)
    assert (v.mode, v.source, v.note) == (mode, "forced", None)


def test_forcing_repack_on_a_build_without_it_falls_back_with_one_line(monkeypatch):
    monkeypatch.setenv(guard.ENV_VAR, "repack")
    v = cpu_buffer_verdict(check=Script(), available=["AMX"])
    assert v.mode == "none" and "no CPU_REPACK" in v.note


def test_a_bogus_setting_is_named_and_the_verdict_used(monkeypatch):
    monkeypatch.setenv(guard.ENV_VAR, "fast")
    v = cpu_buffer_verdict(check=Script(all=CRASH, repack=OK), available=BOTH)
    assert v.mode == "repack" and "'fast' is not one of" in v.note


# ---- which weights CPU_REPACK takes ------------------------------------------------------
def test_features_from_recorded_system_info():
    amx = cpu_features((DATA / "sysinfo_xeon_amx.txt").read_text())
    assert {"AVX2", "AVX512", "AMX_INT8", "REPACK"} <= amx
    assert "AMX_INT8" not in cpu_features((DATA / "sysinfo_cpu.txt").read_text())
    assert "NEON" in cpu_features((DATA / "sysinfo_metal.txt").read_text())


def test_repack_rule_follows_type_isa_rows_and_op():
    tensors = [
        ("blk.0.attn_q.weight", "Q4_K", (640, 1024)),
        ("blk.0.attn_v.weight", "Q6_K", (640, 256)),  # no x86 repack for Q6_K
        ("blk.0.ffn_down.weight", "Q4_0", (2048, 644)),  # rows not a multiple of 8
        ("blk.1.ffn_gate_exps.weight", "Q4_0", (640, 2048, 8)),  # MoE experts: MUL_MAT_ID
        ("token_embd.weight", "Q4_0", (640, 262144)),  # a row gather, never repacked
        ("output.weight", "Q4_0", (640, 262144)),
        ("blk.0.attn_norm.weight", "F32", (640,)),
        ("blk.2.ffn_up.weight", "Q2_K", (640, 2048)),  # needs AVX-512
    ]
    avx2 = repack_tensors(tensors, {"AVX2"})
    assert avx2 == ["blk.0.attn_q.weight", "blk.1.ffn_gate_exps.weight", "output.weight"]
    assert repack_tensors(tensors, {"AVX2", "AVX512"}) == avx2 + ["blk.2.ffn_up.weight"]
    assert repack_tensors(tensors, {"NEON"}) == []  # the rule is x86's: elsewhere nothing is placed by name


def test_overrides_group_layers_into_one_pattern_per_kind():
    import re

    names = ["blk.0.attn_q.weight", "blk.1.attn_q.weight", "blk.10.attn_q.weight", "output.weight"]
    o = TensorOverrides(names, buft=1234)
    assert [p.decode() for p in o.patterns] == [r"^blk\.(0|1|10)\.attn_q\.weight$", r"^output\.weight$"]
    patterns = [re.compile(p.decode()) for p in o.patterns]
    assert not any(p.search("blk.11.attn_q.weight") or p.search("blk.1.attn_q.weight_x") for p in patterns)
    assert o._array[2].pattern is None and o._array[0].buft == 1234 and o.pointer


# ---- loads follow the verdict ------------------------------------------------------------
@pytest.fixture(scope="module")
def q4_0_model(synth_dir) -> Path:
    from ondevice.quant.quantize import quantize
    from ondevice.quant.synth import SynthConfig, build_synthetic_model

    src = build_synthetic_model(SynthConfig(d_model=256, d_ff=512, n_vocab=512, seed=3), synth_dir / "guard-f16.gguf")
    return quantize(src, synth_dir / "guard-q4_0.gguf", "Q4_0", threads=1, pure=True)


@pytest.mark.parametrize("mode", ["repack", "none"])
def test_fallback_loads_generate_the_same_text(q4_0_model, monkeypatch, mode):
    """A model loaded with CPU_REPACK only or plain buffers generates what a plain load does."""
    from ondevice.engine import load

    def greedy(setting: str) -> tuple[str, str, str]:
        monkeypatch.setenv(guard.ENV_VAR, setting)
        with load(q4_0_model, n_ctx=256, n_threads=1) as eng:
            g = eng.generate("the tower", max_tokens=8, temperature=0, ignore_eos=True)
            return g.text, eng.info.cpu_buffers, eng.info.cpu_buffers_reason

    text, used, reason = greedy(mode)
    assert used == mode and reason.startswith("forced")
    assert text == greedy("none")[0]


def test_repack_mode_places_the_matrices_by_name(q4_0_model, monkeypatch):
    import llama_cpp

    from ondevice.llama.model import load_model

    monkeypatch.setenv(guard.ENV_VAR, "repack")
    model, placement = load_model(q4_0_model, n_gpu_layers=0)
    llama_cpp.llama_model_free(model)
    features = cpu_features(llama_cpp.llama_print_system_info().decode())
    expected = 2 * 7 + 1 if "AVX2" in features else 0  # 2 blocks x (q, k, v, o, gate, up, down) + output
    assert placement.cpu_buffers == "repack" and placement.repacked_tensors == expected


def test_cpu_only_hands_llama_cpp_an_empty_device_list(tiny_model):
    """cpu_only (the self-test's load) gives llama_model_params.devices a NULL-terminated list with
    no device: llama.cpp then offloads nothing, on a GPU build too. A plain load leaves it NULL
    (llama.cpp's choice of every GPU)."""
    import llama_cpp

    from ondevice.llama.model import load_model

    seen = []

    class Lib:
        def __getattr__(self, name):
            return getattr(llama_cpp, name)

        def llama_model_load_from_file(self, path, mparams):
            listed = ctypes.c_void_p.from_address(mparams.devices).value if mparams.devices else "no list"
            seen.append(listed)
            return llama_cpp.llama_model_load_from_file(path, mparams)

    for cpu_only in (True, False):
        model, _ = load_model(tiny_model, n_gpu_layers=-1, lib=Lib(), cpu_only=cpu_only)
        assert model
        llama_cpp.llama_model_free(model)
    assert seen == [None, "no list"]  # cpu_only: a list whose first entry is the terminator


# ---- one open path -----------------------------------------------------------------------
# Both in the llama layer: the one open path, and the launcher of llama-cpp-python's server
# (bench --url), which wraps the server's own load to apply the same placement (place_weights).
_VERDICT_APPLIERS = ("ondevice/llama/model.py", "ondevice/llama/server.py")


def test_no_other_code_builds_model_params():
    """llama_model_params are built in ondevice/llama/model.py only (tests and benchmarks included)."""
    root = Path(__file__).resolve().parent.parent
    needles = ("llama_model_default_params", "llama_model_load_from_file", "llama_cpp.Llama(")
    offenders = [
        f"{path.relative_to(root)}: {needle}"
        for path in root.rglob("*.py")
        if not {".venv", "build", "dist"} & set(path.relative_to(root).parts)  # copies made by installs and wheels
        and path != Path(__file__).resolve()
        and path.relative_to(root).as_posix() not in _VERDICT_APPLIERS
        for needle in needles
        if needle in path.read_text(errors="replace")
    ]
    assert offenders == []


def test_ctrl_c_inside_llama_cpps_log_callback_reaches_the_main_thread():
    """A KeyboardInterrupt raised in the ctypes log callback (a Ctrl-C landing while llama.cpp logs) is not
    dropped by ctypes: it is raised again once the native call returns."""
    from ondevice.llama.log import _log_state, log_listener, raise_pending_interrupt, route_llama_log

    def interrupted(_text: str) -> None:
        raise KeyboardInterrupt

    route_llama_log()
    with log_listener(interrupted), pytest.raises(KeyboardInterrupt):
        _log_state["callback"](2, b"loading\n", None)  # through the C thunk, as llama.cpp calls it
        raise_pending_interrupt()  # what the loader calls after each native call that logs
    raise_pending_interrupt()  # raised once, not again
