"""--plot: the roofline (ceiling line, predicted and measured points) and the ITL boxes drawn by matplotlib when the
extra is installed; without it, one line naming `ondevice[plot]` and exit 2 before any work."""

from __future__ import annotations

import builtins

import pytest

from ondevice.bench.plot import Roofline, RooflinePoint, itl_series, require_matplotlib, roofline_from_bench, write_plot
from ondevice.bench.runner import BenchConfig, plan_bench, run_bench
from ondevice.bench.runs import RESIDENT
from ondevice.bench.stats import scenario_results
from ondevice.bench.suites import custom_suite
from ondevice.cli.main import main
from ondevice.core.errors import MissingExtraError
from ondevice.engine import load


class BytesPredictor:
    """step_bytes: 1 MB of weights + 1 kB per token of context; 10 GB/s."""

    ceiling_gbs = 10.0

    def step_bytes(self, n_ctx: int) -> int:
        return 1_000_000 + 1_000 * n_ctx


@pytest.fixture
def no_matplotlib(monkeypatch):
    real = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)


def test_missing_extra_is_a_typed_error(no_matplotlib):
    with pytest.raises(MissingExtraError, match=r"pip install 'ondevice\[plot\]'"):
        require_matplotlib()


@pytest.mark.parametrize("command", ["bench", "predict"])
def test_missing_extra_is_one_line_exit_2_before_any_work(command, no_matplotlib, tiny_model, tmp_path, capsys):
    out = tmp_path / "roof.svg"
    rc = main([command, str(tiny_model), "--plot", str(out)])
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "ondevice[plot]" in err[0], err
    assert not out.exists() and list(tmp_path.iterdir()) == [] and captured.out == ""


def test_plot_file_must_be_svg_png_or_pdf(tiny_model, tmp_path, capsys):
    rc = main(["bench", str(tiny_model), "--plot", str(tmp_path / "roof.txt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and ".svg, .png or .pdf" in err[0]


def test_roofline_svg_has_the_ceiling_and_every_point(tmp_path):
    pytest.importorskip("matplotlib")
    roof = Roofline(
        30.0,
        "measured",
        (
            RooflinePoint("model-a Q4_0, ctx 512", 150e6, 180.0, 120.0),
            RooflinePoint("model-b Q8_0, ctx 512", 280e6, 95.0),
        ),
    )
    path = write_plot(tmp_path / "roof.svg", roof, {"model-a\nresident p8": [8.0, 9.5, 8.2]})
    text = path.read_text()
    assert text.lstrip().startswith("<?xml") and "</svg>" in text
    for label in (
        "ceiling: 30.0 GB/s (measured)",
        "model-a Q4_0, ctx 512",
        "model-b Q8_0, ctx 512",
        "ITL distribution",
    ):
        assert label in text, label
    again = write_plot(tmp_path / "again.svg", roof, {"model-a\nresident p8": [8.0, 9.5, 8.2]})
    assert again.read_text() == text  # no date, no random ids: the same figure, the same file
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left


def test_roofline_from_a_bench(tiny_model, tmp_path):
    cfg = BenchConfig(
        models=(str(tiny_model),),
        suite=custom_suite((16, 48), (6,), repeats=1, warmup=0),
        scenarios=(RESIDENT,),
        cap_to_context=False,
        n_threads=1,
        n_ctx=256,
    )
    plans = plan_bench(cfg)
    outcome = run_bench(cfg, plans, load_fn=load)
    results = scenario_results(outcome)
    assert roofline_from_bench(results, plans) is None  # a bare engine has no predictor: no bytes to place points
    plans[0].predictor = BytesPredictor()
    roof = roofline_from_bench(results, plans)
    assert roof.bandwidth_gbs == 10.0
    assert [p.bytes_per_token for p in roof.points] == [1_000_000 + 1_000 * 19, 1_000_000 + 1_000 * 51]
    assert all(p.measured_tok_s > 0 for p in roof.points) and [p.label.split(", ")[-1] for p in roof.points] == [
        "ctx 19",
        "ctx 51",
    ]
    itls = itl_series(results)
    assert len(itls) == 2 and all(len(v) == 5 for v in itls.values())
    if pytest.importorskip("matplotlib"):
        assert "ctx 51" in write_plot(tmp_path / "b.svg", roof, itls).read_text()


def test_missing_extra_with_batch_is_one_line_exit_2_before_the_model_loads(
    no_matplotlib, tiny_model, tmp_path, capsys
):
    out = tmp_path / "sweep.svg"
    rc = main(["bench", str(tiny_model), "--batch", "1,2", "-p", "8", "-n", "4", "--plot", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "ondevice[plot]" in err[0], err
    assert list(tmp_path.iterdir()) == []


def test_a_batch_sweep_draws_its_curve(tiny_model, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out = tmp_path / "sweep.svg"
    argv = ["bench", str(tiny_model), "--batch", "1,2,4", "-p", "8", "-n", "6", "-r", "1", "--warmup", "0"]
    rc = main([*argv, "--n-ctx", "1024", "--threads", "1", "--no-progress", "--plot", str(out)])
    err = capsys.readouterr().err
    assert rc == 0, err
    text = out.read_text()
    assert "batch sweep: " in text and "measured: all sequences" in text and "measured: per sequence" in text
    assert "sequences per decode step (B)" in text


def test_the_batch_curve_takes_each_levels_figures():
    from types import SimpleNamespace

    from ondevice.bench.plot import BatchPoint, batch_curve_from_sweep

    level = lambda b, tok_s: SimpleNamespace(  # noqa: E731 - a SweepResult level's fields the curve reads
        n_seqs=b,
        decode_tok_s=tok_s,
        seq_decode_tok_s=tok_s / b,
        predicted_decode_tok_s=1.1 * tok_s,
        ceiling_decode_tok_s=500.0 * b,
    )
    curve = batch_curve_from_sweep(SimpleNamespace(levels=(level(1, 50.0), level(4, 120.0)), knee=4), "m, 8 + 6")
    assert curve.knee == 4 and curve.label == "m, 8 + 6"
    assert curve.points[1] == BatchPoint(4, 120.0, 30.0, pytest.approx(132.0), 2000.0)
