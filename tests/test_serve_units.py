"""bench --url, the pure parts: SSE parsing, client-side timing identities, reasoning markers,
Poisson arrivals, Little's law and goodput."""

from __future__ import annotations

import json
import math

import pytest

from ondevice.bench.runs import RunRecord
from ondevice.bench.serve.client import Chunk, StreamLog, Target, parse_base_url
from ondevice.bench.serve.load import closed_loop, level_stats, open_loop, poisson_arrivals
from ondevice.bench.serve.measure import RequestSpec, count_output, shares, to_record, token_marks
from ondevice.bench.serve.sse import Event, StreamError, iter_events, parse_chunk
from ondevice.bench.slo import evaluate, parse_slo
from ondevice.core.errors import BenchError
from ondevice.core.reasoning import DEFAULT_MARKERS, ThinkMarkers, detect_markers, first_visible, opens_block
from ondevice.core.results import Timings

MS = 1_000_000


def _lines(text: bytes):
    parts = text.splitlines(keepends=True)
    return lambda: parts.pop(0) if parts else b""


def _events(text: bytes) -> list[Event]:
    clock = iter(range(1, 1000))
    return list(iter_events(_lines(text), lambda: next(clock)))


# ---- SSE ------------------------------------------------------------------------------------
def test_sse_events_comments_multiline_and_crlf():
    evs = _events(b': ping\r\n\r\ndata: {"a":\r\ndata: 1}\r\n\r\nevent: error\ndata:x\n\nid: 3\ndata: [DONE]')
    assert [(e.type, e.data) for e in evs] == [("message", '{"a":\n1}'), ("error", "x"), ("message", "[DONE]")]
    assert evs[0].t_ns < evs[1].t_ns  # stamped at the first data line of each event


def test_sse_rejects_a_line_that_is_no_field():
    with pytest.raises(StreamError, match="not an SSE line"):
        _events(b"<html>\n\n")


def _chunk(obj) -> Event:
    return Event(1, "message", json.dumps(obj))


def test_parse_chunk_completion_chat_reasoning_usage_timings():
    d = parse_chunk(_chunk({"choices": [{"text": " a b", "finish_reason": None}]}))
    assert d.text == " a b" and d.reasoning == "" and d.finish_reason is None
    d = parse_chunk(_chunk({"choices": [{"delta": {"content": None, "reasoning_content": "hmm"}}]}))
    assert d.text == "" and d.reasoning == "hmm"
    assert parse_chunk(_chunk({"choices": [{"delta": {"reasoning": "r"}}]})).reasoning == "r"
    d = parse_chunk(_chunk({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}))
    assert d.usage["completion_tokens"] == 9 and d.text == ""
    d = parse_chunk(
        _chunk(
            {
                "choices": [{"text": "", "finish_reason": "length"}],
                "timings": {"prompt_n": 4, "prompt_ms": 8.0, "predicted_n": 9, "predicted_ms": 90.0},
            }
        )
    )
    assert d.finish_reason == "length"
    assert d.timings == {
        "source": "llama-server timings",
        "output_tokens": 9,
        "decode_s": 0.09,
        "prompt_tokens": 4,
        "prompt_s": 0.008,
    }
    d = parse_chunk(_chunk({"choices": [], "eval_count": 5, "eval_duration": 5e8, "prompt_eval_count": 2}))
    assert d.timings["source"] == "ollama eval counts" and d.timings["decode_s"] == pytest.approx(0.5)
    assert parse_chunk(Event(1, "message", "[DONE]")).done


@pytest.mark.parametrize(
    "data, kind",
    [
        ('{"error": {"message": "boom"}}', "server_error"),
        ("{not json", "malformed"),
        ('{"hello": 1}', "not_openai"),
        ("[1, 2]", "not_openai"),
    ],
)
def test_parse_chunk_errors(data, kind):
    with pytest.raises(StreamError) as e:
        parse_chunk(Event(1, "message", data))
    assert e.value.kind == kind
    with pytest.raises(StreamError):
        parse_chunk(Event(1, "error", '{"message": "x"}'))


