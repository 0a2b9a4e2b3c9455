"""Core: errors, paths, results, metrics, formatting and other leaf helpers every layer uses."""
