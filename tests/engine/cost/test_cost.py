"""The verify-cost curve: measuring it (calibrate) and what it means for drafting (cost)."""

import pytest
from conftest import DeviceLike

from specgen.draft.drafter import AdaptiveDrafter
from specgen.draft.length import linear_cost
from specgen.engine.cost import calibrate
from specgen.engine.cost import grid as batch_grid
from specgen.engine.cost import store as curve_store
from specgen.engine.cost.batch import Pricing
from specgen.engine.cost.calibrate import load_or_measure
from specgen.engine.cost.curve import (
    Curve,
    cost_function,
    drafting_cost,
    queue_after,
    relative,
    unprofitable,
)
from specgen.engine.cost.mode import describe_curve


def test_relative_curve_is_normalised_and_never_decreasing():
    curve = relative({1: 2.0, 2: 2.4, 4: 2.2, 8: 4.0})
    assert curve == pytest.approx({1: 1.0, 2: 1.15, 4: 1.15, 8: 2.0})  # 2 and 4 pooled
    # One spike is averaged with what follows it, not carried to every larger size.
    spiky = relative({1: 1.0, 2: 1.05, 4: 1.6, 8: 1.4, 16: 1.45, 32: 2.0})
    assert spiky[4] == spiky[8] == spiky[16] == pytest.approx((1.6 + 1.4 + 1.45) / 3) and spiky[32] == 2.0
    assert relative({1: 2.0, 2: 1.8})[2] == 1.0  # never cheaper than one position


def test_cost_function_interpolates_and_extrapolates():
    cost = cost_function({1: 1.0, 2: 1.2, 4: 1.6, 8: 2.4})
    assert cost(0) == 1.0 and cost(1) == 1.2 and cost(3) == 1.6
    assert cost(2) == pytest.approx(1.4)  # 3 positions: halfway between 2 and 4
    assert cost(11) == pytest.approx(3.2)  # 12 positions: the 4 -> 8 slope continued
    assert cost_function({1: 1.0, 2: 2.0})(7) == pytest.approx(8.0)  # two points: a line


def test_plain_steps_are_queued_ahead_sooner_the_more_it_saves():
    rel = {1: 1.0, 2: 1.1}
    assert [queue_after(Curve(rel, x)) for x in (0.0, 0.01, 0.05, 0.15, 0.3)] == [None, 2, 2, 2, 1]
    steep = {1: 1.0, 2: 1.3}  # ...and sooner where a drafted token costs 30% of a step
    assert [queue_after(Curve(steep, x)) for x in (0.0, 0.01, 0.05, 0.15)] == [None, 1, 1, 1]
    assert describe_curve(Curve(rel, 0.3)).endswith("queued ahead after 1 silent one (saves 30%)")
    assert describe_curve(Curve(rel, 0.1)).endswith("after 2 silent ones (saves 10%)")
    assert "queued" not in describe_curve(Curve(rel, 0.0))
    assert "while the drafts they hold up cost less" in describe_curve(Curve(rel, 0.1), adaptive=True)
    assert describe_curve(Curve(rel, 0.1, eager=2)).endswith("other passes run as built (every 2 layers)")


def test_a_weak_draft_is_dropped_where_plain_steps_are_queued_ahead():
    base = linear_cost(0.08)
    assert drafting_cost(base, 0.3, None) is base and drafting_cost(base, 0.0, 1) is base
    assert drafting_cost(base, 0.3, 2)(0) == pytest.approx(0.7)  # the loop queues after any silence
    cost = drafting_cost(base, 0.3, 1)
    assert cost(0) == pytest.approx(0.7) and cost(3) == pytest.approx(base(3) + 0.3)  # the next step waits
    history = [5, 6, 7, 5]  # 6 followed 5 once: a weak guess, worth drafting at plain cost
    drafters = [AdaptiveDrafter(cost=c) for c in (base, cost)]
    for d in drafters:
        d.feed(history)
    assert drafters[0].draft(8)[:1] == [6] and drafters[1].draft(8) == []


def test_where_a_rejection_is_refed_weak_drafts_are_dropped():
    base = linear_cost(0.4)  # a steep curve: a weak guess (q 0.5) pays only if nothing is re-fed
    refed = drafting_cost(base, 0.0, None, refeed=True)
    assert refed(0) == base(0) and refed(2) == base(2)  # the re-fed tokens are charged by chance
    history = [5, 6, 7, 5, 6, 8, 5]  # 6 followed 5 twice, then 7 once and 8 once
    drafters = [AdaptiveDrafter(cost=c) for c in (base, refed)]
    for d in drafters:
        d.feed(history)
    assert len(drafters[0].draft(8)) > len(drafters[1].draft(8))


def test_calibration_is_cached_per_model_and_redone_on_request(stories, tmp_path, monkeypatch, quick_calibration):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    sample = stories.tokenizer.encode("Once upon a time")
    said = []
    first = load_or_measure(stories.model, "m", sample, before_measuring=lambda: said.append(1))
    curve = first.curve
    assert first.fresh and said == [1] and first.warning is None
    assert curve.relative[1] == 1.0 and all(v >= 1.0 for v in curve.relative.values())
    assert 0 <= curve.overlap < 1
    again = load_or_measure(stories.model, "m", sample, before_measuring=lambda: said.append(2))
    assert not again.fresh and again.curve == curve and said == [1]
    assert load_or_measure(stories.model, "m", sample, recalibrate=True).fresh
    # Another BLAS changes the curve's shape: its curve is measured, not borrowed.
    monkeypatch.setenv("LD_PRELOAD", "/elsewhere/libopenblas.so.0")
    assert load_or_measure(stories.model, "m", sample).fresh
    assert not load_or_measure(stories.model, "m", sample).fresh
    # ...and so do its threads, which also say whether the host has a core of its own.
    monkeypatch.setattr(curve_store, "blas_threads", lambda: curve_store.cores() + 1)
    assert not curve_store.host_has_a_core()
    assert load_or_measure(stories.model, "m", sample).fresh
    monkeypatch.setattr(curve_store, "blas_threads", lambda: curve_store.cores() - 1)
    assert curve_store.host_has_a_core()
    (tmp_path / "calibration.json").write_text("{broken")
    assert load_or_measure(stories.model, "m", sample).fresh  # a damaged cache is measured over