def test_base_url_parsing():
    assert parse_base_url("http://127.0.0.1:8000/v1") == ("http", "127.0.0.1", 8000, "/v1")
    assert parse_base_url("https://h/v1/chat/completions") == ("https", "h", 443, "/v1")
    for bad in ("127.0.0.1:8000", "ftp://h/v1", "http://h:99999/v1", "http://h/v1?x=1", "http:///v1"):
        with pytest.raises(BenchError):
            parse_base_url(bad)
    t = Target("http://[::1]:8000/v1", api_key="sekrit", chat=True)
    assert t.endpoint == "http://[::1]:8000/v1/chat/completions" and "sekrit" not in repr(t)
    assert t.scrub("bad key Bearer sekrit") == "bad key Bearer ***"
    with pytest.raises(BenchError):
        Target("http://h/v1", timeout_s=0)


# ---- timing -----------------------------------------------------------------------------------
def test_shares_and_marks():
    assert shares(6, [1, 1, 1]) == [2, 2, 2]
    assert shares(7, [3, 1]) == [5, 2] and sum(shares(10, [5, 0, 1])) == 10 and min(shares(10, [5, 0, 1])) >= 1
    assert shares(2, [1, 1, 1]) == [1, 1, 0]
    assert token_marks([100, 200, 400], [2, 1, 2]) == [100, 100, 200, 300, 400]


def _log(chunks, **kw) -> StreamLog:
    lg = StreamLog(
        start_ns=0, end_ns=chunks[-1][0] + 5 * MS if chunks else 1, chunks=[Chunk(t, s, r) for t, s, r in chunks]
    )
    lg.finish_reason = kw.pop("finish", "length")
    for k, v in kw.items():
        setattr(lg, k, v)
    return lg


SPEC = RequestSpec("m", "closed_c1", "w", 0, 16, 6, 0)


def test_timing_identities_with_several_tokens_per_chunk():
    lg = _log([(100 * MS, " a b", ""), (130 * MS, " c d e", ""), (160 * MS, " f", "")], usage={"completion_tokens": 6})
    r = to_record(lg, SPEC, counter=None, markers=DEFAULT_MARKERS, level_start_ns=0)
    t = r.timings
    assert r.ok and r.serve["token_count"] == "usage" and t.output_tokens == 6
    assert t.ttft_s == pytest.approx(0.100) and t.e2e_s == pytest.approx(0.160)
    assert len(t.itl_s) == 5 and math.fsum(t.itl_s) == pytest.approx(t.e2e_s - t.ttft_s)
    assert t.tpot_s == pytest.approx(math.fsum(t.itl_s) / 5) == pytest.approx(0.012)
    assert r.serve["itl_chunk_s"] == pytest.approx([0.030, 0.030])
    assert sum(r.serve["tokens_per_chunk"]) == 6 and r.serve["tokens_per_chunk"][0] >= 1
    assert t.ttft_visible_s == t.ttft_s and t.output_throughput_tok_s == pytest.approx(6 / 0.160)
    assert r.serve["sent_s"] == 0 and r.serve["done_s"] == pytest.approx(0.165)


def test_token_count_sources():
    lg = _log([(MS, "hello world", ""), (2 * MS, " again", "")])
    assert count_output(lg, None) == (2, "estimated (1 token per chunk)")
    assert count_output(lg, lambda s: len(s.split())) == (3, "tokenizer")
    lg.server_timings = {"source": "llama-server timings", "output_tokens": 4}
    assert count_output(lg, None) == (4, "llama-server timings")
    lg.usage = {"completion_tokens": 5}
    assert count_output(lg, None) == (5, "usage")


