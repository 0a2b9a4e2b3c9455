"""`ondevice bench --url`: the bench's metrics against OpenAI-compatible servers.

The product does not serve; it measures servers (llama-server, vLLM, Ollama, LM Studio,
llama-cpp-python's) with the metric definitions of docs/metrics.md, seen from the client.

Modules: sse (events -> chunk deltas), client (one streamed request, timestamped chunks),
measure (a stream -> a RunRecord: token counts, ITL conventions, first visible token),
load (closed and open loop, Little's law, goodput), runner (levels, prompts, the interleaved
in-process side), report (the load table and record facts). llama-cpp-python's server starts
through ondevice.llama.server, which applies the crash guard. Statistics, SLOs, files and
compare are the local bench's own.
"""
