"""The only code that touches llama_cpp and ctypes: opening models and contexts with the machine's
crash-guard verdict (model, guard, selftest, buffers), the build fingerprint (build) and the log (log).

Nothing here is imported by `import ondevice`; llama.cpp loads on the first model open.
"""
