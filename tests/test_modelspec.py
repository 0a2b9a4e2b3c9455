from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter, Keys
from ondevice.quant.synth import SynthConfig, build_synthetic_model

from ondevice.core.errors import GGUFFormatError, ModelNotFoundError
from ondevice.gguf.reader import read_gguf
from ondevice.gguf.spec import inspect
from tests.gguf_fuzz import load_in_child


def expected_bytes(cfg: SynthConfig) -> dict[str, int]:
    """Independent byte arithmetic for a synthetic llama of known shape."""
    w = 2 if cfg.dtype == "F16" else 4
    d, hd, f, v = cfg.d_model, cfg.d_model // cfg.n_head, cfg.d_ff, cfg.n_vocab
    per_layer_matrices = (2 * d * cfg.n_head * hd + 2 * d * cfg.n_head_kv * hd + 3 * d * f) * w
    per_layer_norms = 2 * d * 4
    embd = v * d * w
    head = 0 if cfg.tied_output else v * d * w
    total = embd + cfg.n_layer * (per_layer_matrices + per_layer_norms) + d * 4 + head
    decode = total if cfg.tied_output else total - embd + d * w
    return {"weight": total, "decode": decode, "kv": 2 * cfg.n_layer * cfg.n_head_kv * 2 * hd}


@pytest.mark.parametrize(
    "cfg",
    [
        SynthConfig(),
        SynthConfig(dtype="F32", d_model=96, n_head=6, n_head_kv=3, d_ff=256, n_layer=3, n_vocab=300),
        SynthConfig(tied_output=True, n_head_kv=1),
    ],
)
def test_byte_arithmetic_is_exact_for_known_shapes(tmp_path, cfg):
    spec = inspect(build_synthetic_model(cfg, tmp_path / "m.gguf"))
    want = expected_bytes(cfg)
    assert spec.weight_bytes == want["weight"]
    assert spec.decode_weight_bytes == want["decode"]
    assert spec.kv_bytes_per_token == want["kv"]
    assert sum(spec.bytes_by_type.values()) == spec.weight_bytes
    assert spec.header_bytes + spec.weight_bytes + spec.padding_bytes == spec.file_bytes
    assert spec.tied_output == cfg.tied_output
    assert (spec.n_layer, spec.d_model, spec.n_head, spec.n_head_kv) == (
        cfg.n_layer,
        cfg.d_model,
        cfg.n_head,
        cfg.n_head_kv,
    )
    assert spec.head_dim_k == spec.head_dim_v == cfg.d_model // cfg.n_head
    assert spec.n_vocab == cfg.n_vocab and spec.n_ctx_train == cfg.n_ctx_train
    w = 2 if cfg.dtype == "F16" else 4
    norm_elems = (2 * cfg.n_layer + 1) * cfg.d_model
    assert spec.n_params * w - norm_elems * (w - 4) == spec.weight_bytes  # norms are F32
    assert spec.kv_read_bytes(100) == 100 * spec.kv_bytes_per_token


def test_same_seed_same_bytes(tmp_path):
    a = build_synthetic_model(SynthConfig(seed=7), tmp_path / "a.gguf").read_bytes()
    b = build_synthetic_model(SynthConfig(seed=7), tmp_path / "b.gguf").read_bytes()
    c = build_synthetic_model(SynthConfig(seed=8), tmp_path / "c.gguf").read_bytes()
    assert a == b and a != c


def test_default_model_is_gemma3_as_documented(default_model):
    s = inspect(default_model)
    assert s.arch == "gemma3"
    assert (s.n_layer, s.d_model, s.n_head, s.n_head_kv) == (18, 640, 4, 1)
    assert s.head_dim_k == s.head_dim_v == 256
    assert s.sliding_window == 512
    assert s.swa_layers == tuple(i for i in range(18) if i % 6 != 5)
    assert s.tied_output
    assert s.quant == "Q4_K_M"
    # the byte figures add up exactly to the tensor data in the file
    g = read_gguf(default_model)
    assert s.weight_bytes == sum(t.n_bytes for t in g.tensors)
    assert sum(s.bytes_by_type.values()) == s.weight_bytes
    assert s.header_bytes + s.weight_bytes + s.padding_bytes == s.file_bytes == default_model.stat().st_size
    assert s.decode_weight_bytes == s.weight_bytes  # tied head: the embedding is read whole
    assert s.kv_bytes_per_token == 18 * 2 * 1 * 256 * 2
    # sliding-window layers read at most 512 tokens of KV
    assert s.kv_read_bytes(4096) == 15 * 512 * 1024 + 3 * 4096 * 1024


