"""Multi-turn chat: the model's own chat template, or a plain transcript, and KV prefix reuse.

Rendering: a GGUF with `tokenizer.chat_template` is rendered through llama-cpp-python's
Jinja formatter (`Jinja2ChatFormatter`); its end-of-turn tokens stop the reply. A model
without a template (the default model is a base model) gets the documented fallback,
a plain transcript that base models continue well:

    {system}                      (only when there is a system message, then a blank line)
    User: {user text}
    Assistant: {reply}
    User: {user text}
    Assistant:

with "\\nUser:" and "\\nAssistant:" as stop strings (a base model that goes on to write the
next turn itself is cut there). A reply is stored without the one space the model
writes after "Assistant:", so the next turn's transcript reproduces the generated text
exactly and the whole previous conversation is served from the KV cache: every turn
re-renders the conversation, and the engine keeps the longest common prefix with what
its cache holds, prefilling only the new tokens.

Reasoning models: a template that names think markers (ondevice.core.reasoning) makes every reply's
timings carry ttft_visible_s, the time to the first token of visible text after the reasoning
block; whether the generation prompt itself opens the block is read from a rendered prompt.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from time import perf_counter_ns
from typing import Any, Unpack

from ondevice.core.errors import InvalidParameterError
from ondevice.core.reasoning import ThinkMarkers, detect_markers, opens_block
from ondevice.core.results import Generation
from ondevice.engine.loop import TokenStream
from ondevice.engine.sampling import SAMPLING_KEYS, SamplingArgs, make_params

__all__ = ["Chat", "ChatArgs", "ChatTemplate", "FALLBACK_STOPS", "render_plain", "SPEC_KEYS"]

SPEC_KEYS = frozenset({"speculative", "draft", "spec_k", "exact"})  # Engine.stream's speculative decoding arguments

FALLBACK_STOPS = ("\nUser:", "\nAssistant:")  # the fallback transcript's stop strings: a new turn
_ROLES = ("system", "user", "assistant")
_log = logging.getLogger(__name__)


def render_plain(messages: list[dict[str, str]]) -> str:
    """The fallback transcript, ending with the generation prompt "Assistant:"."""
    parts = []
    for m in messages:
        role, content = m["role"], m["content"]
        if role == "system":
            parts.append(f"{content}\n\n")
        elif role == "user":
            parts.append(f"User: {content}\n")
        else:
            parts.append(f"Assistant: {content}\n")
    parts.append("Assistant:")
    return "".join(parts)


class ChatArgs(SamplingArgs, total=False):
    """Chat.stream's keywords: the sampling settings plus cancellation and speculation."""

    cancel: threading.Event | None
    speculative: str | None
    draft: str | Path | None
    spec_k: int | None
    exact: bool | None


class ChatTemplate:
    """How one engine turns messages into prompt tokens (built once per engine)."""

    def __init__(self, engine: Any):
        self._engine = engine
        self._jinja: Any = None
        self._bos_text = ""
        self.source = "fallback"  # "model": the GGUF's own template; "fallback": the plain transcript
        self.think: tuple[ThinkMarkers, dict[int, str]] | None = None  # reasoning markers, and those that are one token
        h = engine._h
        raw = h.lib.llama_model_chat_template(h.model, None)
        if raw:
            self._init_jinja(raw.decode("utf-8", "replace"))

    def _init_jinja(self, template: str) -> None:
        from ondevice.llama.model import chat_formatter

        lib, vocab = self._engine._h.lib, self._engine._h.vocab
        bos = self._token_text(lib.llama_vocab_bos(vocab))
        eos = self._token_text(lib.llama_vocab_eos(vocab))
        try:
            fmt = chat_formatter(template, eos_token=eos, bos_token=bos)
            fmt(messages=[{"role": "user", "content": "Hi"}])
        except Exception as exc:  # a template this Jinja cannot run: keep chatting with the fallback
            _log.warning("chat template unusable (%s); using the plain User/Assistant transcript", exc)
            return
        self._jinja, self._bos_text, self.source = fmt, bos, "model"
        self.think = self._think(template)

    def _think(self, template: str) -> tuple[ThinkMarkers, dict[int, str]] | None:
        markers = detect_markers(template)
        if markers is None:
            return None
        try:
            prompt = self.render([{"role": "user", "content": "Hi"}])
        except InvalidParameterError:
            prompt = ""
        if opens_block(prompt, markers):
            markers = ThinkMarkers(markers.open, markers.close, starts_open=True)
        by_id = {}
        for text in (markers.open, markers.close):
            ids = self._engine.tokenize(text, add_bos=False, special=True)
            if len(ids) == 1:
                by_id[ids[0]] = text
        return markers, by_id

    def _token_text(self, token: int) -> str:
        return self._engine.detokenize([token], special=True) if token >= 0 else ""

    @property
    def stop(self) -> tuple[str, ...]:
        """Stop strings this rendering needs (end-of-turn tokens stop a templated reply by themselves)."""
        return () if self._jinja else FALLBACK_STOPS

    def render(self, messages: list[dict[str, str]]) -> str:
        if self._jinja is None:
            return render_plain(messages)
        try:
            return self._jinja(messages=messages).prompt
        except Exception as exc:
            raise InvalidParameterError(f"the model's chat template refused this conversation: {exc}") from None

    def tokens(self, messages: list[dict[str, str]]) -> list[int]:
        text = self.render(messages)
        if self._jinja is None:
            return self._engine.tokenize(text, add_bos=True, special=False)
        starts_with_bos = bool(self._bos_text) and text.startswith(self._bos_text)
        return self._engine.tokenize(text, add_bos=not starts_with_bos, special=True)

    def stored_reply(self, text: str) -> str:
        """A generated reply as it goes into messages (fallback: without the space after "Assistant:")."""
        return text if self._jinja else text.removeprefix(" ")


