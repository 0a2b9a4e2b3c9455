"""Hostile input, the table: seven groups of generated cases run against the CLI as a hostile user would.

Each case is a child process (`python -m ondevice.cli.main ...`, or a short script for what the CLI does
not reach) with the run's own cache, config and data folders. It is clean when it exits with a code the
case allows (0; 1 where a failed bench is designed to; 2 with exactly one "ondevice: error:" line; 130/143
after Ctrl-C/SIGTERM with what finished said), prints no traceback, is not killed by a signal, ends
within its time bound, and its own check finds nothing lost or silently wrong (a user's file unchanged,
a damaged store refused or re-measured, ...). Prints the table (tried / clean / traceback / signal / hang /
lost) and each case that was not clean; exit 1 when any case is not clean.

    python -m benchmarks.hostile_table [--groups 1,2,...] [--seeds 20] [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import ROOT

GROUPS = (
    "damaged GGUF files and special paths",
    "CLI arguments and output paths",
    "damaged caches, registry, verdict, chat history",
    "interruption (SIGINT/TERM/KILL mid-work)",
    "concurrency",
    "bench --url against broken servers (loopback)",
    "crash guard",
)
KINDS = ("clean", "traceback", "signal", "hang", "lost")
# the CLI's error line, or argparse's (after its usage line) for an argument it cannot parse
ERROR_LINE = re.compile(r"^ondevice(?: [a-z]+)?: error: ")
RUN_TINY = ["--no-predict", "-n", "2", "-c", "256"]


@dataclass
class Run:
    rc: int | None  # None: killed after its time bound
    stdout: str
    stderr: str
    signalled: bool = False  # the case's signal was sent while it ran


@dataclass
class Case:
    group: int  # index into GROUPS
    name: str
    argv: list[str]  # after the interpreter: ["-m", "ondevice.cli.main", ...] or ["-c", script, ...]
    ok: tuple[int, ...] = (0, 2)  # exit codes that are clean
    check: Callable[[Run], str | None] | None = None  # a finding of "lost or silently wrong", or None
    env: dict[str, str] = field(default_factory=dict)
    send: tuple[float, int] | None = None  # (seconds after start, signal) for the interruption cases
    timeout_s: float = 120.0
    after: Callable[[], None] | None = None  # clean-up once it ran


def cli(*args: str) -> list[str]:
    return ["-m", "ondevice.cli.main", *args]


class Workspace:
    """The run's folders, a tiny model, and the environment every child gets."""

    def __init__(self, root: Path):
        from ondevice.quant.synth import SynthConfig, build_synthetic_model

        self.root = root
        self.tiny = build_synthetic_model(SynthConfig(), root / "tiny-f16.gguf")
        dirs = {name: root / "user" / name for name in ("cache", "config", "data")}
        self.env = {**os.environ, **{f"ONDEVICE_{k.upper()}_DIR": str(v) for k, v in dirs.items()}}
        self.env.pop("ONDEVICE_MODELS", None)
        self.env["GGML_NO_BACKTRACE"] = "1"  # an abort without ggml's gdb backtrace: faster, same outcome
        self.env["PYTHONPATH"] = str(ROOT)  # the scripts use the tests' fakes
        self._n = 0

    def folder(self, label: str) -> Path:
        self._n += 1
        path = self.root / f"{self._n:04d}-{label}"
        path.mkdir(parents=True)
        return path

    def own_user_dirs(self, folder: Path) -> dict[str, str]:
        """Cache, config and data folders of one case's own (a store it damages is nobody else's)."""
        return {f"ONDEVICE_{k.upper()}_DIR": str(folder / k) for k in ("cache", "config", "data")}


# ---- running and judging -----------------------------------------------------------------------