def write_gguf(
    path: Path, arch: str, tensors: dict[str, np.ndarray], kv: dict | None = None, vocab: list[str] | None = None
) -> Path:
    w = GGUFWriter(path, arch)
    for key, value in (kv or {}).items():
        if isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)
    if vocab:
        w.add_tokenizer_model("llama")
        w.add_token_list(vocab)
    for name, arr in tensors.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_moe_counts_only_the_experts_used(tmp_path):
    n_expert, used, d, f = 8, 2, 32, 64
    t = {
        "token_embd.weight": np.zeros((100, d), np.float32),
        "blk.0.ffn_gate_exps.weight": np.zeros((n_expert, f, d), np.float32),
        "blk.0.attn_q.weight": np.zeros((d, d), np.float32),
        "output.weight": np.zeros((100, d), np.float32),
    }
    keys = {
        Keys.LLM.BLOCK_COUNT: 1,
        Keys.LLM.EXPERT_COUNT: n_expert,
        Keys.LLM.EXPERT_USED_COUNT: used,
        Keys.LLM.EMBEDDING_LENGTH: d,
        Keys.Attention.HEAD_COUNT: 4,
    }
    kv = {key.format(arch="qwen3moe"): value for key, value in keys.items()}
    s = inspect(write_gguf(tmp_path / "moe.gguf", "qwen3moe", t, kv))
    exp_bytes = n_expert * f * d * 4
    assert s.n_expert == 8 and s.n_expert_used == 2
    assert s.weight_bytes == sum(a.nbytes for a in t.values())
    assert s.decode_weight_bytes == exp_bytes * used // n_expert + d * d * 4 + 100 * d * 4 + d * 4
    assert s.n_params_active == s.n_params - n_expert * f * d + used * f * d


def test_vocab_only_file_reports_tokenizer_and_no_weights(tmp_path):
    path = write_gguf(tmp_path / "vocab.gguf", "llama", {}, vocab=["<unk>", "a", "b"])
    s = inspect(path)
    assert not s.has_weights and s.n_vocab == 3 and s.weight_bytes == 0
    out = run_cli("info", str(path))
    assert out.returncode == 0 and "no tensors" in out.stdout


def test_unknown_architecture_reports_what_it_can(tmp_path):
    path = write_gguf(tmp_path / "odd.gguf", "martian", {"w.weight": np.zeros((4, 32), np.float16)})
    s = inspect(path)
    assert s.arch == "martian" and s.n_layer is None and s.weight_bytes == 4 * 32 * 2
    assert any("block_count" in w for w in s.warnings)
    out = run_cli("info", str(path), "--json")
    assert out.returncode == 0 and json.loads(out.stdout)["arch"] == "martian"


@pytest.mark.parametrize(
    "name, key",
    [
        ("bos", Keys.Tokenizer.BOS_ID),
        ("unknown", Keys.Tokenizer.UNK_ID),
        ("sep", Keys.Tokenizer.SEP_ID),
        ("padding", Keys.Tokenizer.PAD_ID),
    ],
)
def test_load_check_refuses_a_special_token_outside_the_vocabulary(tiny_model, name, key):
    """The keys llama.cpp reads (gguf.Keys: 'tokenizer.ggml.seperator_token_id', as spelt there)."""
    from dataclasses import replace

    from ondevice.gguf.loadcheck import check_loadable
    from ondevice.gguf.spec import spec_from_gguf

    g = read_gguf(tiny_model)
    check_loadable(g, spec_from_gguf(g))
    bad = replace(g, metadata={**g.metadata, key: 10**6})
    with pytest.raises(GGUFFormatError, match=f"{name} token id 1000000 is outside the vocabulary"):
        check_loadable(bad, spec_from_gguf(bad))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ondevice.cli.main", *args], capture_output=True, text=True, timeout=120
    )


def test_info_json_has_the_documented_keys(tiny_model):
    out = run_cli("info", str(tiny_model), "--json")
    data = json.loads(out.stdout)
    for key in (
        "path arch n_params n_params_active n_layer d_model n_head n_head_kv head_dim_k head_dim_v n_ctx_train "
        "n_vocab sliding_window n_expert n_expert_used tied_output file_bytes weight_bytes decode_weight_bytes "
        "kv_bytes_per_token bits_per_weight bytes_by_type"
    ).split():
        assert key in data, key


