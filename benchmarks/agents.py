"""A recorded coding-agent session replayed turn by turn: /v1/messages and /v1/responses against chat
completions on `specgen serve`, and against chat completions on `mlx_lm.server`, same model.

The session (one of ../shared/traces/agent_*.jsonl; its last line's prompt holds the whole
session) is 10-27K tokens, more than SmolLM2's 8K context, so it is cut, the same way for every
turn: the system prompt (mostly tool schemas) to its first --system-chars characters, the task to
--task-chars, each recorded assistant turn and tool result to --turn-chars, and only the first
--turns assistant turns are replayed. Turn k's prompt is the cut conversation before the
session's k-th assistant turn; the model answers it afresh (greedy, up to --max-tokens) and the
next turn carries the recorded assistant turn, not the model's answer: every prompt extends the
previous one, as an agent's do, so a prompt cache holds all but the new tool result. SmolLM2's
chat template has no tool format, so tool calls stay as the trace renders them (JSON lines in the
assistant's text) and tool results go in as user messages ("Tool result:" and the text).

Four replays a round, in an order that rotates by round: /v1/messages (the anthropic SDK),
/v1/responses (the openai SDK) and chat completions (the openai SDK) each on its own `specgen
serve` process, chat completions on `mlx_lm.server`, all streamed and greedy. Separate processes
keep each replay's prompt cache to itself; a line naming the round at the top of the system
prompt keeps one round's replays out of the cache of the round before, so every replay's first
turn prefills the whole prompt. Reported per route: the session's seconds, each turn's seconds
(medians over rounds), cached tokens per turn, tokens per step where the server says, and
whether all four replays produced the same text at every turn; ratios are medians over rounds
(min-max). Targets: every later turn faster than the first; each new route at least 0.97x chat
completions on specgen; specgen (each route) at least 1.5x mlx_lm.server over the whole session.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/agents.py --rounds 3

Prints one JSON object and writes it to --out. Model: the shared SmolLM2 in float32 (serve.py's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import anthropic
import openai
from serve import ROOT, SHARED, ask, float32_model, start

ROUTES = ("messages", "responses", "chat", "mlx_lm")  # the last on mlx_lm.server, the rest on specgen
MODEL = "smollm2"  # both specgen routes serve any name; mlx_lm.server is asked for its default model


def session(trace: Path, system_chars: int, task_chars: int, turn_chars: int) -> tuple[str, str, list[tuple[str, str]]]:
    """(system prompt, task, [(assistant turn, the tool result after it)]), each cut to its size."""
    whole = json.loads(trace.read_text().splitlines()[-1])
    parts = re.split(r"(?m)^<\|(system|user|assistant|tool)\|>\n", whole["prompt"] + whole["output"])
    blocks = list(zip(parts[1::2], parts[2::2]))
    system = next(text for role, text in blocks if role == "system")
    task = next(text for role, text in blocks if role == "user")
    turns, said = [], None
    for role, text in blocks:
        if role == "assistant":
            said = text.strip()
            turns.append((said[:turn_chars], ""))
        elif role == "tool" and said is not None:
            turns[-1] = (turns[-1][0], text.strip()[:turn_chars])
    return system[:system_chars], task[:task_chars], turns


def conversation(task: str, turns: list[tuple[str, str]], k: int) -> list[dict]:
    """The messages before assistant turn k (0-based): the task, then each earlier turn and its result."""
    messages = [{"role": "user", "content": task}]
    for said, result in turns[:k]:
        messages += [{"role": "assistant", "content": said},
                     {"role": "user", "content": f"Tool result:\n{result or '(no output)'}"}]
    return messages


def ask_messages(c: anthropic.Anthropic, system: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed /v1/messages request as an agent sends it; what ask() measures for chat. No
    temperature: the SDK no longer sends one, and specgen's default is greedy."""
    t0 = time.perf_counter()
    first = last = None
    text, stats = [], {}
    with c.messages.stream(model=MODEL, system=system, messages=messages, max_tokens=max_tokens) as s:
        for event in s:
            if event.type == "text":
                last = time.perf_counter()
                first = first or last
                text.append(event.text)
            elif event.type == "message_delta":  # specgen's statistics, where the server adds them
                stats = (event.model_extra or {}).get("specgen") or stats
        final = s.get_final_message()
    return {"text": "".join(text), "tokens": final.usage.output_tokens, "decode_s": (last - first) if first else 0.0,
            "latency_s": time.perf_counter() - t0, "cached": final.usage.cache_read_input_tokens,
            "tokens_per_step": stats.get("tokens_per_step")}


def ask_responses(c: openai.OpenAI, system: str, messages: list[dict], max_tokens: int) -> dict:
    """One streamed /v1/responses request, as Codex sends its history; what ask() measures."""
    t0 = time.perf_counter()
    first = last = done = None
    text = []
    for event in c.responses.create(model=MODEL, instructions=system, input=messages, max_output_tokens=max_tokens,
                                    temperature=0, store=False, stream=True):
        if event.type == "response.output_text.delta":
            last = time.perf_counter()
            first = first or last
            text.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):  # incomplete: max_output_tokens
            done = event.response
    stats = (done.model_extra or {}).get("specgen") or {}
    details = done.usage.input_tokens_details
    return {"text": "".join(text), "tokens": done.usage.output_tokens, "decode_s": (last - first) if first else 0.0,
            "latency_s": time.perf_counter() - t0, "cached": details.cached_tokens if details else None,
            "tokens_per_step": stats.get("tokens_per_step")}