def execute(case: Case, ws: Workspace) -> Run:
    env = {**ws.env, **case.env}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, *case.argv], stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env, cwd=ws.root
        )
        rc, signalled = _wait(proc, case)
        out.seek(0)
        err.seek(0)
        return Run(rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"), signalled)


def _wait(proc: subprocess.Popen, case: Case) -> tuple[int | None, bool]:
    signalled = False
    if case.send is not None:
        at_s, signum = case.send
        try:
            proc.wait(timeout=at_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signum)
            signalled = True
    try:
        return proc.wait(timeout=case.timeout_s), signalled
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, signalled


def judge(case: Case, run: Run) -> tuple[str, str]:
    """(kind, detail): one of KINDS, and what was seen when it is not clean."""
    last = run.stderr.strip().splitlines()[-1:] or [""]
    if run.rc is None:
        return "hang", f"still running after {case.timeout_s:g} s"
    sent = case.send[1] if case.send is not None and run.signalled else None
    if run.rc < 0 and -run.rc != sent:  # killed by the signal this case sent (SIGKILL): expected, judged by its check
        return "signal", signal.Signals(-run.rc).name
    if "Traceback (most recent call last)" in run.stderr:
        return "traceback", last[0][:160]
    if run.rc not in case.ok:
        return "lost", f"exit {run.rc} (clean: {case.ok}): {last[0][:160]}"
    errors = [ln for ln in run.stderr.splitlines() if ERROR_LINE.match(ln)]
    if run.rc == 2 and len(errors) != 1:
        return "lost", f"exit 2 with {len(errors)} error lines: {last[0][:160]}"
    finding = case.check(run) if case.check else None
    return ("lost", finding) if finding else ("clean", "")


# ---- group 1: damaged GGUF files and special paths ------------------------------------------------


def damaged_files(ws: Workspace, seeds: int) -> list[Case]:
    from tests.gguf_fuzz import damaged_vocabulary, mutants

    folder = ws.folder("gguf")
    cases = []
    for i, (kind, data) in enumerate(mutants(ws.tiny, seeds, seed=37)):
        path = folder / f"m{i}-{kind}.gguf"
        path.write_bytes(data)
        cases += [Case(0, f"info {kind} #{i}", cli("info", str(path))), run_case(0, f"run {kind} #{i}", path)]
    for seed in range(max(1, seeds // 2)):
        path = damaged_vocabulary(ws.tiny, folder, seed)
        cases.append(run_case(0, f"run damaged vocabulary #{seed}", path))
    for kind, path in special_paths(folder, ws.tiny).items():
        cases += [Case(0, f"info {kind}", cli("info", str(path))), run_case(0, f"run {kind}", path)]
    return cases


def run_case(group: int, name: str, path: Path, **kw) -> Case:
    return Case(group, name, cli("run", str(path), "hi", *RUN_TINY), **kw)


def special_paths(folder: Path, tiny: Path) -> dict[str, Path]:
    """Things at a model's path that are not a model file."""
    out = {"a directory": folder / "d.gguf", "a FIFO": folder / "f.gguf", "a link to /dev/zero": folder / "z.gguf"}
    out["a directory"].mkdir()
    os.mkfifo(out["a FIFO"])
    out["a link to /dev/zero"].symlink_to("/dev/zero")
    out["no such file"] = folder / "absent.gguf"
    out["a name too long"] = folder / ("n" * 300 + ".gguf")
    out["a path through a file"] = tiny / "x.gguf"
    out["an empty file"] = folder / "empty.gguf"
    out["an empty file"].write_bytes(b"")
    return out


# ---- group 2: CLI arguments and output paths ------------------------------------------------------


def output_paths(ws: Workspace) -> list[Case]:
    folder = ws.folder("outputs")
    history = folder / "history.sqlite3"
    _history_with_one_conversation(history)
    cases = []
    for label, dst, check in _destinations(folder):
        cases.append(
            Case(
                1,
                f"quantize onto {label}",
                cli("quantize", str(ws.tiny), str(dst), "--type", "Q8_0", "--no-progress"),
                check=check,
            )
        )
        cases.append(
            Case(
                1,
                f"chat --export onto {label}",
                cli("chat", "--export", "1", "--out", str(dst), "--history-db", str(history)),
                check=check,
            )
        )
        cases.append(
            Case(
                1,
                f"bench --json onto {label}",
                cli("bench", str(ws.tiny), "--json", str(dst), "-p", "8", "-n", "2"),
                check=check,
            )
        )
    cases += _immutable_case(ws, folder)
    for flags in (["--timeout", "inf"], ["--timeout", "nan"], ["--timeout", "1e300"], ["--temperature", "nan"]):
        cases.append(Case(1, f"bench {' '.join(flags)}", cli("bench", str(ws.tiny), *flags)))
        cases.append(Case(1, f"bench --url {' '.join(flags)}", cli("bench", "--url", "http://127.0.0.1:9/v1", *flags)))
    for flags in (["--temperature", "nan"], ["-n", "-5"], ["-c", "99999999999"], ["--top-p", "inf"], ["--seed", "x"]):
        cases.append(Case(1, f"run {' '.join(flags)}", cli("run", str(ws.tiny), "hi", "--no-predict", *flags)))
    spec = ["predict", "--params", "1e9", "--quant", "Q4_K_M", "--kv-heads", "8", "--head-dim", "64"]
    for flag, value in (("--layers", "200000000"), ("--ctx-train", "99999999999"), ("--vocab", "1000000000")):
        cases.append(Case(1, f"predict {flag} {value}", cli(*spec, "--layers", "16", flag, value)))
    return cases


def _destinations(folder: Path) -> list[tuple[str, Path, Callable[[Run], str | None] | None]]:
    mine = folder / "notes.md"
    mine.write_text("the user's notes\n")
    unchanged = _unchanged(mine, "the user's notes\n")
    (folder / "outdir").mkdir()
    os.mkfifo(folder / "out.fifo")
    (folder / "link-to-fifo").symlink_to(folder / "out.fifo")
    return [
        ("an existing file, no --force", mine, unchanged),
        ("a directory", folder / "outdir", None),
        ("a FIFO", folder / "out.fifo", None),
        ("a link to a FIFO", folder / "link-to-fifo", None),
        ("/dev/full", Path("/dev/full"), None),
        ("a missing folder", folder / "no" / "such" / "out.md", _absent(folder / "no")),
    ]


def _unchanged(path: Path, text: str) -> Callable[[Run], str | None]:
    def check(run: Run) -> str | None:
        try:
            return None if path.read_text() == text else f"{path} was changed"
        except OSError as exc:
            return f"{path} is gone ({exc})"

    return check


def _absent(path: Path) -> Callable[[Run], str | None]:
    return lambda run: f"{path} was created" if path.exists() else None


def _immutable_case(ws: Workspace, folder: Path) -> list[Case]:
    chattr = shutil.which("chattr")
    frozen = folder / "frozen.gguf"
    frozen.write_text("frozen\n")
    if chattr is None or subprocess.run([chattr, "+i", str(frozen)], capture_output=True).returncode != 0:
        return []
    argv = cli("quantize", str(ws.tiny), str(frozen), "--type", "Q8_0", "--no-progress", "--force")

    def check(run: Run) -> str | None:
        temps = [p.name for p in folder.iterdir() if ".ondevice-tmp" in p.name]
        return f"temp files left: {temps}" if temps else _unchanged(frozen, "frozen\n")(run)

    def after() -> None:
        subprocess.run([chattr, "-i", str(frozen)], capture_output=True)

    return [Case(1, "quantize onto an immutable file (chattr +i)", argv, check=check, after=after)]


def _history_with_one_conversation(db: Path) -> int:
    from ondevice.tui.store import HistoryStore

    store = HistoryStore(db)
    cid = store.create_conversation("tiny.gguf", system="S", settings={"temperature": 0.5})
    store.add_message(cid, "user", "what is behind the blue door?")
    store.add_message(cid, "assistant", "a room", finish_reason="stop", stats={"timings": {"ttft_s": 0.1}})
    store.close()
    return cid


# ---- group 3: damaged caches, registry, chat history ----------------------------------------------

DAMAGED_TOML = {
    "deep": "x = " + "[" * 5000 + "]" * 5000 + "\n",
    "not UTF-8": b"default = '\xff'\n",
    "not TOML": "[[[\n",
    "an unknown key": 'colour = "red"\n',
    "models not a table": "models = 3\n",
    "an entry without a source": '[models.x]\nfile = "x.gguf"\nquant = "F16"\nlicence = "x"\n',
}
HISTORY_DAMAGE = {
    "stats not JSON": ("messages", "stats_json", "'{not json'"),
    "stats nested deep": ("messages", "stats_json", "'" + "[" * 5000 + "'"),
    "stats a blob": ("messages", "stats_json", "X'80FF00'"),
    "stats 1e999": ("messages", "stats_json", "'{\"x\": 1e999}'"),
    "message time text": ("messages", "created_at", "'yesterday'"),
    "message text a blob": ("messages", "content", "X'68698081'"),
    "unknown role": ("messages", "role", "'robot'"),
    "settings not JSON": ("conversations", "settings_json", "'{{{'"),
    "settings a string": ("conversations", "settings_json", "'\"hot\"'"),
    "title escape codes": ("conversations", "title", "X'1B5B324A07'"),
    "updated_at text": ("conversations", "updated_at", "'never'"),
    "updated_at 1e308": ("conversations", "updated_at", "1e308"),
}
PROBE_DAMAGE = {
    "read_gbs -1": ("memory", "read_gbs", -1),
    "read_gbs 0": ("memory", "read_gbs", 0),
    "read_gbs 1e308": ("memory", "read_gbs", 1e308),
    "read_gbs a string": ("memory", "read_gbs", "fast"),
    "read_gbs null": ("memory", "read_gbs", None),
    "f32_gflops 0": ("compute", "f32_gflops", 0),
}


def damaged_stores(ws: Workspace) -> list[Case]:
    return _registry_cases(ws) + _history_cases(ws) + _probe_cache_cases(ws)


def _registry_cases(ws: Workspace) -> list[Case]:
    folder = ws.folder("registry")
    cases = []
    for label, text in DAMAGED_TOML.items():
        path = folder / f"{len(cases)}.toml"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        cases.append(Case(2, f"registry {label}: models", cli("models"), env={"ONDEVICE_MODELS": str(path)}))
    for label, path in special_paths(folder, ws.tiny).items():
        if label in ("a name too long", "a path through a file", "no such file", "an empty file"):  # regular or absent
            continue
        cases.append(Case(2, f"ONDEVICE_MODELS at {label}", cli("models"), ok=(2,), env={"ONDEVICE_MODELS": str(path)}))
    copy = folder / "mine.gguf"
    copy.write_bytes(ws.tiny.read_bytes())
    entry = f'[models.mine]\nfile = "mine.gguf"\nquant = "F16"\nlicence = "x"\nsource = {{ path = "{copy}" }}\n'
    for label, extra in (("sha256", f'sha256 = "{"0" * 64}"\n'), ("size", "size_bytes = 1\n")):
        reg = folder / f"wrong-{label}.toml"
        reg.write_text(entry + extra)
        cases.append(
            Case(
                2,
                f"a path entry with the wrong {label}",
                cli("run", "mine", "hi", *RUN_TINY),
                ok=(2,),
                env={"ONDEVICE_MODELS": str(reg)},
            )
        )
    marker = folder / "imported"
    site = _trap_package(folder, marker)
    trap = folder / "trap.toml"
    trap.write_text('[models.trap]\nfile = "t.gguf"\nquant = "F16"\nlicence = "x"\nsource = { pypi = "trap-pkg" }\n')
    env = {"ONDEVICE_MODELS": str(trap), "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}
    check = _absent(marker)
    cases.append(Case(2, "a pypi source that must not be imported: models", cli("models"), env=env, check=check))
    cases.append(Case(2, "a pypi source that must not be imported: info", cli("info", "trap"), env=env, check=check))
    return cases


def _trap_package(folder: Path, marker: Path) -> Path:
    site = folder / "site"
    (site / "trap_pkg").mkdir(parents=True)
    (site / "trap_pkg" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    info = site / "trap_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trap-pkg\nVersion: 1.0\n")
    (info / "RECORD").write_text("trap_pkg/__init__.py,,\n")
    return site


def _history_cases(ws: Workspace) -> list[Case]:
    import sqlite3

    cases = []
    for label, (table, column, value) in HISTORY_DAMAGE.items():
        folder = ws.folder("history")
        db = folder / "h.sqlite3"
        cid = _history_with_one_conversation(db)
        con = sqlite3.connect(db)
        con.execute("PRAGMA ignore_check_constraints=ON")
        con.execute(f"UPDATE {table} SET {column} = {value} WHERE id = (SELECT MAX(id) FROM {table})")
        con.commit()
        con.close()
        out = folder / "out.md"
        kept = _contains(out, "what is behind the blue door?")
        cases.append(Case(2, f"history {label}: chat --list", cli("chat", "--list", "--history-db", str(db)), ok=(0,)))
        argv = cli("chat", "--export", str(cid), "--out", str(out), "--history-db", str(db))
        cases.append(Case(2, f"history {label}: chat --export", argv, ok=(0,), check=kept))
    not_db = ws.folder("history") / "h.sqlite3"
    not_db.write_bytes(b"not a database" * 100)
    cases.append(
        Case(2, "history not a database: chat --list", cli("chat", "--list", "--history-db", str(not_db)), ok=(2,))
    )
    return cases


def _contains(path: Path, text: str) -> Callable[[Run], str | None]:
    def check(run: Run) -> str | None:
        try:
            return None if text in path.read_text() else f"{path} lost the undamaged message"
        except OSError as exc:
            return f"{path}: {exc}"

    return check


PROBE_SCRIPT = """
import json, sys
from pathlib import Path
from tests.probe_fakes import fake_result
from ondevice.core.errors import OndeviceError
from ondevice.probing import cache
root, section, field, value = Path(sys.argv[1]), sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
path = cache.save(fake_result(build="A"), root=root)
doc = json.loads(path.read_text())
doc[section][field] = value
path.write_text(json.dumps(doc))
try:
    got = cache.load_cached("CPU", build="A", root=root)
except OndeviceError as exc:
    print(f"ondevice: error: {exc}", file=sys.stderr)
    sys.exit(2)
print(got)
"""


def _probe_cache_cases(ws: Workspace) -> list[Case]:
    import json

    cases = []
    for label, (section, field_name, value) in PROBE_DAMAGE.items():
        root = ws.folder("probe")
        argv = ["-c", PROBE_SCRIPT, str(root), section, field_name, json.dumps(value)]
        # used silently (exit 0) would be wrong: a damaged figure must be refused
        cases.append(Case(2, f"probe cache {label}", argv, ok=(2,), env={"PYTHONPATH": str(ROOT)}))
    return cases


# ---- group 4: interruption ------------------------------------------------------------------------


def interruptions(ws: Workspace) -> list[Case]:
    from ondevice.quant.synth import SynthConfig, build_synthetic_model

    # a long context, so that a generation runs for seconds and the signals land at every stage of it
    model = build_synthetic_model(SynthConfig(n_ctx_train=8192), ws.folder("long") / "long.gguf")
    long_run = cli("run", str(model), "Once upon a time", "--no-predict", "-n", "8000", "--ignore-eos", "-c", "8192")
    cases = []
    for at_s in (0.2, 0.5, 1.0, 2.0, 4.0):
        for signum, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
            name = f"run, {signum.name} at {at_s:g} s"
            cases.append(Case(3, name, long_run, ok=(0, code), check=_said_interrupted, send=(at_s, signum)))
    folder = ws.folder("killed-quantize")
    dst = folder / "q.gguf"
    quantize = cli("quantize", str(ws.tiny), str(dst), "--type", "Q8_0", "--no-progress")
    for at_s in (0.3, 0.8):
        kill = (at_s, signal.SIGKILL)
        cases.append(
            Case(3, f"quantize, SIGKILL at {at_s:g} s", quantize, ok=(0, -9), send=kill, check=_no_half_file(dst))
        )
    return cases


def _said_interrupted(run: Run) -> str | None:
    if run.signalled and run.rc == 0:
        return "exit 0 after the signal: the interruption was swallowed"
    if run.rc in (130, 143) and "interrupted" not in run.stderr and "terminated" not in run.stderr:
        return "stopped without saying so"
    return None


def _no_half_file(dst: Path) -> Callable[[Run], str | None]:
    def check(run: Run) -> str | None:
        if dst.exists() and dst.stat().st_size < 1024:
            return f"{dst} is half-written"
        return None

    return check


# ---- group 5: concurrency -------------------------------------------------------------------------

RACE_SCRIPT = """
import sys, threading
from ondevice.core.errors import OndeviceError
from ondevice.engine import load
engine = load(sys.argv[1], n_ctx=256, n_threads=1)
text = "the quick brown fox " * 4000
ids = engine.tokenize(text)
def work():
    for _ in range(50):
        try:
            engine.tokenize(text) if sys.argv[2] == "tokenize" else engine.detokenize(ids)
        except OndeviceError:
            return
threads = [threading.Thread(target=work) for _ in range(4)]
for t in threads:
    t.start()
engine.close()
for t in threads:
    t.join()
"""
WRITERS_SCRIPT = """
import sys, threading
from ondevice.tui.store import HistoryStore
db = sys.argv[1]
def write(k):
    store = HistoryStore(db)
    cid = store.create_conversation(f"writer-{k}")
    for i in range(25):
        store.add_message(cid, "user", f"{k}-{i}")
    store.close()
threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


def concurrency(ws: Workspace) -> list[Case]:
    cases = []
    for call in ("tokenize", "detokenize"):
        for i in range(3):
            cases.append(
                Case(4, f"close() while 4 threads {call} #{i}", ["-c", RACE_SCRIPT, str(ws.tiny), call], ok=(0,))
            )
    for i in range(2):
        db = ws.folder("writers") / "h.sqlite3"
        cases.append(
            Case(4, f"4 writers on one history #{i}", ["-c", WRITERS_SCRIPT, str(db)], ok=(0,), check=_all_rows(db))
        )
    return cases


def _all_rows(db: Path) -> Callable[[Run], str | None]:
    def check(run: Run) -> str | None:
        import sqlite3

        con = sqlite3.connect(db)
        n = con.execute("SELECT COUNT(*) FROM messages").fetchone()[0]
        con.close()
        return None if n == 100 else f"{n} of 100 messages kept"

    return check


# ---- group 6: bench --url against broken servers --------------------------------------------------


def broken_servers(ws: Workspace, servers: list) -> list[Case]:
    from tests.serve_fakes import BROKEN, broken_server

    cases = []
    for label, behave in BROKEN.items():
        listener, stop = broken_server(behave)
        servers.append((listener, stop))
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        out = ws.folder("serve") / "out.json"
        argv = cli(
            "bench",
            "--url",
            url,
            "--timeout",
            "2",
            "--requests",
            "2",
            "--duration",
            "10",
            "--json",
            str(out),
            "--no-progress",
        )
        cases.append(
            Case(5, f"bench --url, {label}", argv, ok=(0, 1, 2), check=_valid_json_or_absent(out), timeout_s=90)
        )
    argv = cli("bench", "--url", "http://127.0.0.1:9/v1", "--timeout", "2", "--requests", "2", "--no-progress")
    cases.append(Case(5, "bench --url, connection refused", argv, ok=(0, 1, 2), timeout_s=90))
    return cases


def _valid_json_or_absent(path: Path) -> Callable[[Run], str | None]:
    def check(run: Run) -> str | None:
        import json

        if not path.exists():
            return None if run.rc == 2 else f"exit {run.rc} without {path}"
        try:
            json.loads(path.read_text())
        except ValueError as exc:
            return f"{path} is not JSON ({exc})"
        return None

    return check


# ---- group 7: crash guard -------------------------------------------------------------------------


def crash_guard(ws: Workspace) -> list[Case]:
    cases = []
    damage = {
        "garbage": b"\x00\xff not json",
        "deep": b"[" * 10000,
        "an unknown mode": b'{"schema": 2, "mode": "turbo", "reason": "x"}',
        "a list": b"[1, 2, 3]",
    }
    for label in [*damage, "a directory", "a FIFO", "a link to /dev/zero"]:
        folder = ws.folder("guard")
        env = ws.own_user_dirs(folder)
        _damage_verdict(Path(env["ONDEVICE_CACHE_DIR"]), label, damage.get(label))
        cases.append(run_case(6, f"verdict file {label}", ws.tiny, ok=(0,), env=env, timeout_s=240))
    for setting in ("bogus", "REPACK", "none"):
        cases.append(
            run_case(6, f"ONDEVICE_CPU_BUFFERS={setting}", ws.tiny, ok=(0,), env={"ONDEVICE_CPU_BUFFERS": setting})
        )
    return cases


def _damage_verdict(cache: Path, label: str, data: bytes | None) -> None:
    from ondevice.llama.guard import verdict_path

    path = verdict_path(cache)
    path.parent.mkdir(parents=True)
    if data is not None:
        path.write_bytes(data)
    elif label == "a directory":
        path.mkdir()
    elif label == "a FIFO":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


# ---- the table ------------------------------------------------------------------------------------


def build_cases(ws: Workspace, groups: set[int], seeds: int, servers: list) -> list[Case]:
    makers = {
        0: lambda: damaged_files(ws, seeds),
        1: lambda: output_paths(ws),
        2: lambda: damaged_stores(ws),
        3: lambda: interruptions(ws),
        4: lambda: concurrency(ws),
        5: lambda: broken_servers(ws, servers),
        6: lambda: crash_guard(ws),
    }
    return [case for g in sorted(groups) for case in makers[g]()]


def table(results: list[tuple[Case, str, str]]) -> str:
    counts = {g: Counter() for g in range(len(GROUPS))}
    for case, kind, _ in results:
        counts[case.group][kind] += 1
    head = f"| group | tried | {' | '.join(KINDS)} |"
    lines = [head, "|---|" + "---|" * (len(KINDS) + 1)]
    for g, name in enumerate(GROUPS):
        c = counts[g]
        if sum(c.values()):
            lines.append(f"| {name} | {sum(c.values())} | " + " | ".join(str(c[k]) for k in KINDS) + " |")
    total = Counter()
    for c in counts.values():
        total.update(c)
    lines.append(f"| all | {sum(total.values())} | " + " | ".join(str(total[k]) for k in KINDS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.hostile_table", description=__doc__.split("\n")[0])
    ap.add_argument("--groups", default="1,2,3,4,5,6,7", help="which groups, 1-7, comma-separated (default: all)")
    ap.add_argument("--seeds", type=int, default=20, help="damaged GGUF files generated for group 1 (default 20)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (its path is printed)")
    args = ap.parse_args(argv)
    groups = {int(g) - 1 for g in args.groups.split(",")}
    root = Path(tempfile.mkdtemp(prefix="ondevice-hostile-"))
    servers: list = []
    try:
        return _run_all(root, groups, args.seeds, servers)
    finally:
        for listener, stop in servers:
            stop.set()
            listener.close()
        if args.keep:
            print(f"work folder: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def _run_all(root: Path, groups: set[int], seeds: int, servers: list) -> int:
    ws = Workspace(root)
    cases = build_cases(ws, groups, seeds, servers)
    started = time.monotonic()
    results = []
    for case in cases:
        run = execute(case, ws)
        kind, detail = judge(case, run)
        results.append((case, kind, detail))
        if case.after is not None:
            case.after()
    print(table(results))
    print(f"\n{len(cases)} cases in {time.monotonic() - started:.0f} s")
    dirty = [(c, k, d) for c, k, d in results if k != "clean"]
    for case, kind, detail in dirty:
        print(f"  {kind:9s} [{GROUPS[case.group]}] {case.name}: {detail}")
    return 1 if dirty else 0


if __name__ == "__main__":
    sys.exit(main())
