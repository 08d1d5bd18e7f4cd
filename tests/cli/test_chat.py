"""`specgen chat` through a real pseudo-terminal (pexpect): streaming, each command, multi-line
input, history across sessions, Ctrl-C during an answer (the next turn still answers as if it had
not been asked), Ctrl-D, a context that fills; piped, one answer a line and nothing else; and the
Conversation underneath: each turn's greedy answer token for token the one a fresh run of the
same messages gives (`run --prompts`), while it prefills only the turn's own tokens."""

import json
import os
import subprocess
import sys

import pexpect
import pytest
from conftest import needs_smollm2
from typer.testing import CliRunner

from specgen.api.conversation import Conversation
from specgen.cli.commands import app
from specgen.engine.engine import Engine, Request
from specgen.engine.options import Options
from specgen.stats import RunStats

ONCE = "Once upon a time"
# `specgen`, its cost curve measured for half a second (as quick_calibration does in process)
SPECGEN = [sys.executable, "-c", "from specgen.engine.cost import calibrate; calibrate.BUDGET_S = 0.5; "
                                 "from specgen.cli.commands import main; main()"]


def spawn(tmp_path, *args, cache: str | None = None) -> pexpect.spawn:
    """`specgen chat ARGS` in a pseudo-terminal, at its first prompt; its cache (and so its
    history) the session's unless `cache`."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TERM": "dumb", "SPECGEN_MODEL": "demo",
           "XDG_CONFIG_HOME": str(tmp_path / "config"), **({"SPECGEN_CACHE_DIR": cache} if cache else {})}
    child = pexpect.spawn(SPECGEN[0], [*SPECGEN[1:], "chat", *args], env=env, encoding="utf-8", timeout=60,
                          dimensions=(40, 200))
    child.expect_exact(">>> ")
    return child


def turn(child: pexpect.spawn, text: str) -> str:
    """Send a message; what came back before the next prompt."""
    child.sendline(text)
    child.expect_exact(">>> ")
    return child.before


def test_a_session_streams_answers_and_runs_every_command(tmp_path, demo_engine):
    child = spawn(tmp_path, "-n", "24")
    said = turn(child, ONCE)
    assert ", there was a little girl named Lily" in said and "tok/s" in said  # the answer, then its summary
    assert "1 answer(s), 24 tokens" in turn(child, "/stats") and "plain decoding" in child.before
    assert "temperature = 0.5" in turn(child, "/set temperature 0.5")
    assert "is not a setting /set takes" in turn(child, "/set bogus 1")
    assert "temperature = 0" in turn(child, "/set temperature 0")
    child.sendline('"""')
    child.expect_exact("... ")
    child.sendline("The little")
    child.expect_exact("... ")
    multi = turn(child, 'dog"""')
    assert "tok/s" in multi  # one message of two lines, answered once
    saved = tmp_path / "talk.jsonl"
    assert "saved 2 turn(s)" in turn(child, f"/save {saved}")
    messages = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2 and messages[2]["content"] == "The little\ndog"
    assert "a new conversation" in turn(child, "/clear")
    assert "loaded 4 message(s)" in turn(child, f"/load {saved}")
    assert "system message set" in turn(child, "/system Be brief.")
    assert "/clear" in turn(child, "/help") and "/bye" in child.before
    assert "unknown command" in turn(child, "/nope")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_history_is_kept_across_sessions(tmp_path):
    history = str(tmp_path / "cache")
    child = spawn(tmp_path, "-n", "4", cache=history)
    turn(child, "Tom had a red ball")
    child.sendeof()  # Ctrl-D leaves
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    child = spawn(tmp_path, "-n", "4", cache=history)
    child.send("\x1b[A")  # up: the last session's line
    child.expect_exact("Tom had a red ball")
    child.sendline("")
    child.expect_exact(">>> ")
    child.sendintr()  # Ctrl-C at the prompt asks once more...
    child.expect_exact("Ctrl-C again")
    child.sendintr()  # ...and a second one leaves
    child.expect(pexpect.EOF)


