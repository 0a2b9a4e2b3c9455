"""quantize onto a destination the system will not replace (an immutable file, a rename refused):
one line naming the destination, exit 2, a typed QuantError from the library, no temp file left."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ondevice.quant.quantize import quantize

from ondevice.cli.main import main
from ondevice.core.errors import QuantError


def refuse_replacing(monkeypatch, dst: Path) -> None:
    """os.replace onto `dst` fails as it does onto a `chattr +i` file."""
    real = os.replace

    def replace(src, target, *args, **kwargs):
        if Path(target) == dst:
            raise PermissionError(errno.EPERM, "Operation not permitted", str(src), None, str(target))
        return real(src, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("existing", [False, True])
def test_a_refused_rename_is_one_line_exit_2_and_leaves_no_temp(tmp_path, tiny_model, monkeypatch, capsys, existing):
    dst = tmp_path / "out.gguf"
    flags = []
    if existing:
        dst.write_bytes(b"the user's file")
        flags = ["--force"]
    refuse_replacing(monkeypatch, dst)
    rc = main(["quantize", str(tiny_model), str(dst), "--type", "Q8_0", "--no-progress", *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("ondevice: error: ") and f"cannot write {dst}" in err and "not permitted" in err
    assert [p.name for p in tmp_path.iterdir()] == (["out.gguf"] if existing else [])
    if existing:
        assert dst.read_bytes() == b"the user's file"


def test_the_library_raises_quant_error(tmp_path, tiny_model, monkeypatch):
    dst = tmp_path / "out.gguf"
    refuse_replacing(monkeypatch, dst)
    with pytest.raises(QuantError, match="cannot write"):
        quantize(tiny_model, dst, "Q8_0")
    assert list(tmp_path.iterdir()) == []


def test_a_real_immutable_file(tmp_path, tiny_model, capsys):
    chattr = shutil.which("chattr")
    dst = tmp_path / "frozen.gguf"
    dst.write_bytes(b"frozen")
    if chattr is None or subprocess.run([chattr, "+i", str(dst)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (needs root and a file system that keeps the flag)")
    try:
        rc = main(["quantize", str(tiny_model), str(dst), "--type", "Q8_0", "--no-progress", "--force"])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1 and str(dst) in err, err
        assert [p.name for p in tmp_path.iterdir()] == ["frozen.gguf"] and dst.read_bytes() == b"frozen"
    finally:
        subprocess.run([chattr, "-i", str(dst)], capture_output=True)