@pytest.mark.parametrize("case", ["missing", "directory", "magic", "truncated", "offset", "count", "empty"])
def test_bad_files_give_one_line_and_exit_2(tmp_path, tiny_model, case):
    data = bytearray(tiny_model.read_bytes())
    g = read_gguf(tiny_model)
    path = tmp_path / "bad.gguf"
    if case == "missing":
        path = tmp_path / "missing.gguf"
    elif case == "directory":
        path = tmp_path
    elif case == "magic":
        path.write_bytes(b"GGML" + data[4:])
    elif case == "truncated":  # the header claims more tensor data than the file has
        path.write_bytes(data[: g.data_offset + g.tensors[-1].offset - g.data_offset + 10])
    elif case == "offset":  # first tensor's offset field pushed far out of range
        info_end = g.data_offset
        pos = bytes(data).rfind(g.tensors[0].name.encode(), 0, info_end)
        off_pos = pos + len(g.tensors[0].name) + 4 + 8 * len(g.tensors[0].shape) + 4
        data[off_pos : off_pos + 8] = (1 << 40).to_bytes(8, "little")
        path.write_bytes(data)
    elif case == "count":  # tensor count far beyond what the file can hold
        data[8:16] = (10**12).to_bytes(8, "little")
        path.write_bytes(data)
    elif case == "empty":
        path.write_bytes(b"")
    expected = ModelNotFoundError if case == "missing" else GGUFFormatError
    with pytest.raises(expected):
        inspect(path)
    out = run_cli("info", str(path))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("ondevice: error:")
    assert "Traceback" not in out.stderr


def header_mutants(original: bytes, header_end: int, n: int, seed: int):
    """Seeded mutants of a GGUF: flipped header bytes, extreme 64-bit values, truncations."""
    rng = np.random.default_rng(seed)
    for case in range(n):
        data = bytearray(original)
        kind = case % 3
        if kind == 0:  # flip a few random header bytes
            for pos in rng.integers(0, header_end, size=int(rng.integers(1, 8))):
                data[pos] = int(rng.integers(0, 256))
        elif kind == 1:  # overwrite a 64-bit field-sized window with an extreme value
            pos = int(rng.integers(0, header_end - 8))
            data[pos : pos + 8] = [0, 1, 2**31, 2**63, 2**64 - 1][int(rng.integers(0, 5))].to_bytes(8, "little")
        else:  # truncate anywhere
            data = data[: int(rng.integers(0, len(data)))]
        yield bytes(data)


def test_random_header_mutations_never_crash(tiny_model):
    """Every mutant gives a typed error or a valid spec whose bytes add up."""
    header_end = read_gguf(tiny_model).data_offset
    outcomes = {"error": 0, "valid": 0}
    path = tiny_model.parent / "fuzz.gguf"
    for data in header_mutants(tiny_model.read_bytes(), header_end, 300, seed=1234):
        path.write_bytes(data)
        try:
            spec = inspect(path)
        except GGUFFormatError:
            outcomes["error"] += 1
        else:
            assert spec.weight_bytes + spec.header_bytes + spec.padding_bytes == spec.file_bytes
            outcomes["valid"] += 1
    assert outcomes["error"] > 50 and outcomes["valid"] > 10, outcomes


def test_mutants_that_pass_the_load_check_do_not_crash_llama_cpp(tiny_model, tmp_path):
    """What inspect_for_load lets through, llama.cpp opens (or refuses) without dying, in a child
    that opens models the one way the product does (ondevice.llama.model.load_model)."""
    from ondevice.gguf.loadcheck import inspect_for_load

    header_end = read_gguf(tiny_model).data_offset
    passed = []
    for i, data in enumerate(header_mutants(tiny_model.read_bytes(), header_end, 300, seed=99)):
        path = tmp_path / f"m{i}.gguf"
        path.write_bytes(data)
        try:
            inspect_for_load(path)
        except GGUFFormatError:
            path.unlink()
        else:
            passed.append(path)
    assert passed, "no mutant passed the load check: the test checks nothing"
    outcomes = load_in_child(passed)
    crashed = [f"{passed[i]}: {detail}" for i, (outcome, detail) in outcomes.items() if outcome == "crashed"]
    assert not crashed, "llama.cpp died on:\n" + "\n".join(crashed)
    assert len(outcomes) == len(passed)
