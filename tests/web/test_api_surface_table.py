"""api.surfaces is the one table of the wire surfaces: every place that differs by surface reads
its row (routes, the view's parser and envelope, the OpenAPI description, the metrics labels, the
projector a parse builds, the refused fields), and the served model's facts have one reader
(engine_bridge.served)."""
import pytest
from django.test import Client
from django.urls import resolve

from api import surfaces
from api.errors import ANTHROPIC
from engine_bridge import served as served_mod

pytestmark = pytest.mark.django_db
BODIES = {
    "openai_chat": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
    "openai_completion": {"model": "tiny", "prompt": "Once"},
    "anthropic_messages": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "openai_responses": {"model": "tiny", "input": "hi"},
}


def _served():
    return served_mod.served_model_from({"status": "up", "updated": 1.0, "model": {"name": "tiny", "arch": "llama"}})


def test_every_row_is_routed_to_a_view_reading_it():
    for s in surfaces.SURFACES:
        match = resolve("/" + s.route)
        assert match.url_name == s.url_name
        assert match.func.view_class.surface is s and match.func.view_class.envelope is s.envelope
        assert s.framing in surfaces.FRAMINGS
    assert [s.name for s in surfaces.SURFACES if s.envelope is ANTHROPIC] == ["anthropic_messages"]


def test_metrics_and_openapi_follow_the_table():
    from colibri_base import metrics

    assert tuple(metrics.SURFACES) == surfaces.NAMES
    paths = Client().get("/v1/openapi.json").json()["paths"]
    for s in surfaces.SURFACES:
        responses = paths["/" + s.route]["post"]["responses"]
        assert str(s.busy_status) in responses, s.name


@pytest.mark.parametrize("surface", surfaces.SURFACES, ids=surfaces.NAMES)
def test_a_parse_builds_the_rows_projector_and_honours_its_refusals(surface):
    from api.errors import ApiError

    call = surface.parse(dict(BODIES[surface.name]), served=_served(), surface=surface)
    assert type(call.projector) is surface.projector and call.prompt_param == surface.prompt_param
    for name in surface.refused:
        value = {"n": 2, "best_of": 2, "suffix": "x", "frequency_penalty": 1, "presence_penalty": 1}.get(name, 3)
        with pytest.raises(ApiError) as err:
            surface.parse({**BODIES[surface.name], name: value}, served=_served(), surface=surface)
        assert err.value.status == 400 and err.value.param == name


def test_one_reader_of_the_served_model(monkeypatch):
    """The chat template, the API and /health's facts come from the same ServedModel."""
    from engine_bridge import prompting

    info = {"name": "tiny", "chat_template": "{{ messages[0]['content'] }}!", "bos_token": "<s>",
            "eos_token": "</s>", "experts_min": 1, "experts_max": 4, "top_k": 2}
    monkeypatch.setattr(served_mod, "_read_state", lambda: {"status": "up", "updated": 1.0, "model": info})
    m = served_mod.served_model_get()
    assert prompting.template_source() == (m.template, "<s>", "</s>")
    assert m.experts_range == (1, 4) and m.experts_default == 2 and m.extensions
    assert not served_mod.served_model_from({"model": {"name": "glm", "extensions": False}}).extensions
    assert not served_mod.served_model_from({"model": None}).extensions
