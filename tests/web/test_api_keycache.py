"""API keys resolve from memory while nothing changed (api/keycache.py), and every change that
matters — revoking, deactivating the user, new limits, deleting — takes effect on the next lookup."""
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from api.keycache import key_lookup
from api.models import ApiKey, UserApiLimit

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit hooks run as in production


@pytest.fixture
def issued(alice):
    return ApiKey.issue(user=alice, name="cache")


def queries(fn):
    with CaptureQueriesContext(connection) as ctx:
        result = fn()
    return result, len(ctx.captured_queries)


def test_it_answers_a_known_key_without_the_database(issued):
    row, key = issued
    first, n_first = queries(lambda: key_lookup(key))
    again, n_again = queries(lambda: key_lookup(key))
    assert first.pk == again.pk == row.pk and n_first == 1 and n_again == 0
    assert queries(lambda: hasattr(again.user, "api_limit")) == (False, 0)  # "no limits" came with the row


def test_a_revoked_key_is_refused_at_once(issued, client, alice):
    row, key = issued
    assert key_lookup(key) is not None
    client.force_login(alice)
    assert client.delete(f"/api/keys/{row.pk}").status_code == 204
    assert key_lookup(key) is None


def test_a_deactivated_user_or_a_deleted_key_is_refused_at_once(issued, alice):
    row, key = issued
    assert key_lookup(key) is not None
    alice.is_active = False
    alice.save()
    assert key_lookup(key) is None
    alice.is_active = True
    alice.save()
    assert key_lookup(key) is not None
    row.delete()
    assert key_lookup(key) is None


def test_new_limits_are_seen_at_once(issued, alice):
    row, key = issued
    assert not hasattr(key_lookup(key).user, "api_limit")
    UserApiLimit.objects.create(user=alice, requests_per_minute=3)
    assert key_lookup(key).user.api_limit.requests_per_minute == 3
    ApiKey.objects.filter(pk=row.pk).update(requests_per_minute=9)  # a bulk update sends no signal...
    ApiKey.objects.filter(pk=row.pk).revoke()                        # ...revoke() says so itself
    assert key_lookup(key) is None


def test_an_unknown_key_is_never_cached(alice):
    assert key_lookup("col-deadbeef-nope") is None
    row, key = ApiKey.issue(user=alice)
    assert key_lookup(key).pk == row.pk


def test_changes_that_send_no_signal_take_effect_within_a_second(issued, alice):
    """A queryset update() (an admin action, a script) bumps no generation: the entry's age does
    (api.keycache.MAX_AGE_S, issue 24)."""
    import time

    from django.contrib.auth import get_user_model

    from api.keycache import MAX_AGE_S

    row, key = issued
    assert MAX_AGE_S <= 1.0
    assert key_lookup(key) is not None
    ApiKey.objects.filter(pk=row.pk).update(revoked=True)
    time.sleep(MAX_AGE_S + 0.05)
    assert key_lookup(key) is None
    ApiKey.objects.filter(pk=row.pk).update(revoked=False)
    assert key_lookup(key) is not None  # a miss is never cached: read again at once
    get_user_model().objects.filter(pk=alice.pk).update(is_active=False)
    time.sleep(MAX_AGE_S + 0.05)
    assert key_lookup(key) is None


def test_a_burst_of_misses_for_one_key_reads_the_row_once(issued, monkeypatch):
    """Eight requests of one key arriving together after its entry expired: one database read
    serves them all (each used to read the row in a thread of its own, with a new connection)."""
    import asyncio

    from api import keycache
    from colibri_base import flight

    row, key = issued
    reads = []
    real = ApiKey.lookup.__func__

    def counted(cls, full_key):
        reads.append(full_key)
        return real(cls, full_key)

    monkeypatch.setattr(ApiKey, "lookup", classmethod(counted))
    keycache._entries.clear()

    async def burst():
        return await asyncio.gather(*(keycache.akey_lookup(key) for _ in range(8)))

    rows = asyncio.run(burst())
    assert [r.pk for r in rows] == [row.pk] * 8 and len(reads) == 1
    assert asyncio.run(burst())[0].pk == row.pk and len(reads) == 1  # and then from memory
    assert not [slot for slot in flight._reads if slot[1][0] == "api-key-row"]  # nothing left in flight
