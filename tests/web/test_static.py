"""Static files through the async-capable WhiteNoise middleware (colibri_site/static.py)."""
import pytest
from django.conf import settings

from colibri_site.static import AsyncWhiteNoiseMiddleware

pytestmark = pytest.mark.django_db


def test_the_middleware_runs_in_the_async_chain():
    assert AsyncWhiteNoiseMiddleware.async_capable and "colibri_site.static.AsyncWhiteNoiseMiddleware" in settings.MIDDLEWARE


async def test_it_serves_a_built_asset_asynchronously(async_client):
    r = await async_client.get("/static/app.js")
    assert r.status_code == 200 and "javascript" in r["Content-Type"]
    body = b"".join(r.streaming_content) if r.streaming else r.content  # a file: sync iterator
    assert len(body) > 1000


@pytest.mark.parametrize("path", ["/static/../colibri_site/settings.py", "/static/%2e%2e/manage.py",
                                  "/static/..%2fmanage.py", "/static//etc/passwd"])
async def test_it_never_serves_outside_its_folder(async_client, path):
    r = await async_client.get(path)
    assert r.status_code == 404


async def test_other_requests_pass_through(async_client):
    r = await async_client.get("/health")
    assert r["Content-Type"] == "application/json"
