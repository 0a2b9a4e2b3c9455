"""Quantization tools: block formats as data, reference quantizers, the synthetic model
builder, quantizing through llama.cpp, and quality comparison between quant levels."""

__all__: list[str] = []
