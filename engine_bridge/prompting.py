"""Renders chat messages into the engine prompt with the model's own jinja2 chat template.

The template is always named by the caller: the one of the model the request goes to (its
engine_bridge.served.ServedModel: the MODEL line the engine sent, settings.CHAT_TEMPLATE, or
ChatML). A default would render for the default model whatever the request's model is. Rendering is a pure function of the messages, so the history of turn N+1 is
byte-identical to the prompt + output of turn N and the engine keeps its KV prefix.
"""
import json
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CHATML_TOKENS = {"bos_token": "", "eos_token": "<|im_end|>"}


class TemplateError(Exception):
    """The chat template refused the messages (raise_exception) or failed to render."""


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(value: object, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False) -> str:
    # Hugging Face templates expect json.dumps semantics, not jinja's HTML-escaping tojson.
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


# Same options as transformers' template environment (trim_blocks/lstrip_blocks change output).
_env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
_env.filters["tojson"] = _tojson
_env.globals["raise_exception"] = _raise_exception
_env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)


def template_source() -> tuple[str, str, str]:
    """(template, bos_token, eos_token) for the served model (engine_bridge.served: the MODEL
    line's, else settings.CHAT_TEMPLATE, else ChatML)."""
    from engine_bridge.served import served_model_get

    m = served_model_get()
    return m.template, m.bos_token, m.eos_token


_compiled: dict[str, jinja2.Template] = {}


def render_prompt(messages: list[dict[str, Any]], *, template: str, add_generation_prompt: bool = True,
                  bos_token: str = "", eos_token: str = "", extra: dict[str, Any] | None = None) -> str:
    """messages: [{"role", "content"}] -> prompt string in `template` (a model's own: the caller
    names it, from the ServedModel its request goes to; engine_bridge.toolsyntax.render does for
    the surfaces and the chat page). Raises TemplateError. `extra`: more template variables
    (`tools`, from engine_bridge.toolsyntax.prepare; `enable_thinking`)."""
    compiled = _compiled.get(template)
    if compiled is None:
        try:
            compiled = _compiled[template] = _env.from_string(template)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"bad chat template: {exc}") from exc
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "",
            eos_token=eos_token or "",
            **(extra or {}),
        )
    except TemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise TemplateError(f"chat template failed: {exc}") from exc
