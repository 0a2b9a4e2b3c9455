"""`ondevice predict` and `ondevice probe` through the CLI entry point: output, JSON, bad input -> exit 2."""

from __future__ import annotations

import json

import pytest

from ondevice.cli.main import main
from ondevice.probing import cache
from tests.probe_fakes import fake_result

SPEC = ["--params", "8e9", "--quant", "Q4_K_M", "--layers", "32", "--kv-heads", "8", "--head-dim", "128"]


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def seeded_cache(empty_cache):
    cache.save(fake_result(build=cache.build_id()))
    return empty_cache


def test_predict_spec_on_a_given_bandwidth(empty_cache, capsys):
    assert main(["predict", *SPEC, "--bandwidth", "307", "--ctx", "1,8192"]) == 0
    out = capsys.readouterr().out
    assert "ceiling bandwidth 307.0 GB/s (given)" in out
    assert " 64.0 " in out  # 4.80 GB per token on 307 GB/s
    assert "FITS" in out or "TIGHT" in out or "DOES NOT FIT" in out


def test_predict_spec_json(empty_cache, capsys):
    assert main(["predict", *SPEC, "--bandwidth", "307", "--ctx", "128", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["bandwidth_source"] == "given" and d["contexts"][0]["n_ctx"] == 128
    assert 63 < d["contexts"][0]["ceiling_tok_s"] < 64.5


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["predict", *SPEC, "--bandwidth", "0"], "bandwidth must be positive"),
        (["predict", *SPEC, "--bandwidth", "-3"], "bandwidth must be positive"),
        (
            ["predict", "--params", "8e9", "--quant", "Q4_K_M", "--bandwidth", "100"],
            "a spec needs --layers, --kv-heads, --head-dim",
        ),
        (["predict", *SPEC[:2], "--quant", "Q7_Z", *SPEC[4:], "--bandwidth", "100"], "unknown quant 'Q7_Z'"),
        (
            ["predict", *SPEC, "--ctx-train", "4096", "--ctx", "8192", "--bandwidth", "100"],
            "beyond the model's trained context of 4096",
        ),
        (["predict", *SPEC, "--ctx", "12,abc", "--bandwidth", "100"], "--ctx takes positive integers"),
        (["predict", *SPEC, "--prompt", "0", "--bandwidth", "100"], "--prompt must be a positive"),
        (["predict", "some-model", *SPEC, "--bandwidth", "100"], "either MODEL or a spec"),
        (["probe", "--threads", "0"], "--threads must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(empty_cache, capsys, argv, msg):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert msg in err and len(err.strip().splitlines()) == 1


def test_predict_a_file_with_the_cached_probe(seeded_cache, tiny_model, capsys):
    assert main(["predict", str(tiny_model), "--ctx", "16,256", "--prompt", "64"]) == 0
    out = capsys.readouterr().out
    assert "predicted tok/s" in out and "measured by the probe" in out
    assert "TTFT floor for 64 prompt tokens" in out and "memory at 256 tokens" in out and "FITS" in out


def test_predict_default_contexts_stay_within_the_model(seeded_cache, tiny_model, capsys):
    assert main(["predict", str(tiny_model), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert [c["n_ctx"] for c in d["contexts"]] == [128]  # 2048 and 8192 are beyond its 512
    assert d["calibrated"] and d["contexts"][0]["predicted_tok_s"] <= d["contexts"][0]["ceiling_tok_s"]
    assert 85 < d["probe_age_s"] < 3600


def test_probe_shows_the_cached_result(seeded_cache, capsys):
    assert main(["probe", "--no-model"]) == 0
    out = capsys.readouterr().out
    assert "cached; --refresh to measure again" in out and "read 20.0 GB/s" in out
    assert "host compute: 100.0 GFLOP/s" in out and "ceiling bandwidth (the roofline's bound): 20.0 GB/s" in out
    assert "nameplate" in out and "timed" not in out


def test_probe_times_a_model_and_says_how(seeded_cache, tiny_model, capsys):
    assert main(["probe", str(tiny_model)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "tiny-f16.gguf timed on this machine (its own file, full plan)" in out
    assert "decode:" in out and "prefill from an empty cache: 1 tokens" in out and "batched decode steps" in out
    assert main(["probe", str(tiny_model), "--no-model"]) == 2  # a model to time, or none: not both


def test_probe_json(seeded_cache, tiny_model, capsys):
    assert main(["probe", str(tiny_model), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["from_cache"] and d["memory"]["read_gbs"] == 20.0 and d["model"] == "tiny-f16.gguf"
    assert d["timing"]["plan"] == "full" and len(d["timing"]["decode"]) >= 2


TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
}


def test_predict_from_a_config_times_its_twin_here(seeded_cache, tmp_path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_CONFIG))
    assert main(["predict", "--config", str(cfg), "--quant", "Q8_0", "--ctx", "128", "--prompt", "64", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["calibrated"] and d["request"]["basis"] == "calibrated" and d["quant"] == "Q8_0"
    assert d["contexts"][0]["predicted_tok_s"] > 0
    # the twin was timed once and cached under the model's shape: asked again, nothing is written or timed
    assert main(["predict", "--config", str(cfg), "--quant", "Q8_0", "--ctx", "128", "--prompt", "64"]) == 0
    assert "writing a twin" not in capsys.readouterr().err
    # --refresh times it again (what the note of a timing on a busy machine points to)
    assert main(["predict", "--config", str(cfg), "--quant", "Q8_0", "--ctx", "128", "--refresh"]) == 0
    assert "writing a twin" in capsys.readouterr().err


def test_predict_refresh_times_a_model_file_again(seeded_cache, tiny_model, capsys):
    assert main(["predict", str(tiny_model), "--ctx", "16"]) == 0
    assert "timing tiny-f16.gguf" in capsys.readouterr().err
    assert main(["predict", str(tiny_model), "--ctx", "16"]) == 0
    assert "timing tiny-f16.gguf" not in capsys.readouterr().err  # cached
    assert main(["predict", str(tiny_model), "--ctx", "16", "--refresh"]) == 0
    assert "timing tiny-f16.gguf" in capsys.readouterr().err


def test_predict_from_flags_with_the_embedding_times_a_llama_twin(seeded_cache, capsys):
    argv = [
        "predict",
        "--params",
        "250000",
        "--layers",
        "2",
        "--kv-heads",
        "2",
        "--head-dim",
        "16",
        "--heads",
        "4",
        "--d-model",
        "64",
        "--vocab",
        "512",
        "--quant",
        "F16",
        "--ctx",
        "128",
        "--prompt",
        "32",
        "--json",
    ]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["calibrated"]


@pytest.mark.parametrize(
    "config, msg",
    [
        ({k: v for k, v in TINY_CONFIG.items() if k != "hidden_size"}, "hidden_size"),
        ({**TINY_CONFIG, "architectures": ["NoSuchForCausalLM"]}, "NoSuchForCausalLM"),
        ({**TINY_CONFIG, "num_hidden_layers": -2}, "num_hidden_layers"),
        ("[not a config", "config"),
    ],
)
def test_a_config_that_cannot_be_built_is_one_line_and_exit_2(seeded_cache, tmp_path, capsys, config, msg):
    cfg = tmp_path / "config.json"
    cfg.write_text(config if isinstance(config, str) else json.dumps(config))
    assert main(["predict", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and msg in err[0], err
