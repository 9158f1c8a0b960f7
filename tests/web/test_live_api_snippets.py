"""The API-keys dialog's snippets work as pasted: the key created through /api/keys, the base URL
and the model id it answers, the dialog's own snippets() (frontend/src/chat/keys.ts, run with
node) and then curl, the openai SDK (plain and with a tool) and the anthropic SDK against the
live stack.

The tool snippet runs one round of a tool loop. It must succeed where the server accepts `tools`;
a server that refuses them (before issue 25's tool calls) must refuse with the OpenAI SDK's
BadRequestError naming `tools`, not fail in the snippet itself."""
import json
import shutil
import subprocess
import sys

import httpx
import pytest
from django.test import Client

from tests.support import procs

pytestmark = pytest.mark.django_db(transaction=True)
FRONTEND = procs.ROOT / "frontend"
ENTRY = ('import { snippets } from "./src/chat/keys"; '
         "process.stdout.write(JSON.stringify(snippets(process.argv[2], process.argv[3], process.argv[4])));")


def dialog_snippets(key, base_url, model):
    esbuild = FRONTEND / "node_modules" / ".bin" / "esbuild"
    if not esbuild.exists() or not shutil.which("node"):
        pytest.skip("the frontend toolchain (node, esbuild) is not installed")
    bundle = subprocess.run([str(esbuild), "--bundle", "--platform=node", "--format=cjs", "--loader=ts",
                             "--log-level=warning"], input=ENTRY, cwd=FRONTEND, capture_output=True, text=True,
                            check=True, timeout=60).stdout
    out = subprocess.run(["node", "-", key, base_url, model], input=bundle, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return {s["label"]: s["code"] for s in json.loads(out)}


def test_the_pasted_snippets_answer(live_stack, alice):
    client = Client()
    client.force_login(alice)
    created = client.post("/api/keys", {"name": "snippets"}, content_type="application/json").json()
    assert created["base_url"] == "http://testserver/v1" and created["model"]
    # The live site's own answers (this process's settings name another model file).
    base_url = live_stack.url + "/v1"
    model = httpx.get(base_url + "/models", headers={"Authorization": f"Bearer {created['key']}"}).json()["data"][0]["id"]
    snippets = dialog_snippets(created["key"], base_url, model)
    assert set(snippets) == {"curl", "Python (openai)", "Python (openai, tools)", "Python (anthropic)"}
    assert all(created["key"] in code and model in code for code in snippets.values())

    curl = subprocess.run(["bash", "-c", snippets["curl"]], capture_output=True, text=True, timeout=60)
    assert curl.returncode == 0 and json.loads(curl.stdout).get("object") == "chat.completion", curl.stdout[:300]
    for label in ("Python (openai)", "Python (anthropic)"):
        run = subprocess.run([sys.executable, "-c", snippets[label]], capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, (label, run.stderr[-500:])

    tools = snippets["Python (openai, tools)"]
    assert '"name": "get_weather"' in tools and "tools=tools" in tools and '"role": "tool"' in tools
    probe = httpx.post(base_url + "/chat/completions", headers={"Authorization": f"Bearer {created['key']}"}, timeout=60,
                       json={"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}],
                             "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]})
    run = subprocess.run([sys.executable, "-c", tools], capture_output=True, text=True, timeout=120)
    if probe.status_code == 200:
        assert run.returncode == 0, run.stderr[-800:]
        # it ends printing the reply's content, which may be empty (the stack's tiny random model,
        # sampled, sometimes ends its turn at once) or span lines; a tool round, when the model chose
        # one, is printed first, one "call:" line per call of the one tool offered
        assert run.stdout.endswith("\n"), f"the snippet printed no reply: {run.stdout!r}"
        calls = [line for line in run.stdout.split("\n") if line.startswith("call:")]
        assert all(line.startswith("call: get_weather {") for line in calls), run.stdout
    else:  # tools not accepted by this server yet: the snippet's request is what is refused
        assert probe.status_code == 400 and "tools" in probe.text, probe.text[:300]
        assert run.returncode != 0 and "BadRequestError" in run.stderr and "tools" in run.stderr, run.stderr[-800:]
