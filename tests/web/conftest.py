"""Fixtures for the web tests: personas, a scripted bridge, API keys, and `live_stack` — the
real Daphne + bridge worker + native engine on the fixture model, for end-to-end tests (also
imported by the browser tests)."""
import pytest

from tests.web.fakes import FakeBridge
from tests.web.live import live_stack  # noqa: F401  (re-exported fixture)

PASSWORD = "correct horse battery"


@pytest.fixture(autouse=True)
def no_background_sweep(settings):
    """No orphan sweeper task on in-process test loops (chat.sweeper; they end with each test and
    its thread's database connection would outlive it); the live stack's Daphne runs its own."""
    settings.CHAT_ORPHAN_SWEEP = False


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password=PASSWORD)


@pytest.fixture
def alice_client(alice):
    """A test client signed in as alice (the browser UI's session)."""
    from django.test import Client

    c = Client()
    c.force_login(alice)
    return c


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", password=PASSWORD)


@pytest.fixture
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def fake_bridge(monkeypatch, in_memory_layer, settings):
    """Scripted generate(); ChatML prompts (no telemetry), no Celery titles, saves every event."""
    from engine_bridge import client

    bridge = FakeBridge()
    monkeypatch.setattr(client, "generate", bridge.generate)
    monkeypatch.setattr("engine_bridge.served._read_state", lambda: {})
    monkeypatch.setattr("chat.relay.RELAY_SAVE_EVERY_S", 0.0)
    settings.CHAT_AUTO_TITLE = False
    return bridge


@pytest.fixture
def alice_key(alice):
    from api.models import ApiKey

    return ApiKey.issue(user=alice, name="test")[1]


# The official SDKs against the live stack, with the key of the test file's own `key` fixture;
# strict response validation, so a field of the wrong type fails the test.
def openai_client(url, key):
    """The official openai SDK on a stack at `url`: no retries, responses validated strictly."""
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=60,
                         _strict_response_validation=True)


def anthropic_client(url, key):
    """The official anthropic SDK on a stack at `url`, as openai_client."""
    import anthropic

    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=60,
                               _strict_response_validation=True)


@pytest.fixture
def oai(live_stack, key):  # noqa: F811  (the re-exported fixture, requested)
    return openai_client(live_stack.url, key)


@pytest.fixture
def ant(live_stack, key):  # noqa: F811
    return anthropic_client(live_stack.url, key)


@pytest.fixture
def model(oai):
    return oai.models.list().data[0].id
