"""The real coding agents against `specgen serve`: Claude Code over /v1/messages, Codex over /v1/responses.

Both clients are installed from npm by tests/agents/install_clients.sh (pinned, cached outside
the repository) and run headless, each with its own config folder under the test's temporary
directory, telemetry and update checks off, their prompts shrunk by their own flags to fit the
shared SmolLM2's 8K context (tests/agents/README.md says how and what they send). A recording
proxy between client and server keeps the requests, so the text a client prints is compared with
what the server answers to the very same request, not streamed. Claude Code's full-size request
(its own system prompt and tools, tests/agents/requests/claude_full.json) is refused with
Anthropic's context-overflow 400, by the server and as the client reports it.

The server's model says ANSWER to any prompt, through SmolLM2's tokenizer, template and context:
the clients' protocol does not depend on the weights, and the 4-bit SmolLM2 takes ~45 s to read a
client's ~300-token prompt on a CPU (its answers to the same recorded requests are tested in
tests/serve/apis/test_serve_anthropic.py and test_serve_responses.py).
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import httpx
import mlx.core as mx
import numpy as np
import pytest
from conftest import SMOLLM2, TEMPLATE, needs_smollm2
from mlx import nn
from mlx_lm.models.cache import KVCache
from mlx_lm.utils import load_tokenizer
from servers import running

from specgen.engine.engine import Engine
from specgen.engine.load import registry

AGENTS = Path(__file__).resolve().parents[1] / "agents"
KEY = "sk-specgen-test"
PROMPT = "Say hello."
CLIENT_S = 300  # one client run, start to exit
ANSWER = "Hello! How can I help you today?"
OVERFLOW = re.compile(r"input length and `?max_tokens`? exceed context limit: (\d+) \+ (\d+) > (\d+)")

pytestmark = [needs_smollm2, pytest.mark.usefixtures("quick_calibration")]  # the curve is not checked here

CODEX_CONFIG = """\
model = "smollm2"
model_provider = "specgen"
model_instructions_file = "instructions.md"
check_for_update_on_startup = false
web_search = "disabled"
approval_policy = "never"
sandbox_mode = "read-only"
[analytics]
enabled = false
[feedback]
enabled = false
[agents]
enabled = false
[skills.bundled]
enabled = false
[tools.experimental_request_user_input]
enabled = false
[history]
persistence = "none"
[features]
apps = false
plugins = false
view_image = false
goals = false
shell_tool = false
unified_exec = false
skill_search = false
[model_providers.specgen]
name = "specgen"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "SPECGEN_API_KEY"
"""


@pytest.fixture(scope="session")
def agent_clients() -> dict[str, str]:
    """{"claude": path, "codex": path}: the pinned clients, installed once into the user's cache."""
    if shutil.which("npm") is None:
        pytest.skip("the agent clients install with npm (Node.js 18 or later)")
    done = subprocess.run(["bash", str(AGENTS / "install_clients.sh")], capture_output=True, text=True, timeout=1800,
                          check=False)
    assert done.returncode == 0, done.stderr
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


class Answering(nn.Module):
    """A model that answers any prompt with `script` (tokens that each occur once in it): each
    token's next is fixed, the script's first after any token outside it (a prompt's last)."""

    def __init__(self, script: list[int], vocab: int, config: dict):
        super().__init__()
        assert len(set(script)) == len(script)
        self.args = SimpleNamespace(**config)  # SmolLM2's, so its 8K context
        following = np.full(vocab, script[0])
        following[script[:-1]] = script[1:]
        self.following = mx.array(following)
        self.vocab = vocab

    def make_cache(self):
        return [KVCache()]

    def __call__(self, x, cache=None):
        n = x.shape[1]
        cache[0].update_and_fetch(mx.zeros((x.shape[0], 1, n, 1)), mx.zeros((x.shape[0], 1, n, 1)))
        return (mx.arange(self.vocab) == self.following[x][..., None]).astype(mx.float32)


