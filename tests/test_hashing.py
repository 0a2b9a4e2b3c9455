"""ondevice.core.hashing: the one sha256 reader of files."""

from __future__ import annotations

import hashlib
import io

from ondevice.core.hashing import CHUNK_BYTES, copy_sha256, sha256_file


def test_sha256_file_reads_past_one_block(tmp_path):
    data = bytes(range(256)) * (CHUNK_BYTES // 256 + 3)  # a block and a bit more
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_file(path) == sha256_file(str(path)) == hashlib.sha256(data).hexdigest()
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_copy_sha256_writes_the_sources_in_order_and_hashes_what_it_wrote(tmp_path):
    parts = [b"a" * (CHUNK_BYTES + 1), b"", b"tail"]
    paths = []
    for i, part in enumerate(parts):
        paths.append(tmp_path / f"part{i}")
        paths[-1].write_bytes(part)
    out = io.BytesIO()
    assert copy_sha256(paths, out) == hashlib.sha256(b"".join(parts)).hexdigest()
    assert out.getvalue() == b"".join(parts)


def test_copy_sha256_reports_bytes_done_of_the_total(tmp_path):
    parts = [b"a" * (CHUNK_BYTES + 1), b"tail"]
    paths = []
    for i, part in enumerate(parts):
        paths.append(tmp_path / f"part{i}")
        paths[-1].write_bytes(part)
    heard: list[tuple[int, int]] = []
    out = io.BytesIO()
    digest = copy_sha256(iter(paths), out, lambda done, total: heard.append((done, total)))
    total = CHUNK_BYTES + 5
    assert digest == hashlib.sha256(b"".join(parts)).hexdigest()
    assert heard == [(CHUNK_BYTES, total), (CHUNK_BYTES + 1, total), (total, total)]
