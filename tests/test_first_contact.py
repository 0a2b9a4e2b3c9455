"""Prediction on first contact: with nothing cached, the first load measures the machine's bandwidth
(saying so) and times the model's shape on the engine with the quick plan, caches both, and predicts
from them; later loads measure nothing."""

from __future__ import annotations

import pytest

from ondevice import api
from ondevice.cli.main import main
from ondevice.core.errors import ProbeError
from ondevice.engine import load
from ondevice.probing import cache
from ondevice.probing.plans import FULL, QUICK


@pytest.fixture()
def empty_cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("ONDEVICE_CACHE_DIR", str(root))
    monkeypatch.setattr("ondevice.probing.host.array_bytes_for", lambda *a, **k: 16 << 20)
    return root


def test_first_contact_measures_the_bandwidth_and_times_the_model_once(empty_cache, tiny_model):
    said: list[str] = []
    with load(tiny_model, n_ctx=256, n_threads=1) as eng:
        pred = api.auto_predictor(eng, said.append)
        assert said[0] == api.FIRST_CONTACT and any(line.startswith("timing tiny-f16.gguf") for line in said)
        host = cache.load_cached("CPU")
        assert host is not None and not host.is_full  # the bandwidth only, cached
        assert pred.basis == "measured" and pred.timing.plan == "quick" and pred.ceiling_gbs == host.ceiling_gbs
        ceiling_s, predicted_s = pred.step_s(64)
        assert ceiling_s > 0 and predicted_s > 0
    said.clear()
    with load(tiny_model, n_ctx=256, n_threads=1) as eng:
        again = api.auto_predictor(eng, said.append)
    assert said == [] and again.timing == pred.timing  # cached: nothing measured


def test_the_first_contact_plan_stays_small():
    """What a first run times, in tokens computed: the quick plan is a fraction of the full one (on the
    default model about a second: benchmarks/first_contact.py times it)."""
    assert QUICK.rounds == 1 and not QUICK.batch
    assert QUICK.tokens <= 800 and QUICK.tokens < FULL.tokens * FULL.rounds / 4


def test_first_contact_measures_what_a_first_run_does_and_can_leave_the_cache_alone(empty_cache, monkeypatch):
    from ondevice.probing import host

    def not_on_first_contact(*_a, **_k):
        raise AssertionError("first contact measures the bandwidth only")

    monkeypatch.setattr(host, "probe_disk", not_on_first_contact)
    monkeypatch.setattr(host, "probe_compute", not_on_first_contact)
    floors: list[int] = []
    monkeypatch.setattr(
        host, "array_bytes_for", lambda *_a, floor=host.MIN_ARRAY_BYTES: floors.append(floor) or 16 << 20
    )
    cached = api.first_contact("CPU")
    assert cached.compute is None and cached.disk is None and cache.load_cached("CPU") == cached
    assert floors == [host.QUICK_MIN_ARRAY_BYTES]  # smaller arrays: fresh memory is most of what it costs
    fresh = api.first_contact("CPU", refresh=True, save=False)
    assert fresh.created_unix_s > cached.created_unix_s
    assert cache.load_cached("CPU") == cached  # measured, not cached


def test_a_damaged_cache_is_one_line_and_exit_2(empty_cache, tiny_model, capsys):
    path = cache.cache_path("CPU")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{half a file")
    with load(tiny_model, n_ctx=256, n_threads=1) as eng, pytest.raises(ProbeError, match="ondevice probe --refresh"):
        api.auto_predictor(eng)
    assert main(["run", str(tiny_model), "hello", "-n", "2", "-c", "256"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "probe cache" in err[0] and "--refresh" in err[0]


def test_run_on_first_contact_says_so_and_shows_the_prediction(empty_cache, tiny_model, capsys):
    assert main(["run", str(tiny_model), "hello", "-n", "3", "-c", "256", "--ignore-eos"]) == 0
    err = capsys.readouterr().err
    assert api.FIRST_CONTACT in err and "timing tiny-f16.gguf" in err
    line = err.strip().splitlines()[-1]
    assert "predicted" in line and "ceiling" in line and "TTFT" in line and "E2E" in line
    assert "other processes used" in line
    assert main(["run", str(tiny_model), "hello", "-n", "3", "-c", "256", "--ignore-eos"]) == 0
    assert api.FIRST_CONTACT not in capsys.readouterr().err  # once


def test_the_first_contact_passes_are_one_named_figure(monkeypatch):
    """benchmarks/host_accuracy.py compares a C kernel's best of FIRST_CONTACT_PASSES with the probe's: both must
    read the same figure (the benchmark failed to import it)."""
    import ondevice.probing

    asked = {}
    monkeypatch.setattr(ondevice.probing, "probe", lambda **kw: asked.update(kw))
    api.first_contact("CPU", save=False)
    assert asked["memory_passes"] == api.FIRST_CONTACT_PASSES and not asked["full"]