@pytest.fixture(scope="module")
def answering_engine(tmp_path_factory) -> Engine:
    """A model that says ANSWER and ends its turn, with SmolLM2's tokenizer, 8K context and a
    ChatML template that writes the tools' schemas into the prompt, as a tool-calling model's
    does: Claude Code's full-size request then holds 12K tokens."""
    folder = tmp_path_factory.mktemp("smollm2-tools")
    for name in ("config.json", "tokenizer.json"):
        (folder / name).symlink_to(SMOLLM2 / name)
    config = json.loads((SMOLLM2 / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    model_config = json.loads((SMOLLM2 / "config.json").read_text())
    tokenizer = load_tokenizer(folder, eos_token_ids=model_config.get("eos_token_id"))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    script = tokenizer.encode(ANSWER, add_special_tokens=False) + [end]
    return Engine(registry.wrap(Answering(script, len(tokenizer.get_vocab()), model_config), tokenizer))


class _Forward(BaseHTTPRequestHandler):
    """Passes each request on to the server unchanged, keeping (path, JSON body)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.server.seen.append((self.path, json.loads(body)))
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("host", "content-length", "connection", "accept-encoding")}
        with httpx.stream("POST", self.server.target + self.path, content=body, headers=headers,
                          timeout=CLIENT_S) as answer:
            self.send_response(answer.status_code)
            self.send_header("content-type", answer.headers.get("content-type", "application/json"))
            self.send_header("connection", "close")  # the body runs to the end of the connection
            self.end_headers()
            for chunk in answer.iter_raw():
                self.wfile.write(chunk)
                self.wfile.flush()
        self.close_connection = True


@contextlib.contextmanager
def recording(url: str):
    """A loopback proxy in front of `url`: yields (its URL, the list of (path, body) it passed on)."""
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), _Forward)
    proxy.target, proxy.seen = url, []
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{proxy.server_address[1]}", proxy.seen
    finally:
        proxy.shutdown()
        proxy.server_close()
        thread.join(10)


def _env(home: Path, **extra) -> dict[str, str]:
    """A client's whole environment: no keys, settings or proxies of the machine's own."""
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **extra}


def claude(binary: str, url: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """`claude -p PROMPT --output-format json ARGS` against `url`, its config under `tmp`."""
    env = _env(tmp / "home", ANTHROPIC_BASE_URL=url, ANTHROPIC_API_KEY=KEY, CLAUDE_CONFIG_DIR=str(tmp / "claude"),
               DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", DISABLE_AUTOUPDATER="1",
               CLAUDE_CODE_MAX_OUTPUT_TOKENS="48")
    return subprocess.run([binary, "-p", PROMPT, "--output-format", "json", "--no-session-persistence", *args],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=CLIENT_S, check=False)


def codex(binary: str, url: str, tmp: Path) -> list[dict]:
    """`codex exec --json PROMPT` against `url` with the small config; its JSONL events."""
    home = tmp / "codex"
    home.mkdir(exist_ok=True)
    (home / "config.toml").write_text(CODEX_CONFIG.format(url=url))
    (home / "instructions.md").write_text("You are a helpful assistant.\n")
    done = subprocess.run([binary, "exec", "--json", "--strict-config", "--skip-git-repo-check", PROMPT],
                          cwd=tmp, env=_env(tmp / "home", CODEX_HOME=str(home), SPECGEN_API_KEY=KEY),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=CLIENT_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_claude_code_completes_a_turn_with_the_servers_text_and_its_next_run_hits_the_prompt_cache(
        answering_engine, agent_clients, tmp_path):
    shrink = ("--system-prompt", "You are a helpful assistant.", "--tools", "")
    with running(answering_engine, model_name="smollm2", api_key=KEY) as (url, _), recording(url) as (proxy, seen):
        first = claude(agent_clients["claude"], proxy, tmp_path, *shrink)
        again = claude(agent_clients["claude"], proxy, tmp_path, *shrink)
        (path, body), _ = seen
        plain = httpx.post(f"{url}/v1/messages", json={**body, "stream": False}, headers={"x-api-key": KEY},
                           timeout=CLIENT_S)
    assert first.returncode == 0, first.stdout + first.stderr
    out, out_again = json.loads(first.stdout), json.loads(again.stdout)
    assert path == "/v1/messages?beta=true" and body["stream"] is True
    text = "".join(b["text"] for b in plain.json()["content"] if b["type"] == "text")
    assert text == ANSWER and not out["is_error"] and out["result"] == text
    assert out["usage"]["output_tokens"] == plain.json()["usage"]["output_tokens"]
    # The same prompt again, billing header and all: all but its last token come from the cache.
    assert out_again["result"] == text
    prompt = out["usage"]["input_tokens"] + out["usage"]["cache_read_input_tokens"]
    assert (out_again["usage"]["input_tokens"], out_again["usage"]["cache_read_input_tokens"]) == (1, prompt - 1)


def test_codex_completes_a_turn_with_the_servers_text_and_its_next_run_hits_the_prompt_cache(
        answering_engine, agent_clients, tmp_path):
    with running(answering_engine, model_name="smollm2", api_key=KEY) as (url, _), recording(url) as (proxy, seen):
        events = codex(agent_clients["codex"], proxy, tmp_path)
        again = codex(agent_clients["codex"], proxy, tmp_path)
        (path, body), _ = seen
        plain = httpx.post(f"{url}/v1/responses", json={**body, "stream": False},
                           headers={"authorization": f"Bearer {KEY}"}, timeout=CLIENT_S)
    assert path == "/v1/responses" and body["stream"] is True and body["tools"] == []
    said = [e["item"]["text"] for e in events if e["type"] == "item.completed" and e["item"]["type"] == "agent_message"]
    text = "".join(part["text"] for item in plain.json()["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")
    assert text == ANSWER and said == [text]
    assert events[-1]["type"] == "turn.completed"
    assert events[-1]["usage"]["output_tokens"] == plain.json()["usage"]["output_tokens"]
    usage = again[-1]["usage"]
    assert again[-1]["type"] == "turn.completed" and usage["cached_input_tokens"] == usage["input_tokens"] - 1


def test_claude_codes_full_size_request_is_a_400_that_names_the_overflow(answering_engine, agent_clients, tmp_path):
    request = json.loads((AGENTS / "requests" / "claude_full.json").read_text())
    with running(answering_engine, model_name="smollm2") as (url, _):
        refused = httpx.post(f"{url}/v1/messages?beta=true", json=request, headers={"x-api-key": KEY}, timeout=60)
        client = claude(agent_clients["claude"], url, tmp_path)  # its own system prompt and tools
        after = httpx.post(f"{url}/v1/messages", json={"model": "m", "max_tokens": 4, "messages": [
            {"role": "user", "content": PROMPT}]}, headers={"x-api-key": KEY}, timeout=60)
    assert refused.status_code == 400
    error = refused.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    found = OVERFLOW.search(error["error"]["message"])
    assert found, error
    prompt, _, context = map(int, found.groups())
    assert prompt > context == 8192
    # The client reads the 400 as a prompt too long for the model, final (a 5xx it would retry).
    out = json.loads(client.stdout)
    assert client.returncode == 1 and out["is_error"] and out["api_error_status"] == 400
    assert out["terminal_reason"] == "prompt_too_long" and out["result"].startswith("Prompt is too long")
    assert after.status_code == 200
