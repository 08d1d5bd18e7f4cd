"""The server's settings (`specgen serve`'s flags), each default defined here once, and checked
when made (a key no request could send is refused before a model loads)."""

from __future__ import annotations

from dataclasses import dataclass

from specgen import defaults
from specgen.errors import SettingError, SpecgenError

HOST = "127.0.0.1"  # loopback unless told otherwise
PORT = 8080
MAX_QUEUE = 16  # requests waiting while MAX_BATCH run (one with max_batch 1); more get 429
MAX_BATCH = defaults.MAX_BATCH  # requests decoded together (1: one at a time, as before the batch engine)
PROMPT_CACHE_BYTES = 4 << 30  # model caches kept for later turns (mlx-lm's LRUPromptCache)
MAX_BODY_BYTES = 32 << 20  # a request body over this is a 413 (a 70K-token conversation is ~0.3 MB)
MAX_HEAD_BYTES = 64 << 10  # a request line and headers over this are a 431
MAX_MODELS = 3  # models resident at once (Ollama's default on one GPU); the least recently used idle one unloads
KEEP_ALIVE_S = 300.0  # Ollama's five minutes idle before a model unloads (None: never)


@dataclass(frozen=True)
class ServeConfig:
    """What `specgen serve` was started with (request fields override per request)."""

    model_name: str  # what /v1/models lists and requests name
    model: str | None = None  # how to load it again once unloaded (None: it stays resident)
    others: tuple[tuple[str, str], ...] = ()  # (name, how to load it): loaded when first asked for
    max_models: int = MAX_MODELS
    keep_alive_s: float | None = KEEP_ALIVE_S
    max_tokens: int = defaults.MAX_TOKENS  # for requests that set no max_tokens
    draft: int | None = None  # as `run --draft`: None adaptive, 0 plain decoding
    memory: bool = False  # learn every response into the model's memory, and draft from it
    api_key: str | None = None
    max_queue: int = MAX_QUEUE
    max_batch: int = MAX_BATCH
    prompt_cache_bytes: int = PROMPT_CACHE_BYTES
    max_body_bytes: int = MAX_BODY_BYTES
    max_head_bytes: int = MAX_HEAD_BYTES
    allowed_origins: tuple[str, ...] = ()

    def __post_init__(self):
        if self.max_models < 1:
            raise SettingError("max_models", "must be at least 1", self.max_models)
        if self.keep_alive_s is not None and self.keep_alive_s < 0:
            raise SettingError("keep_alive", "must be at least 0 seconds (or None: never unload)", self.keep_alive_s)
        names = [self.model_name, *(n for n, _ in self.others)]
        if len(set(names)) < len(names):
            raise SettingError("model", f"names the same model twice ({', '.join(names)})")
        key = self.api_key
        # HTTP headers carry ASCII, and their ends' spaces are trimmed: any other key never matches
        if key is not None and not (key and key.isascii() and key.isprintable() and key == key.strip()):
            raise SpecgenError(f"--api-key must be printable ASCII with no space at either end "
                               f"(got {key!r}): no request could send it")
