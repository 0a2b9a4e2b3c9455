"""benchmarks/attention_per_block.py on the tiny model: twins of fewer blocks hold the file's bytes, the file stands
for a count of at least its blocks, and nothing is left in the scratch folder."""

from __future__ import annotations

from pathlib import Path

from ondevice.quant.twin import read_header

from benchmarks import attention_per_block
from ondevice.gguf.spec import inspect


def test_twin_files_reduce_blocks_and_keep_the_model_for_its_own_count(tiny_model, tmp_path):
    files, n_layer = attention_per_block.twin_files(tiny_model, [1, 99], tmp_path)
    assert n_layer == 2 and files[99] == tiny_model
    twin = inspect(files[1])
    assert twin.n_layer == 1
    ours = {t.name: t for t in read_header(files[1]).tensors}
    theirs = {t.name: t for t in read_header(tiny_model).tensors}
    assert ours["blk.0.attn_q.weight"].shape == theirs["blk.0.attn_q.weight"].shape


def test_main_prints_a_line_per_count_and_removes_its_twins(tiny_model, tmp_path, monkeypatch, capsys):
    from ondevice.core import paths

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(paths, "SHARED_MEMORY_DIR", tmp_path / "no-shared-memory")  # the scratch folder: cwd
    written: list[Path] = []

    def spy(*args):
        files, n_layer = twin_files(*args)
        written.extend(p for p in files.values() if p != tiny_model)
        return files, n_layer

    twin_files = attention_per_block.twin_files
    monkeypatch.setattr(attention_per_block, "twin_files", spy)
    argv = [str(tiny_model), "--blocks", "1,2", "--context", "40", "--trials", "2", "--steps", "3", "--threads", "1"]
    assert attention_per_block.main(argv) == 0
    out = capsys.readouterr().out
    assert "(2 blocks); long context 40 tokens" in out
    assert "  1 blocks: attention per block" in out and "  2 blocks: attention per block" in out
    assert [p.parent for p in written] == [tmp_path]
    assert not any(p.exists() for p in written)
