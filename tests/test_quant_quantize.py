"""Quantizing through llama.cpp: file sizes by the bits-per-weight arithmetic, bytes equal to the
numpy reference, models that load and generate, and every kind of bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from gguf import quants as gq
from ondevice.quant import reference
from ondevice.quant.errstats import read_tensor, tensor_errors
from ondevice.quant.formats import block_format
from ondevice.quant.quantize import estimate_bytes, file_type, file_types, main_tensor_type, quantize
from ondevice.quant.synth import SynthConfig, build_synthetic_model, tensor_shapes

from ondevice.cli.main import main
from ondevice.core.errors import GGUFFormatError, InvalidParameterError, QuantError
from ondevice.gguf.reader import read_gguf
from ondevice.gguf.spec import inspect
from tests.file_fakes import SPECIAL_KINDS, file_kind, special_file, stale_temp

# Rows of 256 so the K-quant types apply without fallbacks.
WIDE = SynthConfig(d_model=256, n_head=4, n_head_kv=2, d_ff=512, n_layer=2, n_vocab=512, seed=3)


@pytest.fixture(scope="module")
def qdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("quant")


@pytest.fixture(scope="module")
def wide(qdir) -> Path:
    return build_synthetic_model(WIDE, qdir / "wide-f16.gguf")


@pytest.fixture(scope="module")
def quantized(wide, qdir) -> dict[str, Path]:
    return {t: quantize(wide, qdir / f"wide-{t}.gguf", t, threads=2) for t in ("Q8_0", "Q4_0", "Q4_K_M")}


def _padded(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def _check_file_adds_up(path: Path) -> None:
    """Every tensor's bytes follow its type's block arithmetic; the file is header + padded tensors."""
    g = read_gguf(path)
    for t in g.tensors:
        assert t.n_bytes == block_format(t.ggml_type).tensor_bytes(t.shape), t.name
    assert g.file_bytes == g.data_offset + sum(_padded(t.n_bytes, g.alignment) for t in g.tensors)


def test_q8_0_size_is_the_bits_per_weight_arithmetic(wide, quantized):
    spec = inspect(quantized["Q8_0"])
    shapes = tensor_shapes(WIDE)
    matrices = sum(int(np.prod(s)) for _, s in shapes if len(s) == 2)
    vectors = sum(int(np.prod(s)) for _, s in shapes if len(s) == 1)
    expected = matrices * 34 // 32 + vectors * 4  # Q8_0: 34 bytes per 32 weights; norms stay F32
    assert spec.weight_bytes == expected
    assert spec.bytes_by_type == {"Q8_0": matrices * 34 // 32, "F32": vectors * 4}
    assert spec.bits_per_weight == pytest.approx(8 * expected / (matrices + vectors))
    assert 8 * spec.bytes_by_type["Q8_0"] / matrices == 8.5
    _check_file_adds_up(quantized["Q8_0"])
    assert spec.quant == "Q8_0"


def test_pure_q4_0_size_is_the_bits_per_weight_arithmetic(wide, qdir):
    spec = inspect(quantize(wide, qdir / "pure-q4.gguf", "Q4_0", pure=True))
    shapes = tensor_shapes(WIDE)
    matrices = sum(int(np.prod(s)) for _, s in shapes if len(s) == 2)
    vectors = sum(int(np.prod(s)) for _, s in shapes if len(s) == 1)
    assert spec.bytes_by_type == {"Q4_0": matrices * 18 // 32, "F32": vectors * 4}  # 4.5 bits per weight
    assert spec.weight_bytes * 8 == matrices * 4.5 + vectors * 32
    _check_file_adds_up(qdir / "pure-q4.gguf")


def test_q4_0_and_q4_k_m_sizes_add_up(quantized):
    for name in ("Q4_0", "Q4_K_M"):
        _check_file_adds_up(quantized[name])
    g = read_gguf(quantized["Q4_0"])
    q4 = [t for t in g.tensors if t.type_name == "Q4_0"]
    assert len(q4) >= 2 * 7  # every block matrix (llama.cpp keeps the output head at higher precision)
    assert 8 * sum(t.n_bytes for t in q4) / sum(t.n_elements for t in q4) == 4.5
    k = inspect(quantized["Q4_K_M"])
    assert "Q4_K" in k.bytes_by_type and k.quant == "Q4_K_M"
    sizes = [inspect(quantized[t]).weight_bytes for t in ("Q4_0", "Q4_K_M", "Q8_0")]
    assert sizes[0] < sizes[2] and sizes[1] < sizes[2]


def test_estimate_is_close(wide, quantized):
    g = read_gguf(wide)
    for name in ("Q8_0", "Q4_0"):
        est = estimate_bytes(g, file_type(name))
        assert abs(est - quantized[name].stat().st_size) / est < 0.15


def test_llama_cpp_bytes_equal_the_numpy_reference(wide, quantized):
    """llama.cpp's Q8_0/Q4_0 tensors: our quantizer gives the same bytes, our dequantizer the same
    values as gguf.quants.dequantize."""
    src = read_gguf(wide)
    checked = 0
    for name in ("Q8_0", "Q4_0"):
        g = read_gguf(quantized[name])
        for t in g.tensors:
            if t.type_name != name:
                continue
            raw = np.fromfile(g.path, dtype=np.uint8, count=t.n_bytes, offset=t.offset).reshape(
                -1, t.n_bytes // t.shape[1]
            )
            assert np.array_equal(reference.dequantize(raw, name), gq.dequantize(raw, t.ggml_type)), t.name
            source = read_tensor(src.path, t.name)
            assert np.array_equal(reference.quantize(source, name), raw), t.name
            checked += 1
    assert checked >= 2 * 2 * 7


def test_tensor_errors_against_the_source(wide, quantized):
    q8 = {e.name: e for e in tensor_errors(quantized["Q8_0"], wide)}
    q4 = {e.name: e for e in tensor_errors(quantized["Q4_0"], wide)}
    name = "blk.0.ffn_up.weight"
    assert q8[name].type_name == "Q8_0" and q8[name].source_type == "F16"
    assert 0 < q8[name].rel_rmse < 0.01 < q4[name].rel_rmse < 0.15
    assert q8[name].max_abs_error >= q8[name].rmse > 0
    assert q8["blk.0.attn_norm.weight"].rmse == 0.0
    same = tensor_errors(wide, wide)
    assert all(e.rmse == 0.0 and e.max_abs_error == 0.0 for e in same)
    with pytest.raises(QuantError, match="is not the source"):
        tensor_errors(
            quantized["Q8_0"], build_synthetic_model(SynthConfig(tied_output=True), wide.parent / "tied.gguf")
        )


def test_quantized_models_load_and_generate(quantized):
    import ondevice

    for path in quantized.values():
        with ondevice.load(path, n_ctx=256, predictor=None) as eng:
            g = eng.generate("the tower", max_tokens=6, ignore_eos=True, temperature=0.0)
            assert g.timings.output_tokens == 6 and g.finish_reason == "length"


def test_progress_and_types(wide, qdir):
    seen: list[tuple[int, int]] = []
    quantize(wide, qdir / "p.gguf", "q8_0", progress=lambda d, n: seen.append((d, n)))
    n = len(read_gguf(wide).tensors)
    assert seen and seen[-1] == (n, n) and all(0 < d <= n for d, _ in seen)
    assert {"Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "F16"} <= set(file_types())
    assert "IQ2_XXS" not in file_types()  # needs an importance matrix
    assert main_tensor_type(file_type("Q4_K_M")).name == "Q4_K"


def test_never_overwrites_without_force(wide, qdir):
    dst = qdir / "exists.gguf"
    dst.write_bytes(b"keep me")
    with pytest.raises(QuantError, match="already exists; pass --force"):
        quantize(wide, dst, "Q8_0")
    assert dst.read_bytes() == b"keep me"
    quantize(wide, dst, "Q8_0", force=True)
    assert read_gguf(dst).tensors
    with pytest.raises(QuantError, match="is the source"):
        quantize(dst, dst, "Q8_0", force=True, allow_requantize=True)


def test_requantize_needs_permission(quantized, qdir):
    with pytest.raises(QuantError, match="already quantized .*allow-requantize"):
        quantize(quantized["Q8_0"], qdir / "rq.gguf", "Q4_0")
    assert not (qdir / "rq.gguf").exists()
    out = quantize(quantized["Q8_0"], qdir / "rq.gguf", "Q4_0", allow_requantize=True)
    assert inspect(out).quant == "Q4_0"


def _no_leftovers(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.endswith((".tmp", ".probe")) or "ondevice-tmp" in p.name]


def test_bad_inputs_raise_typed_errors(wide, tmp_path):
    with pytest.raises(QuantError, match="unknown quantization type 'Q9_X'; valid types: .*Q4_K_M"):
        quantize(wide, tmp_path / "a.gguf", "Q9_X")
    (tmp_path / "text.gguf").write_text("not a model at all, just text")
    with pytest.raises(GGUFFormatError):
        quantize(tmp_path / "text.gguf", tmp_path / "b.gguf", "Q8_0")
    with pytest.raises(QuantError, match="folder .*missing does not exist"):
        quantize(wide, tmp_path / "missing" / "c.gguf", "Q8_0")
    with pytest.raises(InvalidParameterError, match="threads"):
        quantize(wide, tmp_path / "d.gguf", "Q8_0", threads=0)
    _no_leftovers(tmp_path)


def _creates_files(folder: Path) -> bool:
    try:
        fd, name = tempfile.mkstemp(dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def test_read_only_destination(wide, tmp_path):
    if os.geteuid() == 0:  # root writes through permission bits: use a folder that refuses every create
        folder = Path("/sys")  # sysfs (or a read-only mount): no regular files, even for root
        if not folder.is_dir() or _creates_files(folder):
            pytest.skip("no read-only folder to try")
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
    with pytest.raises(QuantError, match="not writable"):
        quantize(wide, folder / "x.gguf", "Q8_0")
    assert not (folder / "x.gguf").exists()


def test_disk_full_removes_the_partial_file(wide, tmp_path):
    """A file-size limit makes the write fail part-way, as a full disk would."""
    dst = tmp_path / "full.gguf"
    limit = wide.stat().st_size // 4  # the Q8_0 output is about half the F16 source
    script = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
        from ondevice.cli.main import main
        sys.exit(main(["quantize", {str(wide)!r}, {str(dst)!r}, "--type", "Q8_0", "--no-progress"]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines == [lines[-1]] and lines[-1].startswith("ondevice: error: writing") and "disk may be full" in lines[-1]
    assert "Traceback" not in proc.stderr
    assert not dst.exists()
    assert list(tmp_path.iterdir()) == []


def test_cli_quantize(wide, tmp_path, capsys):
    dst = tmp_path / "cli.gguf"
    assert main(["quantize", str(wide), str(dst), "--type", "q4_k_m", "--no-progress"]) == 0
    assert "wrote" in capsys.readouterr().out and inspect(dst).quant == "Q4_K_M"
    assert main(["quantize", str(wide), str(dst), "--type", "Q8_0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists" in err
    assert main(["quantize", str(wide), str(dst), "--type", "nope"]) == 2
    err = capsys.readouterr().err
    assert "valid types:" in err and "Q4_K_M" in err
    assert main(["quantize", str(dst), str(tmp_path / "r.gguf"), "--type", "Q4_0", "--allow-requantize", "--json"]) == 0
    out = capsys.readouterr()
    assert '"type": "Q4_0"' in out.out and "warning" in out.err and "cannot bring back" in out.err


def test_cli_info_tensors(wide, quantized, capsys):
    assert main(["info", str(quantized["Q4_0"]), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "blk.0.ffn_up.weight" in out and "4.50" in out
    assert main(["info", str(quantized["Q4_0"]), "--against", str(wide)]) == 0
    out = capsys.readouterr().out
    assert "F16->Q4_0" in out and "rel RMSE" in out
    assert main(["info", str(quantized["Q4_0"]), "--tensors", "--against", "/nonexistent.gguf"]) == 2


def test_interrupted_run_leaves_nothing_that_looks_like_a_model(wide, tmp_path):
    import threading

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt  # as Ctrl+C while llama.cpp is still writing

    with pytest.raises(KeyboardInterrupt):
        quantize(wide, tmp_path / "int.gguf", "Q8_0", progress=interrupt)
    for thread in [t for t in threading.enumerate() if t.name == "llama-quantize"]:
        thread.join(60)  # the worker ends on its own once llama.cpp returns; join waits for exactly that
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", ["not_gguf", "missing_folder", "read_only", "directory_source", "unknown_type"])
def test_cli_bad_input_is_one_line_and_exit_2(case, wide, tmp_path, capsys):
    src, dst, qtype = str(wide), str(tmp_path / "out.gguf"), "Q8_0"
    if case == "not_gguf":
        (tmp_path / "notes.txt").write_text("hello")
        src = str(tmp_path / "notes.txt")
    elif case == "missing_folder":
        dst = str(tmp_path / "no" / "such" / "out.gguf")
    elif case == "read_only":
        if os.geteuid() != 0:
            (tmp_path / "ro").mkdir(mode=0o555)
            dst = str(tmp_path / "ro" / "out.gguf")
        else:
            dst = "/sys/out.gguf"
    elif case == "directory_source":
        src = str(tmp_path)
    else:
        qtype = "Q4_Z"
    assert main(["quantize", src, dst, "--type", qtype, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ondevice: error: ") and err.count("\n") == 1
    assert not Path(dst).exists()


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_destination_that_is_not_a_regular_file_is_refused_even_with_force(kind, wide, tmp_path, capsys):
    dst = special_file(tmp_path, kind, "out.gguf")
    before = file_kind(dst)
    assert main(["quantize", str(wide), str(dst), "--type", "Q8_0", "--force", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ondevice: error: ") and err.count("\n") == 1 and "not a regular file" in err
    assert file_kind(dst) == before
    with pytest.raises(QuantError, match="not a regular file"):
        quantize(wide, dst, "Q8_0", force=True)
    assert file_kind(dst) == before
    _no_leftovers(tmp_path)


def test_stale_temp_files_in_the_destination_folder_are_removed(wide, tmp_path):
    stale = stale_temp(tmp_path, "other.gguf")
    live = stale_temp(tmp_path, "third.gguf", pid=os.getpid())
    foreign = tmp_path / ".other.gguf.x1y2z3ab.tmp"  # not a name ondevice writes now: a user's folder keeps it
    foreign.write_bytes(b"x")
    quantize(wide, tmp_path / "q.gguf", "Q8_0")
    assert not stale.exists() and live.exists() and foreign.exists()


def test_cli_progress_off_a_terminal_is_plain_lines(wide, tmp_path, capsys):
    assert main(["quantize", str(wide), str(tmp_path / "p.gguf"), "--type", "Q8_0"]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("quantizing to Q8_0 [")]
    assert lines and "\r" not in "".join(lines) and lines[-1].split()[4:6] == ["21/21", "100%"]
