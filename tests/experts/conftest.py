"""Personas for the expert pages: staff Sam, member Mia (the chat user kind), nobody signed in."""
from pathlib import Path

import pytest
from django.test import Client

PASSWORD = "correct horse battery"
DATA = Path(__file__).parent / "data"


@pytest.fixture
def staff(django_user_model):
    return django_user_model.objects.create_user("sam", password=PASSWORD, is_staff=True)


@pytest.fixture
def member(django_user_model):
    return django_user_model.objects.create_user("mia", password=PASSWORD)


@pytest.fixture
def staff_client(staff):
    client = Client()
    client.force_login(staff)
    return client


@pytest.fixture
def member_client(member):
    client = Client()
    client.force_login(member)
    return client


@pytest.fixture
def sample_bytes():
    return (DATA / "colibri_sample.json").read_bytes()


@pytest.fixture
def no_bridge(monkeypatch, settings):
    """Telemetry as when no bridge runs (no Redis read), ENGINE_MODEL naming the model."""
    import colibri_site.urls  # noqa: F401  (modules that bind get_state at import bind the real one)
    from engine_bridge import telemetry

    settings.ENGINE_MODEL = "/models/tiny-moe.gguf"
    monkeypatch.setattr(telemetry, "get_state", lambda bridge=None: telemetry.empty_state())


@pytest.fixture(scope="session", autouse=True)
def _close_thread_sessions(django_db_setup, django_db_blocker):
    """database_sync_to_async threads keep PostgreSQL sessions open; the test database could
    not be dropped at the end of the run otherwise."""
    yield
    from tests.web.live import _close_other_sessions

    with django_db_blocker.unblock():
        _close_other_sessions()
