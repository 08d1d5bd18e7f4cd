"""`specgen serve` against `mlx_lm.server` on the same model, through the official openai client.

Both servers run as subprocesses on loopback ports; every conversation goes to both, in turn (which
goes first alternates), each server carrying its own replies into the next turn as a client
would. Sets: input-grounded and code-edit prompts (code edits also with the code being edited as
`prediction`, which mlx_lm.server does not take), 3-turn chats, and an agent loop (a recorded
coding-agent session's system prompt and task, each turn the model's own reply and the session's
next recorded tool result appended). Decode tok/s is (tokens - 1) / (last token - first token)
as a streaming client sees it; latency is the whole request. Texts are compared turn by turn.
Every round's requests are new to both servers (each starts with its own tag).

    apt-get install -y libopenblas0-pthread
    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/serve.py --rounds 2

With no --model, the shared SmolLM2 is dequantized to float32 into /tmp once (mlx_lm.server has no
--dtype). Prints one JSON line per set and writes them all to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
SETS = ROOT / "benchmarks" / "prompts"
FOLLOW_UPS = ["Can you explain that in more detail?", "Now summarise your answer in one sentence."]


def float32_model() -> str:
    out = Path("/tmp/specgen-bench-smollm2-f32")
    if not (out / "config.json").exists():
        subprocess.run([sys.executable, "-m", "mlx_lm", "convert", "--hf-path",
                        str(SHARED / "models" / "smollm2-135m-instruct-4bit"), "--mlx-path", str(out),
                        "--dequantize", "--dtype", "float32"], check=True)
    return str(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str, model: str, log: Path, extra: list[str] = ()) -> tuple[subprocess.Popen, str]:
    """`specgen serve` or `mlx_lm.server` (with `extra` flags) on a free loopback port, once healthy."""
    port = free_port()
    cmd = ([sys.executable, "-m", "specgen", "serve", "-m", model, "--port", str(port)] if name == "specgen"
           else [sys.executable, "-m", "mlx_lm", "server", "--model", model, "--port", str(port)]) + list(extra)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{name} did not start: see {log}")
        time.sleep(0.5)


@contextlib.contextmanager
def both(model: str, tag: str, extra: list[str] = (), timeout: float = 1800):
    """`specgen serve` (with `extra` flags) and `mlx_lm.server` on `model`, logs in
    /tmp/bench-{tag}-NAME.log: an openai client of each by name; both stopped after, however it ends."""
    servers = {}
    try:
        for name in ("specgen", "mlx_lm"):
            flags = extra if name == "specgen" else []
            servers[name] = start(name, model, Path(f"/tmp/bench-{tag}-{name}.log"), flags)
        yield {k: openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=timeout)
               for k, (_, url) in servers.items()}
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)


def ask(c: openai.OpenAI, messages: list[dict], max_tokens: int, prediction: str | None) -> dict:
    """One streamed request: its text and timings as the client saw them."""
    extra = {"prediction": {"type": "content", "content": prediction}} if prediction else {}
    t0 = time.perf_counter()
    first = last = None
    text, usage, stats = [], None, None
    for chunk in c.chat.completions.create(model="default_model", messages=messages, max_tokens=max_tokens,
                                           temperature=0.0, stream=True, stream_options={"include_usage": True},
                                           extra_body=extra):
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or now
            last = now
            text.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
        stats = (chunk.model_extra or {}).get("specgen") or stats
    end = time.perf_counter()
    n = usage.completion_tokens if usage else len(text)
    return {"text": "".join(text), "tokens": n, "decode_s": (last - first) if first else 0.0,
            "latency_s": end - t0, "cached": usage.prompt_tokens_details.cached_tokens
            if usage and usage.prompt_tokens_details else None,
            "tokens_per_step": stats and stats["tokens_per_step"],
            "accepted_prediction": usage.completion_tokens_details.accepted_prediction_tokens
            if usage and usage.completion_tokens_details and stats else None}


def fresh(case: dict, tag: str) -> dict:
    """`case` with its first user message starting with its own tag: a request neither server has
    seen (their prompt caches and drafters remember earlier answers), the same for both."""
    messages = list(case["messages"])
    i = next(i for i, m in enumerate(messages) if m["role"] == "user")
    messages[i] = {**messages[i], "content": f"Request {tag}.\n\n{messages[i]['content']}"}
    return {**case, "messages": messages}


def conversation(c, case: dict, max_tokens: int, with_prediction: bool) -> list[dict]:
    """Every turn of one case against one server: the server's own replies carried forward."""
    messages, turns = list(case["messages"]), []
    for i in range(case["turns"]):
        turn = ask(c, messages, max_tokens, case.get("prediction") if with_prediction else None)
        turns.append(turn)
        messages.append({"role": "assistant", "content": turn["text"]})
        if i + 1 < case["turns"]:
            messages.append(case["next"][i])
    return turns


def single(rows: list[dict], n: int) -> list[dict]:
    return [{"messages": r.get("messages") or [{"role": "user", "content": r["prompt"]}], "turns": 1,
             "prediction": _code(r.get("prompt", ""))} for r in rows[:n]]


def _code(prompt: str) -> str | None:
    found = re.search(r"## Code Before\n```\w*\n(.*?)```", prompt, re.S)
    return found.group(1) if found else None


def chats(rows: list[dict], n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": r["prompt"]}], "turns": 3,
             "next": [{"role": "user", "content": f} for f in FOLLOW_UPS]} for r in rows[:n]]


