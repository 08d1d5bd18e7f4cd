"""Memory of a server that loads a second model and lets it go: `specgen serve -m demo -m MODEL
--max-models 1`, its resident set size (`ps -o rss`) at rest with the demo loaded, after MODEL
loads on its first request (the demo unloaded to make room), and after the demo is asked for
again (MODEL unloaded), over several rounds: the first load also imports what MODEL's tokenizer
needs, once. Issue 55: memory after the unload within ~10% of before the load.

    python benchmarks/models_memory.py --model ../shared/models/smollm2-135m-instruct-4bit --dtype float32
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def rss_mb(pid: int) -> float:
    return int(subprocess.run(["ps", "-o", "rss=", "-p", str(pid)], capture_output=True, text=True).stdout) / 1024


def settle(pid: int, seconds: float = 3.0) -> float:
    """RSS once the server has been idle a while (the smallest of a few readings)."""
    readings = []
    for _ in range(int(seconds / 0.5)):
        time.sleep(0.5)
        readings.append(rss_mb(pid))
    return min(readings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--rounds", type=int, default=3, help="load-and-unload cycles")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [sys.executable, "-m", "specgen", "serve", "-q", "-m", "demo", "-m", args.model, "--max-models", "1",
               "--port", str(port), *(["--dtype", args.dtype] if args.dtype else [])]
    server = subprocess.Popen(command, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    other = Path(args.model).name if Path(args.model).is_dir() else args.model
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)

        def ask(model: str) -> dict:
            r = httpx.post(f"{url}/api/generate", json={"model": model, "prompt": "Once upon a time", "stream": False,
                                                        "options": {"num_predict": 16}}, timeout=600)
            r.raise_for_status()
            return r.json()

        ask("demo")
        rounds = [{"before": settle(server.pid)}]
        for n in range(args.rounds):
            loaded = ask(other)
            rounds[-1]["loaded"], rounds[-1]["load_s"] = settle(server.pid), loaded["load_duration"] / 1e9
            ask("demo")
            rounds[-1]["after"] = settle(server.pid)
            if n + 1 < args.rounds:
                rounds.append({"before": rounds[-1]["after"]})
        for r in rounds:  # MB; after / before is what an unload gives back
            print(json.dumps({"model": args.model, "dtype": args.dtype, **{k: round(v, 2) for k, v in r.items()},
                              "after_over_before": round(r["after"] / r["before"], 3)}))
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
