"""The API's generation and model routes take the short middleware chain (colibri_site/lean.py);
pages keep theirs. Through the real ASGI application, as Daphne calls it."""
import pytest
from channels.testing import HttpCommunicator

from api.models import ApiKey
from colibri_site.asgi import application

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def headers_of(response):
    return {k.decode().lower(): v.decode() for k, v in response["headers"]}


async def get(path, key=None):
    headers = [(b"host", b"localhost")] + ([(b"authorization", f"Bearer {key}".encode())] if key else [])
    return await HttpCommunicator(application, "GET", path, headers=headers).get_response(timeout=10)


@pytest.fixture
def key(alice):
    return ApiKey.issue(user=alice, name="t")[1]


async def test_it_serves_the_api_without_the_page_middleware(key):
    response = await get("/v1/models", key)
    headers = headers_of(response)
    assert response["status"] == 200, response["body"][:200]
    assert headers["x-content-type-options"] == "nosniff"      # the security headers stay
    assert "content-security-policy" not in headers              # the page chain (django-csp) did not run
    assert "vary" not in headers or "cookie" not in headers["vary"].lower()  # nor sessions


async def test_it_refuses_a_missing_key_in_the_api_envelope():
    response = await get("/v1/models")
    assert response["status"] == 401 and b'"error"' in response["body"]


async def test_pages_keep_the_page_middleware():
    headers = headers_of(await get("/accounts/login/"))
    assert "content-security-policy" in headers and "csrftoken" in headers.get("set-cookie", "")
    headers = headers_of(await get("/v1/stats"))  # not a lean path: sessions may serve a staff page
    assert "x-content-type-options" in headers
