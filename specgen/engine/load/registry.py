"""Model aliases (models.toml) and model loading through mlx-lm's loader."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable

from specgen.draft.traces import load_tokenizer
from specgen.errors import ConfigError, InputError, ModelError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BUNDLED_PREFIX = "bundled:"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_CONTEXT_KEYS = ("max_position_embeddings", "n_ctx", "max_seq_len", "seq_length")


@dataclass(frozen=True)
class ModelSpec:
    """What `-m` resolved to: a repo id or local folder, plus how to run it well."""

    name: str
    source: str
    description: str = ""
    stop_tokens: tuple = ()
    chat_template: bool = True
    context_length: int | None = None


@dataclass
class LoadedModel:
    """A loaded model with its mlx-lm tokenizer wrapper and what generation needs to know."""

    spec: ModelSpec
    model: object
    tokenizer: object
    context_length: int | None
    stop_ids: frozenset = field(default_factory=frozenset)
    key: str = ""  # what identifies the weights (model_key)
    warnings: list[str] = field(default_factory=list)  # things the user set that will not hold
    sharding: str = "none"  # how the model is split over an mlx.launch group
    dtype: str | None = None  # what the weights were converted to (--dtype), if anything
    config: dict = field(default_factory=dict, repr=False)  # the model's config.json

    @property
    def calibration_key(self) -> str:
        """What its verify cost depends on besides the machine: the weights and their dtype (a
        4-bit model dequantized to float32 runs other kernels at another speed)."""
        return self.key + (f"|{self.dtype}" if self.dtype else "")


def packaged_models_file() -> Path:
    """The models.toml that ships with specgen (package data in a wheel, the repo root in a checkout)."""
    packaged = Path(str(resources.files("specgen"))) / "models.toml"
    return packaged if packaged.is_file() else Path(__file__).resolve().parents[3] / "models.toml"


def bundled_path(name: str) -> Path:
    """The folder of a model shipped inside the package."""
    return Path(str(resources.files("specgen"))) / "bundled" / name


def local_source(source: str) -> str:
    """A spec's source with `bundled:NAME` turned into the packaged folder; others unchanged."""
    if source.startswith(BUNDLED_PREFIX):
        return str(bundled_path(source[len(BUNDLED_PREFIX):]))
    return source


def served_name(model: str) -> str:
    """What a server calls `model` (its /v1/models id): an alias or repo id as given, a local
    folder by its own name (never the machine's path to it)."""
    path = Path(model).expanduser()
    return path.resolve().name if path.is_dir() else model


def read_models_file(path: Path) -> dict[str, ModelSpec]:
    """Parse one models.toml into aliases; a malformed file raises ConfigError naming the problem."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from e
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path} is not valid TOML: {e}") from e
    aliases = {}
    for name, entry in data.items():
        where = f"{path}: alias '{name}'"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a table ([{name}])")
        unknown = set(entry) - {"model", "description", "stop_tokens", "chat_template", "context_length"}
        if unknown:
            raise ConfigError(f"{where} has unknown key(s): {', '.join(sorted(unknown))}")
        source = entry.get("model")
        if not isinstance(source, str) or not source:
            raise ConfigError(f"{where} needs model = \"<repo id or folder>\"")
        stops = entry.get("stop_tokens", [])
        if not isinstance(stops, list) or not all(isinstance(s, (str, int)) for s in stops):
            raise ConfigError(f"{where}: stop_tokens must be a list of token strings or ids")
        template = entry.get("chat_template", True)
        if not isinstance(template, bool):
            raise ConfigError(f"{where}: chat_template must be true or false")
        ctx = entry.get("context_length")
        if ctx is not None and (not isinstance(ctx, int) or isinstance(ctx, bool) or ctx < 2):
            raise ConfigError(f"{where}: context_length must be an integer >= 2")
        if source.startswith(("./", "../", "~")):
            source = str((path.parent / Path(source).expanduser()).resolve())
        aliases[name] = ModelSpec(name, source, str(entry.get("description", "")),
                                  tuple(stops), template, ctx)
    return aliases


def user_models_file() -> Path:
    """The user's own models.toml, in specgen's config directory."""
    import click

    return Path(click.get_app_dir("specgen")) / "models.toml"


def load_registry(user_file: Path | None = None) -> dict[str, ModelSpec]:
    """The packaged aliases, overridden and extended by the user's models.toml if it exists."""
    aliases = read_models_file(packaged_models_file())
    if user_file is not None and user_file.exists():
        aliases.update(read_models_file(user_file))
    return aliases


def resolve(name: str, aliases: dict[str, ModelSpec]) -> ModelSpec:
    """Turn `-m NAME` into a ModelSpec: an alias, an existing folder, or a Hugging Face repo id."""
    if name in aliases:
        return aliases[name]
    if Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        return ModelSpec(name, str(Path(name).expanduser()) if name.startswith("~") else name)
    if _REPO_ID.match(name):
        return ModelSpec(name, name)
    raise ModelError(f"unknown model alias '{name}' (known: {', '.join(sorted(aliases))})")


def _context_length(config: dict) -> int | None:
    for cfg in (config, config.get("text_config") or {}):
        for key in _CONTEXT_KEYS:
            if isinstance(cfg.get(key), int):
                return cfg[key]
    return None


