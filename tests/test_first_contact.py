"""Prediction on first contact: with no probe cached, the first load runs the fast host probe
(saying so), caches it, and predicts from it until a kernel probe calibrates."""

from __future__ import annotations

import pytest

from ondevice import api
from ondevice.cli.main import main
from ondevice.core.errors import ProbeError
from ondevice.gguf.spec import inspect
from ondevice.probing import cache
from ondevice.roofline.estimate import estimate
from tests.probe_fakes import fake_result


@pytest.fixture()
def empty_cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(root))
    return root


def test_first_contact_probes_once_then_uses_the_cache(empty_cache, tiny_model):
    spec = inspect(tiny_model)
    said: list[str] = []
    pred = api.auto_predictor(spec, "CPU", said.append)
    assert said == [api.FIRST_CONTACT]
    result = cache.load_cached("CPU")
    assert result is not None and result.kernel is None  # the host probe only, cached
    assert pred.calibration.source == "estimate"
    assert pred.calibration.ceiling_gbs == pytest.approx(result.ceiling_gbs)
    ceiling_s, predicted_s = pred.step_s(64)
    assert predicted_s >= ceiling_s  # an estimate is never faster than the bound
    # the step is the published-measurement estimate's for these bytes (the pooled fit: no CPU rows)
    est = estimate("CPU", spec.quant, pred.step_bytes(64), result.ceiling_gbs)
    assert 1 / predicted_s == pytest.approx(est.tok_s, rel=1e-9) and "pooled" in est.basis
    said.clear()
    again = api.auto_predictor(spec, "CPU", said.append)
    assert said == [] and again.calibration == pred.calibration  # cached: nothing measured


def test_first_contact_measures_what_a_first_run_does_and_can_leave_the_cache_alone(empty_cache, monkeypatch):
    """benchmarks/probe_accuracy.py times first_contact(refresh=True, save=False): the same probe as a
    first run (host only, no disk read), measured again even when one is cached, and not cached."""
    from ondevice.probing import host

    def no_disk(*_a, **_k):
        raise AssertionError("first contact must not read the disk")

    monkeypatch.setattr(host, "probe_disk", no_disk)
    cached = api.first_contact("CPU")
    assert cached.kernel is None and cached.disk is None and cache.load_cached("CPU") == cached
    fresh = api.first_contact("CPU", refresh=True, save=False)
    assert fresh.created_unix_s > cached.created_unix_s and fresh.memory.passes == api.FIRST_CONTACT_PASSES
    assert cache.load_cached("CPU") == cached  # measured, not cached


def test_a_kernel_probe_replaces_the_estimate(empty_cache, tiny_model):
    build = cache.build_id()
    cache.save(fake_result(build=build))
    pred = api.auto_predictor(inspect(tiny_model), "CPU", lambda line: pytest.fail(line))
    assert pred.calibration.source == "kernel" and pred.calibration.type_gbs["Q4_0"] == 10.0


def test_a_damaged_cache_is_one_line_and_exit_2(empty_cache, tiny_model, capsys):
    path = cache.cache_path("CPU")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{half a file")
    with pytest.raises(ProbeError, match="ondevice probe --refresh"):
        api.auto_predictor(inspect(tiny_model), "CPU")
    assert main(["run", str(tiny_model), "hello", "-n", "2", "-c", "256"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "probe cache" in err[0] and "--refresh" in err[0]


def test_run_on_first_contact_says_so_and_how_to_calibrate(empty_cache, tiny_model, capsys):
    assert main(["run", str(tiny_model), "hello", "-n", "3", "-c", "256", "--ignore-eos"]) == 0
    err = capsys.readouterr().err
    assert api.FIRST_CONTACT in err
    line = err.strip().splitlines()[-1]
    assert "ceiling" in line and "`ondevice probe` calibrates" in line and "TTFT" in line and "E2E" in line
    assert main(["run", str(tiny_model), "hello", "-n", "3", "-c", "256", "--ignore-eos"]) == 0
    assert api.FIRST_CONTACT not in capsys.readouterr().err  # once
