"""`ondevice twin`: a model's twin or a config's, fewer layers, and every bad input as one line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ondevice.quant.synth import SynthConfig, build_synthetic_model
from ondevice.quant.twin import read_header, shape_key

from ondevice.cli.main import main
from tests.file_fakes import SPECIAL_KINDS, special_file

CONFIGS = Path(__file__).parent / "data" / "hf_configs"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    cfg = SynthConfig(d_model=256, n_head=4, n_head_kv=2, d_ff=256, n_layer=3, n_vocab=512, seed=11)
    return build_synthetic_model(cfg, tmp_path_factory.mktemp("cli") / "model.gguf")


@pytest.fixture(scope="module")
def tiny_config(tmp_path_factory) -> Path:
    cfg = json.loads((CONFIGS / "qwen3-0.6b.json").read_text())
    cfg |= {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "vocab_size": 600, "head_dim": 64}
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_twin_of_a_model(model, tmp_path, capsys):
    out = tmp_path / "twin.gguf"
    assert main(["twin", str(model), str(out)]) == 0
    assert read_header(out) == read_header(model)
    line = capsys.readouterr().out
    assert f"wrote {out}: llama, 3 of 3 blocks" in line and shape_key(read_header(model)) in line
    assert main(["twin", str(model), str(out), "--force", "--layers", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layers"] == 2 and report["model_layers"] == 3 and read_header(out).n_layer == 2


def test_twin_of_a_config(tiny_config, tmp_path, capsys):
    out = tmp_path / "cfg.gguf"
    assert main(["twin", "--config", str(tiny_config), "--quant", "q4_k_m", str(out), "--layers", "2"]) == 0
    header = read_header(out)
    assert header.arch == "qwen3" and header.n_layer == 2
    assert {t.type for t in header.tensors if t.name.startswith("blk.")} >= {"Q4_K"}
    sparse = tmp_path / "sparse.gguf"
    assert main(["twin", "--config", str(tiny_config), str(sparse), "--sparse"]) == 0
    assert {t.type for t in read_header(sparse).tensors} == {"F16", "F32"}
    assert "(sparse)" in capsys.readouterr().out


def _bad(args: list[str], capsys, match: str) -> None:
    assert main(["twin", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ondevice: error:") and match in err[0], err


def test_bad_input_is_one_line_and_exit_2(model, tiny_config, tmp_path, capsys):
    out = str(tmp_path / "out.gguf")
    _bad([str(model), out, "--config", str(tiny_config)], capsys, "MODEL or --config CONFIG.json, not both")
    _bad([str(model), out, "--quant", "Q4_0"], capsys, "--quant goes with --config")
    _bad([str(model), out, "--layers", "0"], capsys, "--layers must be 1..3")
    _bad([str(model), out, "--layers", "4"], capsys, "--layers must be 1..3")
    _bad([str(tmp_path / "none.gguf"), out], capsys, "no such file")
    _bad([str(model), str(tmp_path / "no" / "dir.gguf")], capsys, "does not exist")
    _bad(["--config", str(tmp_path / "none.json"), out], capsys, "no such file")
    _bad(["--config", str(tiny_config), "--quant", "Q9_X", out], capsys, "unknown quantization type")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}')
    _bad(["--config", str(bad_json), out], capsys, "'num_attention_heads' is missing")
    assert not Path(out).exists()
    Path(out).write_bytes(b"keep")
    _bad([str(model), out], capsys, "already exists; pass --force")
    assert Path(out).read_bytes() == b"keep"


@pytest.mark.parametrize("kind", SPECIAL_KINDS)
def test_special_destination_refused_even_with_force(model, tmp_path, capsys, kind):
    dst = special_file(tmp_path, kind)
    _bad([str(model), str(dst), "--force"], capsys, "not a regular file")


@pytest.mark.default_model
def test_twin_of_the_default_model(default_model, tmp_path, capsys):
    out = tmp_path / "default-twin.gguf"
    assert main(["twin", str(out), "--sparse"]) == 0  # no MODEL: the built-in model, as other commands
    assert read_header(out) == read_header(default_model)
    assert out.stat().st_size == default_model.stat().st_size
