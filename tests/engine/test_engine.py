"""The engine's plan for a request: what it speculates with, where the model's curve says not to."""

from specgen.engine.engine import Engine, Request
from specgen.engine.options import Options
from specgen.stats import RunStats


def run(engine: Engine, request: Request) -> tuple[str, RunStats]:
    stats = RunStats()
    text = "".join(r.text for r in engine.stream(request, stats))
    return text, stats


def test_a_prediction_speculates_where_the_curve_turned_speculation_off(demo_engine):
    # A busy CPU can time the demo's verify as too dear to speculate on; a caller's prediction is
    # a near-certain draft (as a grammar's forced tokens), weighed draft by draft all the same.
    engine = Engine(demo_engine.loaded)
    engine._costs = demo_engine.costs()._replace(off="verifying costs too much here")
    ids = engine.encode("Once upon a time")
    text, plain = run(engine, Request(ids, Options(max_tokens=60)))
    assert plain.counts.drafted == 0
    predicted, stats = run(engine, Request(ids, Options(max_tokens=60), prediction=text))
    assert predicted == text and stats.prediction_accepted > 30
