"""Shared fixtures: the bundled stories260K model, tiny random-weight models, a scripted fake model."""

import importlib
import json
import os
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from specgen.draft.events import Prefilled
from specgen.engine import registry
from specgen.engine.decode import generate

DATA = Path(__file__).parent / "data"
SHARED = Path(__file__).resolve().parents[1].parent / "shared"

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
    """Calibration curves and memory files go to a temporary cache, shared by the session."""
    old = os.environ.get("SPECGEN_CACHE_DIR")
    os.environ["SPECGEN_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
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
    from specgen.engine import calibrate

    monkeypatch.setattr(calibrate, "BUDGET_S", 0.5)


@pytest.fixture(scope="session")
def demo_engine():
    """The demo model's engine, its cost curve measured quickly (server tests are not about it)."""
    from specgen.engine import calibrate
    from specgen.engine.engine import Engine

    with pytest.MonkeyPatch.context() as m:
        m.setattr(calibrate, "BUDGET_S", 0.5)
        engine = Engine.load("demo")
        engine.costs()
    return engine
