"""Eager passes (engine/decode/eager.py): a synchronous pass starts running while its graph is built, computes
what it computes otherwise, leaves the caches as they were, and is chosen by the calibration,
which caches the choice with the curve."""

import json

import mlx.core as mx
import numpy as np
import pytest
from conftest import DeviceLike, plain_tokens, run, tiny_model
from mlx_lm.models.cache import make_prompt_cache

from specgen.draft.drafter import make_drafter
from specgen.engine.cost import calibrate
from specgen.engine.cost.curve import StepPrices
from specgen.engine.decode.eager import eager


@pytest.mark.parametrize("arch", ["llama", "qwen3_next"])
def test_an_eager_pass_computes_what_a_plain_one_does_and_leaves_its_caches_alone(arch):
    model = tiny_model(arch)
    logits, states = [], []
    for every in (0, 1):
        cache = make_prompt_cache(model)
        model(mx.array([list(range(10, 30))]), cache=cache)
        with eager(cache, every):
            logits.append(np.array(model(mx.array([[5, 6, 7]]), cache=cache)))
        states.append([np.array(a) for c in cache for a in c.state if isinstance(a, mx.array)])
        assert all("update_and_fetch" not in vars(c) for c in cache)  # the class's own again
    assert np.array_equal(*logits)
    assert all(np.array_equal(a, b) for a, b in zip(*states, strict=True))


def test_an_eager_pass_starts_evaluating_every_nth_attention_layer(monkeypatch):
    model = tiny_model("llama", num_hidden_layers=6)
    cache = make_prompt_cache(model)
    started = []
    real = mx.async_eval
    monkeypatch.setattr(mx, "async_eval", lambda *a: (started.append(len(a)), real(*a)))
    for every, points in ((0, 0), (2, 3), (4, 1), (1, 6)):
        started.clear()
        with eager(cache, every):
            model(mx.array([[1, 2]]), cache=cache)
        assert len(started) == points, every


def test_a_cache_of_the_callers_own_making_keeps_its_update():
    model = tiny_model("llama", num_hidden_layers=2)
    cache = make_prompt_cache(model)
    mine = cache[1].update_and_fetch
    cache[1].update_and_fetch = mine  # set on the object itself, as a caller's wrapper would be
    with eager(cache, 1):
        model(mx.array([[1, 2]]), cache=cache)
    assert vars(cache[1])["update_and_fetch"] is mine and "update_and_fetch" not in vars(cache[0])


@pytest.mark.parametrize("arch", ["llama", "qwen3_next", "gemma3_text"])
def test_eager_passes_in_the_decode_loop_give_plain_decodings_text(arch):
    model = tiny_model(arch, **({"sliding_window": 8} if arch == "gemma3_text" else {}))
    prompt = [3, 4, 5, 6] * 6
    eager_prices = StepPrices(lambda k: 1.0 + 0.1 * k, 0.5, eager=1)
    tokens, steps, _ = run(model, prompt, drafter=make_drafter(None), draft=8, max_tokens=60,
                           queue_after=1, prices=eager_prices)
    assert tokens == plain_tokens(model, prompt, 60)
    assert any(not s.queued for s in steps[1:])  # passes nothing ran ahead of, run eagerly


def test_the_eager_choice_is_cached_with_the_curve_and_measured_again_with_it(
        stories, tmp_path, monkeypatch, quick_calibration):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(calibrate, "measure_eager", lambda model, sample, primed=None: 3)
    sample = stories.tokenizer.encode("Once upon a time")
    first = calibrate.load_or_measure(stories.model, "m", sample)
    assert first.fresh and first.curve.eager == 3
    path = tmp_path / "calibration.json"
    (key,) = json.loads(path.read_text())
    assert json.loads(path.read_text())[key]["eager"] == 3
    again = calibrate.load_or_measure(stories.model, "m", sample)
    assert not again.fresh and again.curve.eager == 3
    entry = json.loads(path.read_text())
    del entry[key]["eager"]  # an entry from before eager passes: its passes were timed otherwise
    path.write_text(json.dumps(entry))
    assert calibrate.load_or_measure(stories.model, "m", sample).fresh


def test_the_calibration_runs_eagerly_every_so_many_layers_as_times_fastest_where_that_pays(
        stories, monkeypatch):
    sample = stories.tokenizer.encode("Once upon a time")
    ratios = {}  # each choice's time over the plain pass's, as if timed so
    monkeypatch.setattr(calibrate, "_ab", lambda eager_way, plain_way: ratios[eager_way.args[0]])
    ratios.update({1: 0.95, 2: 0.90})
    assert calibrate.measure_eager(stories.model, sample) == 2
    ratios.update({1: 0.93, 2: 0.96})
    assert calibrate.measure_eager(stories.model, sample) == 1
    ratios.update({1: 0.99, 2: 1.02})  # saves less than EAGER_GAIN: not eagerly at all
    assert calibrate.measure_eager(stories.model, sample) == 0


def test_kernels_compiled_on_first_use_do_not_make_a_pass_look_too_slow_to_run_eagerly(
        stories, monkeypatch):
    monkeypatch.setattr(calibrate, "_ab", lambda eager_way, plain_way: 0.9)
    sample = stories.tokenizer.encode("Once upon a time")
    # Compiling a width's kernels (MLX's CUDA build): the H200's calibration chose no eager passes
    # while they saved 28% of a synchronous pass.
    model = DeviceLike(stories.model, compile=2.5 * calibrate.OVERLAP_SLOW_S)
    assert calibrate.measure_eager(model, sample) == calibrate.CHOICES[0]
