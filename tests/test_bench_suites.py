"""Suites and exact-length prompts."""

from __future__ import annotations

import pytest

from ondevice.bench.suites import (
    PromptBuilder,
    custom_suite,
    fit_suite,
    get_suite,
    parse_number_list,
    with_counts,
)
from ondevice.core.errors import BenchError


def word_tokenizer(text: str, add_bos: bool) -> list[int]:
    """One id per word (and per punctuation mark), BOS = 1."""
    ids = []
    for w in text.split():
        core = w.rstrip(".?!;")
        ids.append(100 + sum(map(ord, core)) % 1000)
        ids += [7] * (len(w) - len(core))
    return ([1] if add_bos else []) + ids


def test_builtin_suites_follow_design_section_6():
    std = get_suite("standard")
    assert [(w.prompt_tokens, w.output_tokens) for w in std.workloads] == [(256, 128), (8192, 128), (1024, 1024)]
    quick = get_suite("quick")
    assert quick.repeats >= 1 and all(w.prompt_tokens + w.output_tokens <= 512 for w in quick.workloads)


def test_unknown_suite_is_one_clear_error():
    with pytest.raises(BenchError, match="unknown suite 'huge'.*quick, standard"):
        get_suite("huge")


@pytest.mark.parametrize("text,expected", [("256", (256,)), ("256,1024", (256, 1024)), (" 8 , 16 ,", (8, 16))])
def test_parse_number_list(text, expected):
    assert parse_number_list(text, "-p") == expected


@pytest.mark.parametrize("text", ["0", "-5", "abc", "1.5", ","])
def test_parse_number_list_rejects(text):
    with pytest.raises(BenchError, match="-p"):
        parse_number_list(text, "-p")


def test_custom_suite_is_the_cross_product():
    s = custom_suite((64, 128), (8, 16), repeats=2, warmup=0)
    assert [(w.prompt_tokens, w.output_tokens) for w in s.workloads] == [(64, 8), (64, 16), (128, 8), (128, 16)]
    assert s.repeats == 2 and s.warmup == 0 and s.name == "custom"


def test_with_counts_validates():
    s = with_counts(get_suite("quick"), repeats=7, warmup=0)
    assert (s.repeats, s.warmup) == (7, 0)
    with pytest.raises(BenchError, match="--repeat"):
        with_counts(s, repeats=0)
    with pytest.raises(BenchError, match="--warmup"):
        with_counts(s, warmup=-1)


def test_fit_suite_caps_builtin_long_prompts():
    s = fit_suite(get_suite("standard"), 4096, cap=True)
    long = s.workloads[1]
    assert long.prompt_tokens == 4096 - 128 and long.capped_from == 8192
    assert s.workloads[0].capped_from is None and s.workloads[0].prompt_tokens == 256


def test_fit_suite_refuses_custom_beyond_context():
    with pytest.raises(BenchError, match="exceeds the context of 512"):
        fit_suite(custom_suite((500,), (64,)), 512, cap=False)
    w = fit_suite(custom_suite((10,), (600,)), 512, cap=True).workloads[0]  # capping: N alone too long
    assert (w.prompt_tokens, w.output_tokens, w.output_capped_from) == (10, 256, 600)


@pytest.mark.parametrize("n", [1, 2, 17, 256, 3000])
def test_prompt_builder_exact_counts(n):
    ids = PromptBuilder(word_tokenizer, seed=3).ids(n, "short:resident:0")
    assert len(ids) == n and ids[0] == 1


def test_prompt_builder_seeded_and_distinct():
    a = PromptBuilder(word_tokenizer, seed=0)
    assert a.ids(200, "k") == PromptBuilder(word_tokenizer, seed=0).ids(200, "k")
    # different keys or seeds: no shared prefix beyond BOS (first words differ with these keys)
    others = [a.ids(200, "k2"), PromptBuilder(word_tokenizer, seed=1).ids(200, "k")]
    for other in others:
        assert other != a.ids(200, "k")
    no_bos = a.ids(50, "suffix", add_bos=False)
    assert len(no_bos) == 50 and no_bos[0] != 1


def test_prompt_builder_bad_tokenizer():
    with pytest.raises(BenchError, match="too few tokens"):
        PromptBuilder(lambda text, bos: [1], seed=0).ids(10, "k")
    with pytest.raises(BenchError):
        PromptBuilder(word_tokenizer).ids(0, "k")


def test_prompt_builder_on_a_real_tokenizer(tiny_model):
    from ondevice.engine import load

    eng = load(str(tiny_model), n_ctx=512)
    try:
        b = PromptBuilder(lambda t, bos: eng.tokenize(t, add_bos=bos), seed=0)
        for n in (1, 5, 64, 300):
            ids = b.ids(n, f"real:{n}")
            assert len(ids) == n
        g = eng.generate(b.ids(40, "gen"), max_tokens=2, temperature=0)
        assert g.prompt_tokens == 40  # ids go in as they are: exact counts
    finally:
        eng.close()