def replay(route: str, client, system: str, task: str, turns: list[tuple[str, str]], max_tokens: int) -> list[dict]:
    """Every turn of the session through one route."""
    out = []
    for k in range(len(turns)):
        messages = conversation(task, turns, k)
        if route == "messages":
            out.append(ask_messages(client, system, messages, max_tokens))
        elif route == "responses":
            out.append(ask_responses(client, system, messages, max_tokens))
        else:
            out.append(ask(client, [{"role": "system", "content": system}, *messages], max_tokens, None))
    return out


def spread(values: list[float], digits: int = 3) -> dict:
    return {"median": round(statistics.median(values), digits), "min": round(min(values), digits),
            "max": round(max(values), digits)}


def summarise(runs: dict[str, list[list[dict]]]) -> dict:
    """Per route: session and per-turn seconds, cached tokens, tokens per step; ratios and targets."""
    rounds = len(runs["chat"])
    session_s = {r: [sum(t["latency_s"] for t in runs[r][i]) for i in range(rounds)] for r in ROUTES}
    by_turn = {r: [round(statistics.median(rnd[k]["latency_s"] for rnd in runs[r]), 2) for k in range(len(runs[r][0]))]
               for r in ROUTES}
    same = [all(len({runs[r][i][k]["text"] for r in ROUTES}) == 1 for i in range(rounds))
            for k in range(len(runs["chat"][0]))]
    ratio = {f"{r}_vs_chat": spread([c / s for c, s in zip(session_s["chat"], session_s[r])]) for r in ("messages", "responses")}
    ratio |= {f"{r}_vs_mlx_lm": spread([m / s for m, s in zip(session_s["mlx_lm"], session_s[r])]) for r in ROUTES[:3]}
    steps = {r: [t["tokens_per_step"] for rnd in runs[r] for t in rnd if t["tokens_per_step"]] for r in ROUTES[:3]}
    return {
        "session_s": {r: spread(v, 2) for r, v in session_s.items()},
        "latency_by_turn_s": by_turn,
        "cached_by_turn": {r: [t["cached"] for t in runs[r][-1]] for r in ROUTES},
        "tokens_per_step": {r: round(statistics.mean(v), 3) if v else None for r, v in steps.items()},
        "output_tokens": {r: sum(t["tokens"] for t in runs[r][-1]) for r in ROUTES},
        "ratios": ratio, "same_text_by_turn": same,
        "targets": {"later_turns_faster": {r: all(t < by_turn[r][0] for t in by_turn[r][1:]) for r in ROUTES[:3]},
                    "routes_vs_chat_0.97": {r: ratio[f"{r}_vs_chat"]["median"] >= 0.97 for r in ("messages", "responses")},
                    "specgen_vs_mlx_lm_1.5": {r: ratio[f"{r}_vs_mlx_lm"]["median"] >= 1.5 for r in ROUTES[:3]}},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder both servers load (default: the shared SmolLM2 in float32)")
    ap.add_argument("--trace", default=str(SHARED / "traces" / "agent_opus_firefox.jsonl"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--turns", type=int, default=10, help="assistant turns replayed, from the session's first")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--system-chars", type=int, default=6000)
    ap.add_argument("--task-chars", type=int, default=2000)
    ap.add_argument("--turn-chars", type=int, default=800)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "agents.json"))
    args = ap.parse_args()
    model = args.model or float32_model()
    (Path.home() / ".cache" / "huggingface" / "hub").mkdir(parents=True, exist_ok=True)  # mlx_lm's /v1/models
    system, task, turns = session(Path(args.trace), args.system_chars, args.task_chars, args.turn_chars)
    turns = turns[:args.turns]
    servers = {r: start("mlx_lm" if r == "mlx_lm" else "specgen", model, Path("/tmp") / f"bench-agents-{r}.log")
               for r in ROUTES}
    clients = {r: anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=900) if r == "messages"
               else openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=900)
               for r, (_, url) in servers.items()}
    runs = {r: [] for r in ROUTES}
    try:
        hello = [{"role": "user", "content": "Hello"}]
        for r in ROUTES:  # warm-up: each server's first request pays for loading kernels
            replay(r, clients[r], "Warm up.", hello[0]["content"], [("", "")], 8)
        for i in range(args.rounds):
            order = ROUTES[i % len(ROUTES):] + ROUTES[:i % len(ROUTES)]
            for r in order:
                runs[r].append(replay(r, clients[r], f"Round {i + 1}.\n{system}", task, turns, args.max_tokens))
                print(f"round {i + 1} {r}: {[round(t['latency_s'], 2) for t in runs[r][-1]]} s", file=sys.stderr)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    blas = "OpenBLAS" if "openblas" in os.environ.get("LD_PRELOAD", "") else "bundled BLAS"
    result = {"trace": Path(args.trace).name, "turns": len(turns), "rounds": args.rounds, "max_tokens": args.max_tokens,
              **summarise(runs), "model": model, "blas": blas}
    print(json.dumps(result), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
