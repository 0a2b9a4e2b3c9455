"""GGUF files: the reader, its bounded cursor, the model spec read from a header, load checks."""
