"""`specgen serve` against the official openai client: a real uvicorn server on a loopback port.

The text a client gets is the text `specgen run` prints (streamed or not); seeded sampling is the
same with speculation off; a perfect prediction is accepted; a second turn reuses the prompt
cache and still gets the text it would get without it; eight clients at once each get their own
text; a client that leaves has its request cancelled and the next one is served.
"""

import json
import threading

import httpx
import pytest
from servers import CANCELLED, client, health, leave_mid_stream, running, settled
from typer.testing import CliRunner

import specgen
from specgen.cli.commands import app

ONCE = "Once upon a time"
PROMPTS = ["Once upon a time", "Lily and Ben went to the park", "The little dog was sad", "Tom had a red ball",
           "One day, a bird", "Sue liked to bake", "The sun was hot", "Max saw a big tree"]


@pytest.fixture(scope="module")
def engine(demo_engine):
    return demo_engine


@pytest.fixture(scope="module")
def served(engine):
    with running(engine) as (url, worker):
        yield url, worker


@pytest.fixture(scope="module")
def demo():
    return specgen.load("demo")


def ask(c, prompt, **kw):
    kw.setdefault("max_tokens", 48)
    return c.chat.completions.create(model="demo", messages=[{"role": "user", "content": prompt}], **kw)


def streamed(c, prompt, **kw):
    chunks = list(ask(c, prompt, stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    return text, chunks


def test_plain_streamed_and_completions_equal_specgen_run(served):
    c = client(served[0])
    whole = ask(c, ONCE, max_tokens=64)
    text, chunks = streamed(c, ONCE, max_tokens=64)
    completion = c.completions.create(model="demo", prompt=ONCE, max_tokens=64)
    run = CliRunner().invoke(app, ["run", "-m", "demo", "-n", "64", "--json", ONCE])
    assert run.exit_code == 0, run.output
    assert whole.choices[0].message.content == text == completion.choices[0].text == json.loads(run.stdout)["text"]
    assert whole.choices[0].finish_reason == chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 64
    assert whole.model_extra["specgen"]["speculation"] == "on: trim"


def test_seeded_sampling_is_the_same_with_speculation_off(served, demo):
    c = client(served[0])
    got = [ask(c, p, temperature=0.9, top_p=0.95, seed=11, max_tokens=40).choices[0].message.content for p in PROMPTS[:2]]
    off = [specgen.generate(*demo, p, max_tokens=40, temp=0.9, top_p=0.95, seed=11, draft=0) for p in PROMPTS[:2]]
    assert got == off
    assert got[0] != ask(c, PROMPTS[0], temperature=0.9, top_p=0.95, seed=12, max_tokens=40).choices[0].message.content


def test_a_perfect_prediction_is_accepted_and_changes_nothing(served):
    c = client(served[0])
    first = ask(c, PROMPTS[2], max_tokens=96)
    text = first.choices[0].message.content
    again = ask(c, PROMPTS[2], max_tokens=96, prediction={"type": "content", "content": text})
    assert again.choices[0].message.content == text
    details = again.usage.completion_tokens_details
    # OpenAI's count: the prediction's tokens that appear in the completion (all of them here,
    # whichever source drafted them: the drafter also remembers the first answer)
    assert (details.accepted_prediction_tokens, details.rejected_prediction_tokens) == \
        (again.usage.completion_tokens - (again.choices[0].finish_reason == "stop"), 0)
    assert again.model_extra["specgen"]["tokens_per_step"] >= 4
    wrong = ask(c, PROMPTS[2], max_tokens=96, prediction={"type": "content", "content": [{"type": "text", "text": "The end."}]})
    assert wrong.choices[0].message.content == text
    assert wrong.usage.completion_tokens_details.rejected_prediction_tokens > 0


def test_the_next_turn_is_served_from_the_prompt_cache_and_the_kept_drafter(engine, demo):
    with running(engine) as (url, worker):
        c = client(url)
        reply = c.completions.create(model="demo", prompt=PROMPTS[3], max_tokens=32).choices[0].text
        longer = f"{PROMPTS[3]}{reply} Then"
        turn = c.completions.create(model="demo", prompt=longer, max_tokens=32)
        assert len(worker.drafters) == 1  # the first turn's drafter went on: no second one was made
    assert turn.usage.prompt_tokens_details.cached_tokens >= turn.usage.prompt_tokens - 4
    assert turn.choices[0].text == specgen.generate(*demo, longer, max_tokens=32)


def test_eight_clients_at_once_each_get_their_own_text(served, demo):
    expected = [specgen.generate(*demo, p, max_tokens=24) for p in PROMPTS]
    got = [None] * len(PROMPTS)

    def one(i):
        got[i] = ask(client(served[0]), PROMPTS[i], max_tokens=24).choices[0].message.content

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == expected


def test_a_client_that_leaves_is_cancelled_streaming_or_not(paced_engine):
    # The paced demo's answer lasts over 3 s on any machine, so each job counts as cancelled, not
    # served, only if the server noticed its client leave; the next request is then served at once.
    body = {"model": "demo", "messages": [{"role": "user", "content": ONCE}], "max_tokens": 100000}
    with running(paced_engine) as (url, _):
        assert leave_mid_stream(url, "/v1/chat/completions", body, lines=6) == CANCELLED
        before = health(url)
        with pytest.raises(httpx.ReadTimeout):  # the client gives up on a non-streamed answer
            httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": False}, timeout=0.5)
        assert settled(url, before, jobs=1) == CANCELLED
        with client(url, timeout=30) as c:  # closed, or the server's stop waits for its connection
            assert ask(c, ONCE, max_tokens=8).choices[0].finish_reason == "length"