def test_a_timed_overlap_is_at_least_its_floor_where_the_host_has_a_core_and_an_untimed_one_is_none(
        stories, monkeypatch, quick_calibration):
    sample = stories.tokenizer.encode("Once upon a time")
    monkeypatch.setattr(calibrate, "_ab", lambda queued, synchronous: 1.01)  # queuing read as no faster
    monkeypatch.setattr(calibrate, "host_has_a_core", lambda: True)
    assert calibrate.measure_overlap(stories.model, sample, one_s=0.003) == calibrate.OVERLAP_FLOOR
    monkeypatch.setattr(calibrate, "host_has_a_core", lambda: False)  # its work slows the compute
    assert calibrate.measure_overlap(stories.model, sample, one_s=0.003) == 0.0
    monkeypatch.setattr(calibrate, "_ab", lambda queued, synchronous: 0.8)
    assert calibrate.measure_overlap(stories.model, sample, one_s=0.003) == pytest.approx(0.2)
    slow = calibrate.OVERLAP_SLOW_S * 2  # building the next graph is a negligible share of such a step
    assert calibrate.measure_overlap(stories.model, sample, one_s=slow) == 0.0


def test_speculation_is_off_where_a_drafted_token_costs_half_a_step_or_more():
    assert unprofitable(Curve({1: 1.0, 2: 1.11, 4: 1.28})) is None  # float32 SmolLM2, OpenBLAS
    reason = unprofitable(Curve({1: 1.0, 2: 1.75}))  # 4-bit SmolLM2 on this CPU
    assert reason is not None and "75% of a plain step" in reason
    # Every width as dear per drafted token (the demo on MLX's own BLAS): still off.
    assert unprofitable(Curve({1: 1.0, 2: 1.5, 4: 2.6, 8: 4.8, 16: 9.4})) is not None


def test_speculation_is_on_where_wide_drafts_are_cheap_though_one_is_dear():
    # An 8B model at 4 bits on an H200 (MLX's CUDA build): the kernel for 2 positions costs half
    # a step more, 4-16 positions cost 2.44 steps, so a long copy's tokens cost 0.1 each.
    h200 = Curve({1: 1.0, 2: 1.53, 4: 2.44, 8: 2.44, 16: 2.44, 32: 3.10, 64: 5.45})
    assert unprofitable(h200) is None


def test_a_dear_second_position_does_not_stop_the_calibration_short(stories, monkeypatch):

    monkeypatch.setattr(calibrate, "BUDGET_S", 1.0)
    # An H200's 8B passes at 4 bits relative to one position: 2 nearly twice one (a kernel
    # switch), 4 and more little more.
    model = DeviceLike(stories.model, curve={1: 0.010, 2: 0.020}, rest=0.022)
    sample = stories.tokenizer.encode("Once upon a time")
    curve = relative(calibrate.measure(model, sample))
    assert max(curve) >= 4 and unprofitable(Curve(curve)) is None  # stopping at 2 had turned it off
    grid = batch_grid.measure(model, sample, max_rows=2, budget_s=0.2).grid
    assert all(max(row) >= 4 for row in grid.values())
    assert Pricing(batch_grid.Measured(grid)).drafting(2) is not None


def test_the_batched_grid_is_timed_once_each_shapes_kernels_are_compiled(stories):

    # Passes of 10 ms whatever their width, as a GPU's narrow ones (the demo's own 1-3 ms ones, on
    # a CPU loaded by the tests beside this one, could look dear by noise alone), the first of
    # each shape 100 ms more.
    model = DeviceLike(stories.model, compile=0.1, rest=0.01)
    sample = stories.tokenizer.encode("Once upon a time")
    grid = batch_grid.measure(model, sample, max_rows=2, budget_s=0.2).grid
    assert all(max(row) >= batch_grid.SURE for row in grid.values())  # no cold width looked dear


def test_a_batched_grid_flat_to_eight_positions_is_timed_wider_where_the_budget_allows(stories, monkeypatch):

    # A GPU's batched step: as cheap at 8 positions a row as at 1, then dearer (an H100's 4 rows
    # cost 1.56x at 32 what they cost at 8). Extrapolated from 4 and 8, 32 looked as cheap as 8.
    model = DeviceLike(stories.model, curve={1: 0.010, 2: 0.010, 4: 0.010, 8: 0.011, 16: 0.016}, rest=0.03)
    sample = stories.tokenizer.encode("Once upon a time")
    monkeypatch.setattr(batch_grid, "ROUNDS", (3, 3))  # a budget for the widths, not spent on rounds
    measured = batch_grid.measure(model, sample, max_rows=2, budget_s=5.0)
    assert all(max(row) >= 32 for row in measured.grid.values())
    assert Pricing(measured).built(2)(31) > 2.5  # 3x a plain step, not ~1.1x
    tight = batch_grid.measure(model, sample, max_rows=2, budget_s=0.05)  # wider rounds would overrun it
    assert all(max(row) == batch_grid.SURE for row in tight.grid.values())
