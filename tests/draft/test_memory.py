"""The memory of earlier outputs: bounded, merged safely between processes, never trusted."""

import multiprocessing
import random
from dataclasses import replace

import pytest

from specgen.draft import memory_file
from specgen.draft.acceptance import evidence_for
from specgen.draft.drafter import AdaptiveDrafter
from specgen.draft.length import linear_cost
from specgen.draft.memory import NGramMemory
from specgen.draft.params import PARAMS
from specgen.draft.simulate import replay


def test_memory_file_round_trips_and_is_bounded(tmp_path):
    path = tmp_path / "m.npz"
    mem = NGramMemory("model-a", max_contexts=50)
    rng = random.Random(0)
    for _ in range(20):
        mem.add([rng.randrange(1000) for _ in range(30)])
    mem.add([1, 2, 3, 4, 5] * 4)
    assert memory_file.save(mem, path) is None
    back, warning = memory_file.load(path, "model-a", max_contexts=50)
    assert warning is None and 0 < back.contexts() <= 50
    assert back.tables.lookup([2, 3, 4]) == 5  # the most used contexts survive the bound
    assert back.outputs() == mem.outputs() == 21 and back.stream == mem.stream


def test_memory_bound_keeps_used_then_short_then_new_contexts(tmp_path):
    # Bound 3: over it, the memory keeps the 2 (3/4 of 3) best: most used, shortest, newest.
    mem = NGramMemory("model-a", max_order=3, max_contexts=3)
    mem.add([1, 2, 1, 2])  # 1->2 twice; 2->1, (1,2)->1, (2,1)->2 once: 4 contexts, over
    assert {k: len(t) for k, t in mem.ngrams.tables.items()} == {3: 0, 2: 2}
    assert mem.tables.lookup([1]) == 2 and mem.tables.lookup([2]) == 1
    mem.add([5, 6])
    mem.add([8, 9])  # 4 contexts: the older of the three seen once go
    assert mem.contexts() == 2 and mem.tables.lookup([8]) == 9
    assert mem.tables.lookup([2]) is None and mem.tables.lookup([5]) is None
    # Ages survive the file: of the contexts saved, the newest outlives the others.
    path = tmp_path / "m.npz"
    mem = NGramMemory("model-a", max_order=2, max_contexts=4)
    for output in ([5, 6], [8, 9], [13, 14]):
        mem.add(output)
    memory_file.save(mem, path)
    back = memory_file.load(path, "model-a", max_order=2, max_contexts=4)[0]
    back.add([40, 41])
    back.add([50, 51])  # 5 contexts: 3 stay
    assert [back.tables.lookup([t]) for t in (5, 8, 13, 40, 50)] == [None, None, 14, 41, 51]


def test_the_stream_keeps_outputs_apart():
    mem = NGramMemory("m")
    mem.add([1, 2, 3, 4, 5])
    mem.add([6, 7, 8])
    assert mem.outputs() == 2
    assert mem.output_end(1) == 6 and mem.output_end(7) == 10  # copies stop at an output's end


@pytest.mark.parametrize("content", [b"garbage", b"PK\x03\x04broken zip"])
def test_corrupt_memory_file_is_ignored_with_a_warning(tmp_path, content):
    path = tmp_path / "m.npz"
    path.write_bytes(content)
    mem, warning = memory_file.load(path, "model-a")
    assert mem.contexts() == 0 and "ignoring memory file" in warning


def test_memory_of_another_model_is_ignored_with_a_warning(tmp_path):
    path = tmp_path / "m.npz"
    mem = NGramMemory("model-a")
    mem.add([1, 2, 3, 4])
    memory_file.save(mem, path)
    other, warning = memory_file.load(path, "model-b")
    assert other.contexts() == 0 and "belongs to model 'model-a'" in warning


def test_what_a_request_learns_about_memory_is_merged_into_the_file(tmp_path):
    path = tmp_path / "m.npz"
    mem = NGramMemory("model-a")
    mem.add([1, 2, 3, 4, 5, 6])
    memory_file.save(mem, path)
    a, b = memory_file.load(path, "model-a")[0], memory_file.load(path, "model-a")[0]
    ev = evidence_for(mem.params).copy_at(8, own=False)  # a memory copy
    for m, hits in ((a, 3), (b, 5)):
        for _ in range(hits):
            m.acceptance.record(ev, True)
        memory_file.save(m, path)
    assert memory_file.load(path, "model-a")[0].acceptance.counts["mcopy"].judged == 8


def _save_in_process(path, seed):
    mem = NGramMemory("model-a")
    mem.add([seed, seed + 1, seed + 2, seed + 3])
    memory_file.save(mem, path)


def test_concurrent_saves_keep_both_outputs(tmp_path):
    path = tmp_path / "m.npz"
    procs = [multiprocessing.get_context("spawn").Process(target=_save_in_process, args=(path, s))
             for s in (10, 20, 30, 40)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    mem, warning = memory_file.load(path, "model-a")
    assert warning is None
    for s in (10, 20, 30, 40):
        assert mem.tables.lookup([s, s + 1, s + 2]) == s + 3


def _agent_session(rng, turns=4):
    """A session's prompt (tool results, the cue [1, 2, 3, 4], the same tool call each turn) and
    its last turn's call as memory keeps it: the first token spelled apart (900 for 90)."""
    call = [90] + [rng.randrange(100, 30000) for _ in range(15)]
    prompt = []
    for _ in range(turns):
        prompt += [rng.randrange(100, 30000) for _ in range(30)] + [1, 2, 3, 4] + call
    return prompt + [rng.randrange(100, 30000) for _ in range(30)] + [1, 2, 3, 4], [900] + call[1:]


def test_the_share_of_memory_a_prompt_holds_counts_output_tokens():
    rng = random.Random(4)
    prompt, last = _agent_session(rng)
    index = AdaptiveDrafter()
    index.feed(prompt)
    mem = NGramMemory("m")
    mem.add([rng.randrange(100, 30000) for _ in range(48)])  # another session's: not in the prompt
    mem.add(last)  # 16 tokens the prompt holds (but the first)
    assert mem.respellings(index.tokens, index.copies.index) == {90: 900}
    assert mem.prompt_holds(index.tokens, index.copies.index, 0.25)  # 16 of 64 tokens
    assert not mem.prompt_holds(index.tokens, index.copies.index, 0.26)


def test_memory_drafts_in_a_session_where_it_knows_more_than_the_prompt():
    # The new turn writes text that only memory's other session holds: memory's copies are kept
    # (aside_share), where the rule before (0: aside whenever the prompt holds the newest output)
    # drafted none of it.
    rng = random.Random(5)
    prompt, last = _agent_session(rng)
    elsewhere = [rng.randrange(100, 30000) for _ in range(40)]
    steps = {}
    for share in (PARAMS.aside_share, 0.0):
        params = replace(PARAMS, aside_share=share)
        mem = NGramMemory("m", params=params)
        mem.add(elsewhere)
        mem.add(last)
        d = AdaptiveDrafter(cost=linear_cost(0.08), memory=mem, params=params)
        steps[share] = replay(prompt, elsewhere, d, draft=64).counts.steps
        assert d.respell == {90: 900}  # memory respells the turn's first token either way
    assert steps == {PARAMS.aside_share: 6, 0.0: 40}