def test_server_prompt_time_fills_prefill():
    lg = _log(
        [(50 * MS, " a", ""), (60 * MS, " b", "")],
        server_timings={"source": "llama-server timings", "output_tokens": 2, "prompt_tokens": 40, "prompt_s": 0.04},
    )
    t = to_record(lg, SPEC, counter=None, markers=None, level_start_ns=0).timings
    assert t.prefill_s == pytest.approx(0.04) and t.prefill_tok_s == pytest.approx(1000) and t.tokenize_s == 0


def test_failed_stream_keeps_what_arrived_and_short_output_is_noted():
    lg = _log([(MS, " a", "")], status="failed", reason="server error: boom")
    r = to_record(lg, SPEC, counter=None, markers=None, level_start_ns=0)
    assert r.status == "failed" and r.reason == "server error: boom" and r.timings.output_tokens == 1
    r = to_record(
        _log([(MS, " a", "")], finish="stop", usage={"completion_tokens": 1}),
        SPEC,
        counter=None,
        markers=None,
        level_start_ns=0,
    )
    assert r.ok and "stopped after 1 of 6 tokens" in r.notes[0]
    r = to_record(_log([], finish="length"), SPEC, counter=None, markers=None, level_start_ns=0)
    assert r.status == "failed" and r.timings is None


# ---- reasoning ----------------------------------------------------------------------------------
def test_first_visible():
    m = DEFAULT_MARKERS
    assert first_visible(["<think>", "hm", "</think>", "\n\n", "Paris"], m) == 4
    assert first_visible(["hm", " ok</think>", "\n", "Paris"], m) == 3  # the template opened the block
    assert first_visible(["hm", " ok"], ThinkMarkers("<think>", "</think>", starts_open=True)) is None
    assert first_visible(["<think>", "still going"], m) is None
    assert first_visible(["  ", "Hello", "<think>x</think>"], m) == 1
    assert first_visible(["Hi"], None) == 0 and first_visible(["", " \n"], None) is None
    assert first_visible(["<thi"], m) is None  # a marker cut at the end is not text


