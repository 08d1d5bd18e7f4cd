"""Shared fixtures: the bundled stories260K model, tiny random-weight models, scripted fake models,
the shared SmolLM2 chat model, and a model that recites a tool call through a tool-calling template."""

import contextlib
import importlib
import json
import os
import shutil
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, RotatingKVCache

from specgen.engine.decode.loop import generate
from specgen.engine.load import registry
from specgen.events import Prefilled

DATA = Path(__file__).parent / "data"
# The shared models, tokenizers and traces sit beside the repository (SPECGEN_SHARED moves them:
# pointed at an empty folder, every test that needs them skips).
SHARED = Path(os.environ.get("SPECGEN_SHARED") or Path(__file__).resolve().parents[1].parent / "shared")
SMOLLM2 = SHARED / "models" / "smollm2-135m-instruct-4bit"


def shared(relative: str) -> Path:
    """A path under SHARED, or the test (or fixture) asking for it skipped, saying why."""
    path = SHARED / relative
    if not path.exists():
        pytest.skip(f"{path} is absent: the shared models, tokenizers and traces sit beside the repository")
    return path


# The files that take longest (most run the 4-bit SmolLM2, ~140 ms a position on a CPU), slowest
# first: pytest-xdist hands out whole files in collection order, and one of these started last
# left a worker idle for a minute of the suite.
SLOWEST_FILES = ("engine/load/test_distributed.py", "api/test_api.py", "engine/test_real_model.py", "cli/test_chat.py",
                 "serve/apis/test_serve_structured.py", "serve/apis/test_serve_anthropic.py", "cli/test_bad_input.py",
                 "serve/apis/test_serve_ollama.py", "engine/decode/test_decode.py", "serve/test_serve_models.py")


def pytest_collection_modifyitems(items):
    """Run the SLOWEST_FILES first (the sort is stable: the rest keep their order)."""
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    here = Path(__file__).parent
    items.sort(key=lambda item: rank.get(item.path.relative_to(here).as_posix(), len(rank)))


needs_smollm2 = pytest.mark.skipif(not SMOLLM2.is_dir(), reason="the shared models sit beside the repository")
needs_tokenizers = pytest.mark.skipif(not (SHARED / "tokenizers" / "smollm2").is_dir(),
                                      reason="the shared tokenizers sit beside the repository")

# Tiny configs of architectures mlx-lm supports, one of each cache type: gemma3_text has sliding-
# window (rotating) caches; mamba and mamba2 state-space caches; qwen3_next (linear attention) and
# lfm2 (short convolutions) mix state caches with attention's KV caches.
TINY = {
    "llama": dict(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=512,
                  tie_word_embeddings=False),
    "qwen2": dict(model_type="qwen2", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, vocab_size=512,
                  tie_word_embeddings=True),
    "phi3": dict(model_type="phi3", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                 num_attention_heads=4, num_key_value_heads=4, rms_norm_eps=1e-5, vocab_size=512),
    "gemma3_text": dict(model_type="gemma3_text", hidden_size=64, num_hidden_layers=2,
                        intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                        head_dim=16, rms_norm_eps=1e-6, vocab_size=512, sliding_window=64,
                        sliding_window_pattern=2),
    "mamba": dict(model_type="mamba", vocab_size=512, hidden_size=64, intermediate_size=128,
                  state_size=8, num_hidden_layers=2, conv_kernel=4, use_bias=False,
                  use_conv_bias=True, time_step_rank=8, tie_word_embeddings=True),
    "mamba2": dict(model_type="mamba2", num_heads=4, head_dim=16, vocab_size=512, hidden_size=64,
                   intermediate_size=64, state_size=16, num_hidden_layers=2, layer_norm_epsilon=1e-5,
                   conv_kernel=4, n_groups=1, use_bias=False, use_conv_bias=True, tie_word_embeddings=True,
                   time_step_limit=(0.0, float("inf")), time_step_rank=8),
    "qwen3_next": dict(model_type="qwen3_next", hidden_size=64, num_hidden_layers=4, intermediate_size=128,
                       num_attention_heads=4, linear_num_value_heads=4, linear_num_key_heads=2,
                       linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                       num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
                       shared_expert_intermediate_size=64, mlp_only_layers=[], moe_intermediate_size=64,
                       rms_norm_eps=1e-6, vocab_size=512, num_key_value_heads=2, rope_theta=10000.0,
                       partial_rotary_factor=0.25, max_position_embeddings=4096, head_dim=16,
                       full_attention_interval=2),
    "lfm2": dict(model_type="lfm2", vocab_size=512, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=4096, norm_eps=1e-5, conv_bias=False,
                 conv_L_cache=3, block_dim=64, block_multiple_of=16, block_ffn_dim_multiplier=1.0,
                 block_auto_adjust_ff_dim=False, intermediate_size=128,
                 layer_types=["conv", "full_attention", "conv", "full_attention"]),
    # Multi-head latent attention: scores the keys its cache returns before attention is called.
    "deepseek_v3": dict(model_type="deepseek_v3", vocab_size=512, hidden_size=64, intermediate_size=128,
                        moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                        v_head_dim=16, qk_nope_head_dim=16, n_routed_experts=None, first_k_dense_replace=2),
}