def test_ctrl_c_stops_an_answer_and_the_next_turn_answers_as_if_it_had_not_been_asked(tmp_path):
    child = spawn(tmp_path, "-n", "480", "--draft", "0")
    for _ in range(5):  # the demo model is fast: try until the interrupt lands within an answer
        child.sendline(ONCE)
        child.expect_exact(", there was")
        child.sendintr()
        if child.expect_exact(["stopped: the turn is dropped", "Ctrl-C again"]) == 0:
            break
        child.expect_exact(">>> ")
        turn(child, "/clear")  # that answer finished: start afresh
    else:
        pytest.fail("no interrupt landed within an answer")
    child.expect_exact(">>> ")
    child.sendline("/set n 24")
    child.expect_exact(">>> ")
    assert ", there was a little girl named Lily" in turn(child, ONCE)
    assert "1 answer(s)" in turn(child, "/stats")  # the stopped turns left nothing


def test_a_conversation_that_fills_the_context_drops_its_oldest_turns_and_says_so(tmp_path):
    child = spawn(tmp_path, "-n", "100")
    long = " ".join(["the little dog ran to the park and played with the ball"] * 20)  # ~240 tokens
    turn(child, long)
    assert "oldest turn(s) were dropped to fit the context" in turn(child, long)


def test_piped_lines_are_turns_answered_one_after_another(tmp_path):
    done = subprocess.run([*SPECGEN, "chat", "-m", "demo", "-n", "12"], input=f"{ONCE}\n\nThe little dog\n",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith(", there was") and ">>>" not in done.stdout
    bad = subprocess.run([*SPECGEN, "chat", "-m", "demo", "--temp", "-1"], input="hi\n", capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "--temp" in bad.stderr  # as run's


def conversation_matches_fresh_runs(engine: Engine, questions: list[str], tmp_path, n: int = 24,
                                    prompts_file: bool = True) -> None:
    talk = Conversation(engine, Options(max_tokens=n))
    fresh_lines, previous = [], 0
    for q in questions:
        stats = RunStats()
        answer = "".join(r.text for r in talk.say(q, stats))
        messages = talk.messages  # the turns so far, this one's answer last
        alone = RunStats()
        ids = engine.encode(messages[:-1])
        list(engine.stream(Request(ids, Options(max_tokens=n)), alone))
        assert stats.output_ids == alone.output_ids and answer == messages[-1]["content"]
        if len(messages) > 2:  # the earlier turns were not prefilled again
            assert stats.cached_tokens >= previous, (stats.cached_tokens, previous)
        previous = len(ids) - 1  # what the next turn's cache holds at least: this prompt
        fresh_lines.append(json.dumps({"id": str(len(fresh_lines)), "messages": messages[:-1]}))
    if not prompts_file:
        return
    prompts = tmp_path / "turns.jsonl"
    prompts.write_text("\n".join(fresh_lines) + "\n")
    env = {"HF_HUB_OFFLINE": "1"}
    r = CliRunner().invoke(app, ["run", "-m", engine.loaded.spec.name, "-n", str(n), "--batch", "1", "--prompts", str(prompts)], env=env)
    assert r.exit_code == 0, r.output
    texts = [json.loads(line)["text"] for line in r.stdout.splitlines()]
    assert texts == [m["content"] for m in talk.messages if m["role"] == "assistant"]


@pytest.mark.usefixtures("quick_calibration")
def test_a_conversations_greedy_answers_are_fresh_runs_token_for_token(demo_engine, tmp_path):
    conversation_matches_fresh_runs(demo_engine, [ONCE, "The little dog", "Tom and Sue went"], tmp_path)


@needs_smollm2
@pytest.mark.usefixtures("quick_calibration")
def test_on_a_chat_model_too(smollm2_engine, tmp_path):
    # (the prompts file's path is the demo's test: here the chat template's turns, fresh runs by the engine)
    # Two turns: the second's fresh run prefills both (a 4-bit position costs ~140 ms on this CPU).
    conversation_matches_fresh_runs(smollm2_engine, ["Name three colours.", "And three animals?"], tmp_path,
                                    n=6, prompts_file=False)
