"""`specgen serve`: an HTTP server over one engine, speculating as `run` does, for OpenAI's chat and
text completions, Anthropic's Messages (Claude Code) and OpenAI's Responses (Codex).

FastAPI + uvicorn (the `serve` extra). The HTTP shell: app.py (the routes), config.py (the
settings), limits.py (the body-size limit), protocol.py (the HTTP protocol and its limit on a
request's head). What every API shares: schema.py (request checks, errors) and prompting.py
(requests to token ids, output text to message parts). apis/: each API's request, response and
stream shapes. generation/: the one generation thread and its queue (worker.py one at a time,
batch_worker.py decoding up to --max-batch requests together where the model's caches batch),
turn.py the one path from ids to an answer, cache.py what is kept across requests. Generation
itself is the engine's: one way through.
"""

from __future__ import annotations

from specgen.errors import SpecgenError
from specgen.serve.config import ServeConfig

GRACE_S = 5.0  # after Ctrl-C / SIGTERM, how long open responses get to end (their jobs are cancelled)


def require_extra() -> None:
    """A one-line error naming the extra when FastAPI or uvicorn is missing."""
    try:
        import fastapi  # noqa: F401
        import prometheus_client  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as e:
        raise SpecgenError(f"specgen serve needs the 'serve' extra ({e.name} is missing): "
                           "pip install 'specgen[serve]'") from None


def make_server(engine, config: ServeConfig, host: str, port: int, *, log_level: str = "info", load=None):
    """A uvicorn server for `engine` (not started): `.run()` serves until Ctrl-C / SIGTERM, after
    which running and waiting requests are cancelled, the workers stop and the memory is saved.
    `load(spec)` loads the other models of `config.others` when first asked for."""
    require_extra()
    import uvicorn

    from specgen.serve.app import create_app, error_body
    from specgen.serve.protocol import protocol

    app = create_app(engine, config, load)

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            app.state.models.stop_soon()  # streams end now rather than at the grace period's end
            super().handle_exit(sig, frame)

    return Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                                 timeout_graceful_shutdown=GRACE_S, lifespan="on",
                                 http=protocol(config.max_head_bytes, error_body)))


__all__ = ["ServeConfig", "make_server", "require_extra"]
