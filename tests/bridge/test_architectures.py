"""Every architecture the engine runs, through the web app's path (issue 15 item 4): the engine
on each architecture's fixture (native/tools/make_arch_fixture.py) announces the architecture and
its chat template on the MODEL line, the bridge publishes them, engine_bridge.prompting renders
the conversation with that template (the family's prompt format), and one turn completes."""
import asyncio
from datetime import datetime

import pytest
from gguf import GGUFReader

from engine_bridge import prompting, telemetry
from engine_bridge.request import GenerationRequest
from tests.bridge.conftest import bridge_env
from tests.bridge.helpers import collect, final, text_of
from tests.support import procs

ARCHS = ["qwen3moe", "olmoe", "qwen2moe", "granitemoe", "glm4moe"]
MESSAGES = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Name a river."}]


def expected(arch, eos):
    """The prompt each family's format gives for MESSAGES (with the generation prompt)."""
    if arch in ("qwen3moe", "qwen2moe"):
        system = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" if arch == "qwen2moe" else ""
        return (system + "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
                "<|im_start|>user\nName a river.<|im_end|>\n<|im_start|>assistant\n")
    if arch == "olmoe":
        return f"<|user|>\nHi\n<|assistant|>\nHello!{eos}\n<|user|>\nName a river.\n<|assistant|>\n"
    if arch == "granitemoe":
        today = datetime.now().strftime("%B %d, %Y")
        return ("<|start_of_role|>system<|end_of_role|>Knowledge Cutoff Date: April 2024.\nToday's Date: "
                f"{today}.\nYou are Granite, developed by IBM.<|end_of_text|>\n"
                "<|start_of_role|>user<|end_of_role|>Hi<|end_of_text|>\n"
                "<|start_of_role|>assistant<|end_of_role|>Hello!<|end_of_text|>\n"
                "<|start_of_role|>user<|end_of_role|>Name a river.<|end_of_text|>\n"
                "<|start_of_role|>assistant<|end_of_role|>")
    return "[gMASK]<sop><|user|>\nHi<|assistant|>\nHello!<|user|>\nName a river.<|assistant|>"


@pytest.fixture(scope="module")
def arch_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("arch-models")
    out = {}
    for arch in ARCHS:
        out[arch] = d / f"{arch}.gguf"
        procs.make_arch_fixture(out[arch], arch)
    return out


@pytest.mark.parametrize("arch", ARCHS)
def test_the_family_template_renders(arch, arch_models):
    r = GGUFReader(str(arch_models[arch]))
    f = r.fields["tokenizer.chat_template"]
    template = bytes(f.parts[f.data[0]]).decode()
    prompt = prompting.render_prompt(MESSAGES, template=template, bos_token="", eos_token="<|im_end|>")
    assert prompt == expected(arch, "<|im_end|>")


@pytest.mark.parametrize("arch", ARCHS)
async def test_one_chat_turn_per_architecture(arch, arch_models, engine_binary, redis_url):
    proc = procs.start_bridge(bridge_env(redis_url, ENGINE_BINARY=str(engine_binary),
                                         ENGINE_MODEL=str(arch_models[arch]), CTX="512"))
    try:
        state = await telemetry.aget_state()
        model = state["model"]
        assert model["arch"] == arch and model["chat_template"], model
        template, bos, eos = await asyncio.to_thread(prompting.template_source)
        assert template == model["chat_template"]
        prompt = prompting.render_prompt(MESSAGES, template=template, bos_token=bos, eos_token=eos)
        assert prompt == expected(arch, eos)
        events = await collect(GenerationRequest(prompt=prompt, max_tokens=8))
        done = final(events)
        assert done["kind"] == "done", done
        accepted = next(e for e in events if e["kind"] == "accepted")
        assert accepted["prompt_tokens"] > 10
        assert done["usage"]["completion_tokens"] >= 1 or text_of(events) == ""
    finally:
        procs.stop(proc)
