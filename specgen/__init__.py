"""specgen: faster local LLM generation on MLX with model-free (n-gram) speculative decoding.

`specgen.load`, `specgen.generate` and `specgen.stream_generate` mirror mlx-lm's (specgen/api/);
they are imported on first use, so that `import specgen` and the command line start without MLX.

Subpackages by role; imports run one way (tests/test_layout.py checks it):
    cli, serve  (front ends)  ->  api  ->  engine  ->  draft (model-free, no mlx)
and every layer may import the base modules here: defaults, errors, settings.
"""

__version__ = "0.1.0"
_API = ("load", "generate", "stream_generate", "batch_generate", "engine_for", "Conversation", "Response",
        "SpecgenWarning")
__all__ = [*_API, "__version__"]


def __getattr__(name):
    if name in _API:
        from specgen import api

        return getattr(api, name)
    raise AttributeError(f"module 'specgen' has no attribute {name!r}")