class Chat:
    """A conversation on one engine. `messages` holds {"role", "content"} dicts, system first."""

    def __init__(self, engine: Any, system: str | None = None, **sampling_defaults: Any):
        unknown = set(sampling_defaults) - SAMPLING_KEYS - SPEC_KEYS
        if unknown:
            raise InvalidParameterError(f"unknown chat parameter(s): {', '.join(sorted(unknown))}")
        make_params(
            **{k: v for k, v in sampling_defaults.items() if k in SAMPLING_KEYS}
        )  # refuse bad defaults now, by name
        if system is not None and not isinstance(system, str):
            raise InvalidParameterError(f"system must be a string, not {type(system).__name__}")
        self._engine = engine
        self._defaults = dict(sampling_defaults)
        if engine._template is None:
            engine._template = ChatTemplate(engine)
        self._template: ChatTemplate = engine._template
        self.system = system
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []

    @property
    def template_source(self) -> str:
        """ "model" (the GGUF's chat template) or "fallback" (plain User/Assistant transcript)."""
        return self._template.source

    def prompt_tokens(self, text: str | None = None) -> list[int]:
        """The tokens the next turn would prefill for user `text` (None: the conversation so far)."""
        msgs = self.messages + ([{"role": "user", "content": text}] if text is not None else [])
        return self._template.tokens(msgs)

    def stream(self, text: str, **kw: Unpack[ChatArgs]) -> TokenStream:
        """Send a user message; stream the reply. The reply is appended to messages when it ends."""
        if not isinstance(text, str):
            raise InvalidParameterError(f"message text must be a string, not {type(text).__name__}")
        settings: dict[str, Any] = dict(kw)
        cancel = settings.pop("cancel", None)
        unknown = set(settings) - SAMPLING_KEYS - SPEC_KEYS
        if unknown:
            raise InvalidParameterError(f"unknown chat parameter(s): {', '.join(sorted(unknown))}")
        merged = {**self._defaults, **settings}
        spec_kw = {k: merged.pop(k) for k in SPEC_KEYS if k in merged}
        params = make_params(**merged)
        stops = tuple(dict.fromkeys(params.stop + self._template.stop))
        params = make_params(**{**merged, "stop": stops})
        spec = self._engine.speculator(**spec_kw) if spec_kw else None  # set-up work stays out of the timings
        start_ns = perf_counter_ns()
        user = {"role": "user", "content": text}
        ids = self._template.tokens(self.messages + [user])
        tokenized_ns = perf_counter_ns()
        ts = self._engine._start(
            ids,
            start_ns,
            tokenized_ns,
            params,
            cancel,
            True,
            on_done=lambda g: self._finish(user, g),
            think=self._template.think,
            spec=spec,
        )
        self.messages.append(user)
        return ts

    def send(self, text: str, **kw: Unpack[ChatArgs]) -> Generation:
        """Send a user message and return the whole reply."""
        ts = self.stream(text, **kw)
        for _ in ts:
            pass
        assert ts.generation is not None
        return ts.generation

    def _finish(self, user: dict[str, str], generation: Generation | None) -> None:
        if generation is None:  # the request failed: forget the turn
            if self.messages and self.messages[-1] is user:
                self.messages.pop()
            return
        self.messages.append({"role": "assistant", "content": self._template.stored_reply(generation.text)})

    def drop_oldest_turn(self) -> bool:
        """Drop the oldest user message and the reply after it (the system message stays)."""
        for i, m in enumerate(self.messages):
            if m["role"] == "user":
                end = i + 2 if i + 1 < len(self.messages) and self.messages[i + 1]["role"] == "assistant" else i + 1
                del self.messages[i:end]
                return True
        return False

    def reset(self) -> None:
        """Forget the conversation (the system message stays)."""
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
