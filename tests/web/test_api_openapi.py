"""The OpenAPI schema at /v1/openapi.json: served without a key, valid OpenAPI 3, every /v1
route described with its request body and its surface's error envelope."""
import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def test_it_serves_a_valid_schema_for_every_v1_route():
    from drf_spectacular.validation import validate_schema

    r = Client().get("/v1/openapi.json")
    assert r.status_code == 200 and "json" in r["Content-Type"]
    schema = r.json()
    validate_schema(schema)
    paths = schema["paths"]
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"):
        post = paths[route]["post"]
        assert "application/json" in post["requestBody"]["content"], route
        assert {"200", "400", "401", "413", "429"} <= set(post["responses"]), route
    assert "529" in paths["/v1/messages"]["post"]["responses"]
    assert "503" in paths["/v1/chat/completions"]["post"]["responses"]
    assert "get" in paths["/v1/models"] and "get" in paths["/v1/models/{model_id}"]
    assert not any("{rest}" in p for p in paths)  # the JSON 404 catch-all is not an API
    components = schema["components"]["schemas"]
    assert {"model", "messages"} <= set(components["ChatCompletionRequestRequest"]["properties"])
