"""Structured output end to end: Daphne + bridge + native engine on the fixture model, with the
official openai SDK's own helpers: chat.completions.parse(response_format=<pydantic model>),
responses.parse(text_format=...), and a json_object request. The engine's grammar constrains
every token, so even the random-weight model's reply parses into the model."""
import json
from typing import Literal

import openai
import pytest
from pydantic import BaseModel, Field

from api.models import ApiKey

pytestmark = pytest.mark.django_db(transaction=True)
MESSAGES = [{"role": "user", "content": "Describe a city as JSON."}]


class Street(BaseModel):
    name: str = Field(max_length=12)
    number: int


class City(BaseModel):
    name: str
    population: int
    coastal: bool
    kind: Literal["town", "city", "village"]
    streets: list[Street] = Field(max_length=2)


@pytest.fixture
def sdk(live_stack, alice):
    key = ApiKey.issue(user=alice, name="live")[1]
    return openai.OpenAI(base_url=live_stack.url + "/v1", api_key=key, max_retries=0, timeout=120)


@pytest.fixture
def model(sdk):
    return sdk.models.list().data[0].id


@pytest.mark.parametrize("temperature", [0, 1])
def test_chat_completions_parse_returns_the_pydantic_object(sdk, model, temperature):
    r = sdk.chat.completions.parse(model=model, messages=MESSAGES, response_format=City, temperature=temperature,
                                   max_completion_tokens=400, seed=3)
    choice = r.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, City), choice.message.content
    assert City.model_validate_json(choice.message.content) == choice.message.parsed


def test_responses_parse_returns_the_pydantic_object(sdk, model):
    r = sdk.responses.parse(model=model, input="Describe a city.", text_format=City, temperature=1,
                            max_output_tokens=400)
    assert r.status == "completed"
    assert isinstance(r.output_parsed, City), r.output_text


def test_json_object_streams_a_json_object(sdk, model):
    stream = sdk.chat.completions.create(model=model, messages=MESSAGES, response_format={"type": "json_object"},
                                         temperature=1, max_tokens=300, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert isinstance(json.loads(text), dict), text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_a_bad_schema_is_a_400_naming_the_field(sdk, model):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model=model, messages=MESSAGES, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
                "xs": {"type": "array", "uniqueItems": True}}}}})
    assert info.value.body["param"] == "response_format.json_schema.schema.properties.xs.uniqueItems"


@pytest.mark.parametrize("field", ["output_format", "output_config"])
def test_anthropic_structured_output_is_held_to_the_schema(live_stack, alice, field):
    """Anthropic's output_format (beta spelling) and output_config.format: the same grammar as
    Chat's response_format, so the random-weight model's reply parses into the model."""
    import anthropic

    key = ApiKey.issue(user=alice, name="live-ant")[1]
    ant = anthropic.Anthropic(base_url=live_stack.url, api_key=key, max_retries=0, timeout=120)
    fmt = {"type": "json_schema", "schema": City.model_json_schema()}
    extra = {"output_format": fmt} if field == "output_format" else {"output_config": {"format": fmt}}
    msg = ant.messages.create(model="colibri", max_tokens=400, messages=MESSAGES, temperature=1, extra_body=extra)
    assert msg.stop_reason == "end_turn", msg
    City.model_validate_json(msg.content[0].text)