def tiny_model(arch: str, seed: int = 0, **overrides):
    """A random-weight model of `arch` (deterministic for a seed)."""
    module = importlib.import_module(f"mlx_lm.models.{arch}")
    mx.random.seed(seed)
    model = module.Model(module.ModelArgs.from_dict({**TINY[arch], **overrides}))
    mx.eval(model.parameters())
    return model


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory):
    """Calibration curves and memory files go to a temporary cache, shared by the session; batched
    step costs are timed for half a second, not BUDGET_S."""
    from specgen.engine.cost import grid

    old = os.environ.get("SPECGEN_CACHE_DIR")
    os.environ["SPECGEN_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    # A server prices batched steps as it starts: quickly here, so that the grid's timing does not
    # load the CPU under the calibrations other tests run beside it.
    with pytest.MonkeyPatch.context() as m:
        m.setattr(grid, "BUDGET_S", 0.5)
        yield
    if old is None:
        del os.environ["SPECGEN_CACHE_DIR"]
    else:
        os.environ["SPECGEN_CACHE_DIR"] = old


@pytest.fixture(scope="session")
def stories():
    """The bundled demo model (stories260K), loaded through the registry like `-m demo`."""
    return registry.load(registry.resolve("demo", registry.load_registry()))


@pytest.fixture(scope="session")
def golden():
    return json.loads((DATA / "golden_greedy.json").read_text())["cases"]


def plain_tokens(model, prompt, n):
    """mlx-lm's own greedy decoding: the reference every speculative output must equal."""
    return [t for t, _ in generate_step(mx.array(prompt), model, max_tokens=n)]


def run(model, prompt, **kw):
    """specgen's decode loop; returns (tokens, steps, prefilled event)."""
    steps, prefilled = [], None
    for ev in generate(model, prompt, **kw):
        if isinstance(ev, Prefilled):
            prefilled = ev
        else:
            steps.append(ev)
    return [t for s in steps for t in s.tokens], steps, prefilled


class TableModel:
    """A fake target whose logits after token t are row t of `table`, with a real KVCache.

    It lets tests know exactly what the model would choose (or sample) at every position.
    """

    def __init__(self, table):
        self.table = mx.array(table, dtype=mx.float32)
        self.layers = [None]  # one KVCache from make_prompt_cache

    def __call__(self, tokens, cache):
        n = tokens.shape[1]
        cache[0].update_and_fetch(mx.zeros((1, 1, n, 1)), mx.zeros((1, 1, n, 1)))
        return self.table[tokens]


def ScriptedModel(rule: dict[int, int], vocab: int = 16) -> TableModel:
    """A TableModel whose greedy choice after token t is `rule[t]`."""
    return TableModel([[float(rule.get(t) == j) for j in range(vocab)] for t in range(vocab)])


@pytest.fixture
def quick_calibration(monkeypatch):
    """Calibration measuring for half a second, not BUDGET_S: for tests of what it does, not of the curve."""
    from specgen.engine.cost import calibrate

    monkeypatch.setattr(calibrate, "BUDGET_S", 0.5)


@pytest.fixture(scope="session")
def demo_engine():
    """The demo model's engine, its cost curve measured quickly (server tests are not about it)."""
    from specgen.engine.cost import calibrate
    from specgen.engine.engine import Engine

    with pytest.MonkeyPatch.context() as m:
        m.setattr(calibrate, "BUDGET_S", 0.5)
        engine = Engine.load("demo")
        engine.costs()
    return engine


class Paced:
    """`model`, each forward pass sleeping `delay` seconds a position it reads: an answer of n
    tokens lasts at least n * delay on any machine (every token is a position of some pass,
    drafted or not), so a client can leave in the middle of it however fast the model runs."""

    def __init__(self, model, delay: float):
        self.model, self.delay = model, delay

    def __call__(self, inputs, *args, **kwargs):
        time.sleep(self.delay * inputs.shape[-1])
        return self.model(inputs, *args, **kwargs)

    def __getattr__(self, name):  # its cache, layers and parameters are the model's
        return getattr(self.model, name)

    @contextlib.contextmanager
    def paused(self):
        """At the model's own speed: for measuring its cost curves, which the sleeps would distort
        (and they are the unpaced model's too: the same calibration key)."""
        delay, self.delay = self.delay, 0.0
        try:
            yield
        finally:
            self.delay = delay


class DeviceLike:
    """`model` timed as a device times it: each input shape's first pass sleeps `compile` seconds
    (MLX's CUDA build compiles its kernels then), and every pass of k positions a row sleeps
    `curve.get(k, rest)` (a device's cost curve, such as a GPU's 4-bit kernel switch)."""

    def __init__(self, model, compile: float = 0.0, curve: dict[int, float] | None = None,
                 rest: float = 0.0):
        self.model, self.compile, self.curve, self.rest = model, compile, curve or {}, rest
        self.seen = set()

    def __call__(self, x, cache=None, **kwargs):
        out = self.model(x, cache=cache, **kwargs)
        mx.eval(out)
        pause = self.curve.get(x.shape[1], self.rest)
        if x.shape not in self.seen:
            self.seen.add(x.shape)
            pause += self.compile
        time.sleep(pause)
        return out

    def __getattr__(self, name):  # its cache, layers and parameters are the model's
        return getattr(self.model, name)


@pytest.fixture(scope="session")
def paced_engine(demo_engine):
    """The demo model at 10 ms a position: its 342-token greedy answer to "Once upon a time"
    (chat template) lasts over 3 s anywhere. The same weights and calibration key as demo_engine:
    its curves are the demo's, never measured under the sleeps (servers.running warms them)."""
    from dataclasses import replace

    from specgen.engine.engine import Engine

    engine = Engine(replace(demo_engine.loaded, model=Paced(demo_engine.loaded.model, 0.01)))
    with engine.loaded.model.paused():
        engine.costs()  # read from the cache demo_engine measured into
    return engine


@pytest.fixture(scope="session")
def smollm2_engine():
    """The shared SmolLM2 (4-bit, ChatML, 8K context), its cost curve measured quickly."""
    from specgen.engine.cost import calibrate
    from specgen.engine.engine import Engine

    with pytest.MonkeyPatch.context() as m:
        m.setattr(calibrate, "BUDGET_S", 0.5)
        engine = Engine.load(str(shared("models/smollm2-135m-instruct-4bit")))
        engine.costs()
    return engine


QUESTION = [{"role": "user", "content": "Name three colours."}]
TEMPLATE = (  # a ChatML template with tools, as Qwen2.5's (what mlx-lm reads as the json_tools format)
    "{%- if tools %}<|im_start|>system\n# Tools\n{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}\n"
    "Call one as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}\n<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{%- for tool_call in message.tool_calls or [] %}{%- set tool_call = tool_call.function %}"
    "<tool_call>{\"name\": \"{{ tool_call.name }}\", \"arguments\": {{ tool_call.arguments | tojson }}}</tool_call>"
    "{%- endfor %}<|im_end|>{%- endfor %}\n{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
SAID = 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class Recited(nn.Module):
    """A model that answers any prompt of `start` tokens with `script`, then repeats its last token."""

    def __init__(self, script: list[int], start: int, vocab: int):
        super().__init__()
        self.bias = mx.zeros((1,))
        self.script, self.start, self.vocab = script, start, vocab

    def make_cache(self):
        return [KVCache()]

    def __call__(self, x, cache=None):
        n, first = x.shape[1], cache[0].offset
        cache[0].update_and_fetch(mx.zeros((1, 1, n, 1)), mx.zeros((1, 1, n, 1)))
        rows = [self.script[min(max(p - self.start + 1, 0), len(self.script) - 1)] for p in range(first, first + n)]
        return (mx.arange(self.vocab)[None, None, :] == mx.array(rows)[None, :, None]).astype(mx.float32)


def save_tiny(arch: str, folder: Path, seed: int = 0) -> Path:
    """A random-weight model folder that mlx_lm.load accepts, with the stories tokenizer."""
    from mlx.utils import tree_flatten

    folder.mkdir()
    model = tiny_model(arch, seed)
    mx.save_safetensors(str(folder / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (folder / "config.json").write_text(json.dumps(TINY[arch]))
    for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]:
        shutil.copy(registry.bundled_path("stories260K") / f, folder / f)
    return folder


def reciting_engine(folder: Path, messages: list[dict], tools: list[dict], said: str):
    """An engine whose model answers `messages` with `tools` (through TEMPLATE and SmolLM2's
    tokenizer, saved in `folder`) by reciting `said`, then its end-of-turn token."""
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from specgen.engine.engine import Engine
    from specgen.engine.load import registry

    shutil.copy(shared("tokenizers/smollm2/tokenizer.json"), folder)
    config = json.loads((shared("models/smollm2-135m-instruct-4bit") / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    tokenizer = load_tokenizer(folder)
    assert tokenizer.has_tool_calling
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    script = tokenizer.encode(said, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return Engine(registry.wrap(Recited(script, len(prompt), len(tokenizer.get_vocab())), tokenizer))


@pytest.fixture(scope="session")
def tool_engine(tmp_path_factory):
    """A model that answers QUESTION with TOOLS by reciting SAID (a text and a get_weather call in
    the json_tools format)."""
    return reciting_engine(tmp_path_factory.mktemp("tools"), QUESTION, TOOLS, SAID)


# A model steered round a cycle of tokens, and what its caches hold: for tests of every cache kind
# (engine/decode/test_caches.py, engine/batch/test_batch_kinds.py).
CYCLE = list(range(10, 26))  # the steering below makes the model mostly walk this cycle


class Steered:
    """A real forward pass, then `boost` added to the logit of the cycle's next token after each
    token: the model mostly follows the cycle (drafts are accepted), but where its own logits win,
    it leaves it (drafts are rejected). Its choices depend on the cache, so a wrong cache shows."""

    def __init__(self, model, boost: float):
        self.model, self.layers, self.boost = model, model.layers, boost
        self.fed = 0  # positions through the model, all passes together
        if hasattr(model, "make_cache"):  # what make_prompt_cache asks of hybrid models
            self.make_cache = model.make_cache

    def __call__(self, x, cache):
        self.fed += x.shape[1]
        logits = self.model(x, cache=cache)
        t = x.astype(mx.int32)
        nxt = CYCLE[0] + (t - CYCLE[0] + 1) % len(CYCLE)
        hot = mx.arange(logits.shape[-1])[None, None, :] == nxt[..., None]
        return logits + self.boost * hot


def arrays(cache) -> list[np.ndarray]:
    """What each layer's cache holds for the next token to read: a sliding window's newest
    max_size - 1 entries in time order (its buffer's layout depends on how it was filled)."""
    out = []
    for c in cache:
        if isinstance(c, RotatingKVCache):
            out += [np.array(c._temporal_order(a))[..., -(c.max_size - 1):, :] for a in (c.keys, c.values)]
            continue
        state = c.state if isinstance(c.state, (list, tuple)) else [c.state]
        out += [np.array(a) for a in state if isinstance(a, mx.array)]
    return out


def held(cache) -> list[np.ndarray]:
    """`arrays`, with KV caches' buffers cut to the entries they hold (past them: stale data)."""
    out = []
    for c in cache:
        if type(c).__name__ == "KVCache":
            out += [np.array(a[..., : c.offset, :]) for a in (c.keys, c.values)]
        else:
            out += arrays([c])
    return out
