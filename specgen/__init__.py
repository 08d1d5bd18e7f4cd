"""specgen: faster local LLM generation on MLX with model-free (n-gram) speculative decoding.

`specgen.load`, `specgen.generate` and `specgen.stream_generate` mirror mlx-lm's (see api.py);
they are imported on first use, so that the command line starts without loading MLX.
"""

__version__ = "0.1.0"
_API = ("load", "generate", "stream_generate", "engine_for", "Response", "SpecgenWarning")
__all__ = [*_API, "__version__"]


def __getattr__(name):
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module 'specgen' has no attribute {name!r}")
