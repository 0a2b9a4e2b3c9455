"""The timed engine: load a GGUF, stream timed tokens, chat with prefix reuse.

eng = load()                                    # the default model
g = eng.generate("The capital of France is", max_tokens=32, temperature=0)
for ev in eng.stream("Tell me a story"): ...    # TokenEvent(index, token_id, text, t_s, ...)
chat = eng.chat(system="You are terse."); chat.send("Hi")
bg = eng.batched(4, 512).generate(["Once upon", "The sea"], 64)   # BatchGeneration: one decode step for all
"""

from ondevice.engine.batch import BatchContext, BatchGeneration
from ondevice.engine.chat import Chat
from ondevice.engine.engine import Engine
from ondevice.engine.loader import EngineInfo
from ondevice.engine.loop import TokenStream
from ondevice.engine.opening import load

__all__ = ["load", "Engine", "Chat", "TokenStream", "EngineInfo", "BatchContext", "BatchGeneration"]