def _stop_id(tokenizer, stop) -> int | None:
    """The id of a stop token given as a string or an id, or None if the vocabulary lacks it."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    if isinstance(stop, int):
        return stop if 0 <= stop < max(len(vocab), getattr(tokenizer, "vocab_size", 0) or 0) else None
    return vocab.get(stop)


_PROBE = 1 << 16  # bytes read from each end of a weights file to tell one model from another


def model_key(spec: ModelSpec) -> str:
    """What identifies a model's weights, for its memory and calibration: the repo id, the
    bundled name, or for a local folder a hash of its config and weights files (their names,
    sizes and both ends), so that a moved or copied folder keeps its memory and two folders
    never share one."""
    if spec.source.startswith(BUNDLED_PREFIX):
        return spec.source  # the same everywhere the package is installed
    local = Path(local_source(spec.source))
    if not local.exists() and _REPO_ID.match(spec.source):
        return spec.source
    digest = hashlib.sha256()
    try:
        digest.update((local / "config.json").read_bytes())
        for weights in sorted(local.glob("*.safetensors")):
            size = weights.stat().st_size
            digest.update(f"{weights.name}:{size}".encode())
            with open(weights, "rb") as f:
                digest.update(f.read(_PROBE))
                f.seek(max(size - _PROBE, 0))
                digest.update(f.read(_PROBE))
    except OSError as e:
        raise ModelError(f"cannot read the model folder {local}: {e.strerror or e}") from e
    return f"folder:{digest.hexdigest()[:16]}"


def _read_config(local: Path) -> dict:
    try:
        config = json.loads((local / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"{local / 'config.json'} is not a readable JSON model config ({e})") from e
    if not isinstance(config, dict):
        raise ModelError(f"{local / 'config.json'} is not a JSON object")
    return config


def to_dtype(model, dtype: str):
    """The model with its weights in `dtype`, dequantized first if they are quantized (on a CPU
    without a batched quantized matmul, float32 weights are the memory-bound case Macs have)."""
    import mlx.core as mx
    from mlx_lm.utils import dequantize_model

    model = dequantize_model(model)
    model.set_dtype(getattr(mx, dtype))
    mx.eval(model.parameters())
    return model


def load(spec: ModelSpec, *, dtype: str | None = None, world=None) -> LoadedModel:
    """Load a model and tokenizer with mlx_lm.load (or, in an mlx.launch group `world`, sharded
    over it: distributed.load_sharded), turning every failure into a one-line ModelError;
    `dtype` converts (and dequantizes) the weights."""
    import mlx_lm  # deferred: importing mlx-lm costs a second that `specgen models` need not pay

    source = local_source(spec.source)
    local = Path(source)
    is_repo = not local.exists() and _REPO_ID.match(source) is not None
    if not is_repo:
        if not local.exists():
            raise ModelError(f"no such model folder: {source}")
        if not (local / "config.json").is_file():
            raise ModelError(f"{source} is not a model folder (no config.json in it)")
        _read_config(local)
    sharding = "none"
    try:
        if world is not None:
            from specgen.engine.load.distributed import load_sharded

            model, tokenizer, config, sharding = load_sharded(source, spec.name, world)
        else:
            model, tokenizer, config = mlx_lm.load(source, return_config=True)
    except ModelError:
        raise
    except Exception as e:  # mlx-lm and huggingface_hub raise many types; each becomes one line
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if is_repo and type(e).__module__.startswith("huggingface_hub"):
            raise ModelError(f"cannot download '{source}' from Hugging Face (offline?): {reason}") from e
        raise ModelError(f"cannot load model '{spec.name}': {reason}") from e
    if dtype is not None:
        model = to_dtype(model, dtype)
    warnings = []
    stop_ids = set(tokenizer.eos_token_ids)
    for stop in spec.stop_tokens:
        found = _stop_id(tokenizer, stop)
        if found is None:
            warnings.append(f"stop token {stop!r} of '{spec.name}' is not in the model's vocabulary: "
                            "generation will not stop at it")
        else:
            stop_ids.add(found)
    return LoadedModel(spec, model, tokenizer, spec.context_length or _context_length(config),
                       frozenset(stop_ids), model_key(spec), warnings, sharding, dtype, config)


def wrap(model, tokenizer) -> LoadedModel:
    """A model and tokenizer loaded elsewhere (mlx_lm.load) as a LoadedModel: the tokenizer's
    EOS tokens stop it, as in mlx-lm; its weights' shapes and dtype key its calibration."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    if not isinstance(tokenizer, TokenizerWrapper):
        tokenizer = TokenizerWrapper(tokenizer)
    params = tree_flatten(model.parameters())
    size = sum(v.size for _, v in params)
    dtype = params[0][1].dtype if params else mx.float32
    key = f"module:{type(model).__module__}:{size}:{dtype}"
    args = getattr(model, "args", None)
    config = vars(args) if args is not None and hasattr(args, "__dict__") else {}
    return LoadedModel(ModelSpec(type(model).__module__.rsplit(".", 1)[-1], ""), model, tokenizer,
                       _context_length(config), frozenset(tokenizer.eos_token_ids), key, config=config)


def tokenizer_for(spec: str) -> Callable[[str], list[int]]:
    """An encoder (text -> ids) from a tokenizer file or folder, or a known alias's local folder."""
    if not Path(spec).expanduser().exists():
        try:
            model = resolve(spec, load_registry())
        except Exception as e:
            raise InputError(f"no tokenizer at {spec}: not a file, folder or known alias") from e
        spec = local_source(model.source)
        if not Path(spec).exists():
            raise InputError(f"simulate needs a local tokenizer; the model is not downloaded ({spec})")
    return load_tokenizer(spec)