def agent(trace: Path, turns: int, system_chars: int, task_chars: int, tool_chars: int) -> list[dict]:
    """One recorded agent session as a loop: its system prompt (tool schemas) and task, cut to fit
    the model's context, then after each reply the session's next tool result."""
    last = json.loads(trace.read_text().splitlines()[-1])["prompt"]
    parts = re.split(r"(?m)^<\|(system|user|assistant|tool)\|>\n", last)
    blocks = list(zip(parts[1::2], parts[2::2]))
    system = next(t for r, t in blocks if r == "system")[:system_chars]
    task = next(t for r, t in blocks if r == "user")[:task_chars]
    results = [t[:tool_chars] for r, t in blocks if r == "tool" and t.strip()]
    return [{"messages": [{"role": "system", "content": system}, {"role": "user", "content": task}],
             "turns": turns, "next": [{"role": "user", "content": f"Tool result:\n{t}"} for t in results]}]


def summarise(name: str, runs: dict) -> dict:
    """Per round: decode tok/s over all of a set's turns (tokens / decode seconds) for each server."""
    def tps(turns):
        return sum(t["tokens"] - 1 for t in turns) / max(sum(t["decode_s"] for t in turns), 1e-9)

    rounds = len(runs["specgen"])
    sg = [tps([t for conv in runs["specgen"][r] for t in conv]) for r in range(rounds)]
    ml = [tps([t for conv in runs["mlx_lm"][r] for t in conv]) for r in range(rounds)]
    ratios = [a / b for a, b in zip(sg, ml)]
    flat = {k: [t for rnd in v for conv in rnd for t in conv] for k, v in runs.items()}
    same = all(a["text"] == b["text"] for a, b in zip(flat["specgen"], flat["mlx_lm"]))
    out = {"set": name, "mlx_lm_tps": round(statistics.median(ml), 2), "specgen_tps": round(statistics.median(sg), 2),
           "speedup_median": round(statistics.median(ratios), 3), "speedup_min": round(min(ratios), 3),
           "speedup_max": round(max(ratios), 3),
           "latency_s": {k: round(statistics.median(t["latency_s"] for t in v), 3) for k, v in flat.items()},
           "tokens_per_step": round(statistics.mean(t["tokens_per_step"] or 1 for t in flat["specgen"]), 3),
           "identical": same, "turns": len(flat["specgen"])}
    if runs["specgen"][0][0][0].get("accepted_prediction") is not None:
        out["accepted_prediction_tokens"] = sum(t["accepted_prediction"] or 0 for t in flat["specgen"])
    per_turn = max(len(conv) for conv in runs["specgen"][0])
    if per_turn > 2:  # loops: how each turn's latency goes as the conversation grows
        out["latency_by_turn_s"] = {k: [round(statistics.median(rnd[c][i]["latency_s"] for rnd in v for c in range(len(rnd))), 2)
                                        for i in range(per_turn)] for k, v in runs.items()}
        out["cached_by_turn"] = [t["cached"] for t in runs["specgen"][-1][0]]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder both servers load (default: the shared SmolLM2 in float32)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--agent-turns", type=int, default=6)
    ap.add_argument("--agent-trace", default=str(SHARED / "traces" / "agent_gemma_vllm.jsonl"))
    ap.add_argument("--sets", nargs="+", default=["grounded", "code_edit", "code_edit+prediction", "chat3", "agent"])
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "serve.jsonl"))
    args = ap.parse_args()
    model = args.model or float32_model()
    (Path.home() / ".cache" / "huggingface" / "hub").mkdir(parents=True, exist_ok=True)  # mlx_lm's /v1/models
    rows = {s: [json.loads(line) for line in (SETS / f"{s}.jsonl").read_text().splitlines()]
            for s in ("grounded", "code_edit", "chat")}
    cases = {"grounded": single(rows["grounded"], args.prompts), "code_edit": single(rows["code_edit"], args.prompts),
             "code_edit+prediction": single(rows["code_edit"], args.prompts), "chat3": chats(rows["chat"], args.prompts // 2),
             "agent": agent(Path(args.agent_trace), args.agent_turns, 6000, 2000, 1200)}
    results = []
    with both(model, "serve", timeout=900) as clients:
        for c in clients.values():  # warm-up: both servers' first request pays for loading kernels
            ask(c, [{"role": "user", "content": "Hello"}], 8, None)
        for name in args.sets:
            runs = {"specgen": [], "mlx_lm": []}
            for r in range(args.rounds):
                for k in runs:
                    runs[k].append([])
                for i, case in enumerate(cases[name]):
                    order = ["specgen", "mlx_lm"] if (r + i) % 2 == 0 else ["mlx_lm", "specgen"]
                    case = fresh(case, f"{name} {r}.{i}")
                    for k in order:
                        runs[k][r].append(conversation(clients[k], case, args.max_tokens,
                                                       name.endswith("+prediction") and k == "specgen"))
            row = summarise(name, runs)
            print(json.dumps(row), flush=True)
            results.append(row)
    blas = "OpenBLAS" if "openblas" in os.environ.get("LD_PRELOAD", "") else "bundled BLAS"
    Path(args.out).write_text("".join(json.dumps({**r, "model": model, "blas": blas}) + "\n" for r in results))


if __name__ == "__main__":
    main()