def test_detect_markers_and_opening_templates():
    qwen_like = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.split('</think>')[-1] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
    )
    m = detect_markers(qwen_like)
    assert m == DEFAULT_MARKERS
    assert opens_block("<|im_start|>assistant\n<think>\n", m)
    assert not opens_block("<|im_start|>assistant\n<think>\n\n</think>\n\n", m)
    assert not opens_block("<|im_start|>assistant\n", m)
    assert detect_markers("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert detect_markers("<|begin_of_thought|> ... <|end_of_thought|>").close == "<|end_of_thought|>"
    assert detect_markers(None) is None


def test_reasoning_chunks_are_output_but_not_visible():
    lg = _log([(10 * MS, "", "Let me"), (20 * MS, "", " think."), (30 * MS, "\n\n", ""), (40 * MS, "Paris", "")])
    r = to_record(lg, SPEC, counter=None, markers=DEFAULT_MARKERS, level_start_ns=0)
    assert r.timings.ttft_s == pytest.approx(0.010) and r.timings.ttft_visible_s == pytest.approx(0.040)
    assert r.serve["reasoning_chunks"] == 2


# ---- load ------------------------------------------------------------------------------------------
def test_poisson_arrivals_rate_within_tolerance():
    for rate in (0.5, 2.0, 10.0):
        ts = poisson_arrivals(rate, 2001, seed=3)
        assert ts[0] == 0 and all(b >= a for a, b in zip(ts, ts[1:]))
        assert 2000 / ts[-1] == pytest.approx(rate, rel=0.08)
        gaps = [b - a for a, b in zip(ts, ts[1:])]
        cv = math.sqrt(sum((g - ts[-1] / 2000) ** 2 for g in gaps) / 2000) / (ts[-1] / 2000)
        assert cv == pytest.approx(1.0, abs=0.1)  # exponential gaps: standard deviation = mean
    assert poisson_arrivals(1.0, 5, seed=1) == poisson_arrivals(1.0, 5, seed=1) != poisson_arrivals(1.0, 5, seed=2)
    with pytest.raises(ValueError):
        poisson_arrivals(0, 3)


def _run(i, sent, done, e2e, status="ok", n=4) -> RunRecord:
    t = Timings(0.0, 0.0, e2e / 2, tuple([e2e / 2 / (n - 1)] * (n - 1)), e2e, 0, n)
    return RunRecord("m", "open_r1", "w", i, status, timings=t, serve={"sent_s": sent, "done_s": done})


def test_littles_law_and_goodput():
    # four requests over a 10 s window, 2 s each: L = 8/10, λ = 0.4/s, W = 2 s -> λW = 0.8
    runs = [_run(i, s, s + 2.0, 2.0) for i, s in enumerate((0.0, 2.5, 5.0, 8.0))]
    st = level_stats(runs, mode="open", offered=0.5, requests=4, good=3)
    assert st.window_s == pytest.approx(10.0) and st.achieved_rps == pytest.approx(0.4)
    assert (
        st.mean_in_flight == pytest.approx(0.8)
        and st.little_lw == pytest.approx(0.8)
        and st.little_ratio == pytest.approx(1.0)
    )
    assert st.goodput_rps == pytest.approx(0.3) and st.output_tok_s == pytest.approx(1.6)
    assert st.arrival_rps == pytest.approx(3 / 8.0)
    # a stream held open 1 s after its last token: L exceeds λW by that much
    st = level_stats([_run(0, 0.0, 3.0, 2.0)], mode="closed", offered=1, requests=1)
    assert st.mean_in_flight == pytest.approx(1.0) and st.little_lw == pytest.approx(2 / 3)
    assert st.goodput_rps is None and st.arrival_rps is None


def test_goodput_counts_failures_as_misses():
    runs = [_run(0, 0, 1, 1.0), _run(1, 0, 3, 3.0), _run(2, 0, 1, 0.5, status="failed")]
    s = evaluate(runs, parse_slo("e2e_p95=2"))
    assert s is not None and s.requests == 3 and s.good == 1
    # overlapping server requests: the window from the first send to the last end (3 s), as LevelStats
    assert s.time_s == pytest.approx(3.0) and s.goodput_rps == pytest.approx(1 / 3)
    assert level_stats(runs, mode="closed", offered=3, requests=3, good=s.good).goodput_rps == pytest.approx(
        s.goodput_rps
    )
    assert parse_slo("ttft_visible_p95=1")[0].metric == "ttft_visible"


def test_closed_and_open_loop_bounds():
    import threading

    live, peak, lock = [0], [0], threading.Lock()
    three_live = threading.Event()  # the first sends wait until three run at once, however slow threads start

    def send(i):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
            if live[0] == 3:
                three_live.set()
        three_live.wait(30)
        with lock:
            live[0] -= 1
        return i

    assert closed_loop(send, 7, 3, 30) == list(range(7)) and peak[0] == 3
    assert closed_loop(send, 3, 2, 0) == [None, None, None]  # no budget: nothing sent
    out = open_loop(send, [0.0, 0.01, 0.02, 5.0], budget_s=1.0)
    assert out == [0, 1, 2, None]  # the last arrival is past the budget: not sent
    with pytest.raises(ValueError):
        closed_loop(send, 1, 0, 1)


def test_ctrl_c_keeps_what_finished():
    import _thread
    import threading

    from ondevice.bench.serve.load import LoadInterrupted

    stop = threading.Event()

    def send(i):
        if i == 2:
            _thread.interrupt_main()  # Ctrl-C while request 2 is in flight
            stop.wait(30)  # request 2 ends only once the main thread has taken the Ctrl-C (30 s: a hang guard)
        return i

    with pytest.raises(LoadInterrupted) as e:
        closed_loop(send, 6, 1, 30, stop=stop)
    assert stop.is_set()
    assert e.value.results[:2] == [0, 1] and e.value.results[3:] == [None, None, None]
