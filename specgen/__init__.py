"""specgen: faster local LLM generation on MLX with model-free (n-gram) speculative decoding."""

__version__ = "0.1.0"
