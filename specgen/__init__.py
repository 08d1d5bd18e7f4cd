"""specgen: faster local LLM generation on MLX with model-free (n-gram) speculative decoding.

`specgen.load`, `specgen.generate`, `specgen.stream_generate` and `specgen.batch_generate` mirror
mlx-lm's, and `specgen.Conversation` keeps a conversation's cache between turns (specgen/api/);
they are imported on first use, so that `import specgen` and the command line start without MLX.

Subpackages by concept, layers by role; a module imports its own layer or a lower one
(tests/test_layout.py checks it; docs/architecture.md maps it):
    cli, serve (front ends)  >  api  >  engine  >  draft, structured (model-free, no mlx)
and every layer may import the base modules here: defaults, errors, settings, events, stats, store.
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
