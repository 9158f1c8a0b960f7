"""The per-request expert count on the API (issue 11 item 3): `colibri.experts` on every surface,
checked against the served model's range, honoured by the engine (greedy text changes with it)."""
import httpx
import pytest

pytestmark = pytest.mark.django_db(transaction=True)

ROUTES = {
    "/v1/chat/completions": lambda n: {"messages": [{"role": "user", "content": "Name a colour."}]},
    "/v1/completions": lambda n: {"prompt": "The colour of the sky is"},
    "/v1/messages": lambda n: {"messages": [{"role": "user", "content": "Name a colour."}]},
    "/v1/responses": lambda n: {"input": "Name a colour."},
}


def _text(route, body):
    if route == "/v1/chat/completions":
        return body["choices"][0]["message"]["content"]
    if route == "/v1/completions":
        return body["choices"][0]["text"]
    if route == "/v1/messages":
        return body["content"][0]["text"] if body["content"] else ""
    return body["output"][0]["content"][0]["text"] if body["output"] else ""


@pytest.mark.parametrize("route", list(ROUTES))
def test_each_surface_takes_an_expert_count(live_stack, alice_key, route):
    headers = {"Authorization": f"Bearer {alice_key}", "x-api-key": alice_key, "anthropic-version": "2023-06-01"}
    texts = {}
    for n in (1, 8, None):
        body = {"model": "colibri", "max_tokens" if route != "/v1/responses" else "max_output_tokens": 24,
                "temperature": 0, **ROUTES[route](n)}
        if n is not None:
            body["colibri"] = {"experts": n}
        r = httpx.post(f"{live_stack.url}{route}", json=body, headers=headers, timeout=60)
        assert r.status_code == 200, r.text
        texts[n] = _text(route, r.json())
    # the fixture model routes top-2 of 8: one expert or all of them give other greedy text
    assert texts[1] != texts[None] or texts[8] != texts[None]


@pytest.mark.parametrize("value,message", [(0, "[1, 8]"), (9, "[1, 8]"), (2.5, "integer"), (True, "integer")])
def test_an_expert_count_outside_the_models_range_is_a_400_naming_the_field(live_stack, alice_key, value, message):
    r = httpx.post(f"{live_stack.url}/v1/chat/completions", headers={"Authorization": f"Bearer {alice_key}"},
                   json={"model": "colibri", "messages": [{"role": "user", "content": "hi"}], "colibri": {"experts": value}},
                   timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "colibri.experts" and message in error["message"]
