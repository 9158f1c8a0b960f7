"""A Redis outage under the /v1 admission steps (api.outage, api.keycache, api.limits) and the
chat relay's tail log (chat.relay.extended), on a real fault: the cache points at a port where no
Redis listens, so every command is refused as by a Redis that died. The live stack's version of
these faults (Redis killed under Daphne) is in test_live_faults.py."""
import asyncio
import time

import pytest
import redis
from django.core.cache import cache
from django.test import override_settings

from api import keycache, limits, outage
from api.errors import ANTHROPIC, OPENAI, as_api_error
from api.keygen import keys_changed
from api.models import ApiKey
from chat.relay import extended
from tests.support import procs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def redis_out(settings):
    dead = {"default": {**settings.CACHES["default"], "LOCATION": f"redis://127.0.0.1:{procs.free_port()}/0"}}
    with override_settings(CACHES=dead):
        yield


def test_a_key_is_read_from_the_database_while_redis_is_out_and_a_revocation_still_counts_within_max_age(alice):
    row, key = ApiKey.issue(user=alice, name="outage")
    assert keycache.key_lookup(key).pk == row.pk  # cached under the live generation
    with override_settings(CACHES={"default": {"BACKEND": "colibri_base.cache.SharedPoolRedisCache",
                                               "LOCATION": f"redis://127.0.0.1:{procs.free_port()}/0"}}):
        with pytest.raises(redis.ConnectionError):
            cache.get("anything")  # the fault is real
        assert keycache.key_lookup(key).pk == row.pk
        assert asyncio.run(keycache.akey_lookup(key)).pk == row.pk
        ApiKey.objects.filter(pk=row.pk).update(revoked=True)  # no signal, and none could reach Redis
        t0 = time.monotonic()
        while keycache.key_lookup(key) is not None:
            assert time.monotonic() - t0 < keycache.MAX_AGE_S + 0.2
            time.sleep(0.02)
        assert asyncio.run(keycache.akey_lookup(key)) is None
        assert keycache.key_lookup("sk-colibri-unknown") is None
    ApiKey.objects.filter(pk=row.pk).update(revoked=False)
    assert keycache.key_lookup(key).pk == row.pk  # Redis back: an entry read in the outage is read again


def test_an_entry_read_in_an_outage_is_read_again_once_redis_answers(alice, redis_out):
    row, key = ApiKey.issue(user=alice, name="outage")
    keycache.key_lookup(key)
    digest = next(d for d, entry in keycache._entries.items() if entry[2].pk == row.pk)
    assert keycache._entries[digest][0] is keycache.OUTAGE
    assert keycache._cached(digest, 12345) is None  # no real generation is OUTAGE's


def test_a_change_of_keys_while_redis_is_out_is_committed_and_logged(alice, redis_out, caplog):
    row, _ = ApiKey.issue(user=alice, name="outage")  # post_save -> on_commit -> keys_changed
    keys_changed()
    assert ApiKey.objects.filter(pk=row.pk).exists()
    assert "while Redis is out" in caplog.text


def test_ride_out_answers_503_with_retry_after_once_the_window_is_spent(redis_out, monkeypatch):
    monkeypatch.setattr(outage, "BROKER_OUTAGE_S", 0.6)

    async def run():
        outage.begin()
        t0 = time.monotonic()
        with pytest.raises(Exception) as info:
            await outage.ride_out(lambda: cache.aget("x"))
        return info.value, time.monotonic() - t0

    err, took = asyncio.run(run())
    assert (err.status, err.code, err.headers["Retry-After"]) == (503, "service_unavailable", "2")
    assert 0.3 <= took <= 1.2, took
    assert isinstance(err.__cause__, redis.ConnectionError)


def test_ride_out_goes_on_when_redis_answers_within_the_window(settings):
    dead = redis.asyncio.Redis.from_url(f"redis://127.0.0.1:{procs.free_port()}/0")
    tries = []

    async def step():
        tries.append(time.monotonic())
        if len(tries) < 3:  # Redis out for the first two tries
            return await dead.get("x")
        return await cache.aget("outage-test-missing", "answered")

    async def run():
        outage.begin()
        return await outage.ride_out(step)

    assert asyncio.run(run()) == "answered" and len(tries) == 3


def test_one_window_per_request_shared_by_its_steps(redis_out, monkeypatch):
    monkeypatch.setattr(outage, "BROKER_OUTAGE_S", 0.6)

    async def run():
        outage.begin()
        t0 = time.monotonic()
        for _ in range(3):  # three steps of one request: the second and third find the window spent
            with pytest.raises(Exception):
                await outage.ride_out(lambda: cache.aget("x"))
        return time.monotonic() - t0

    assert asyncio.run(run()) < 1.2


def test_a_redis_error_no_step_rode_out_is_the_surfaces_503_not_a_500():
    err = as_api_error(redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379"))
    assert err.status == 503 and err.headers["Retry-After"] == "2"
    body = OPENAI.body(err)["error"]
    assert body["code"] == "service_unavailable" and "6379" not in body["message"]
    assert ANTHROPIC.status(err) == 529 and ANTHROPIC.body(err)["error"]["type"] == "overloaded_error"
    assert as_api_error(redis.ResponseError("NOSCRIPT")).status == 500  # a bug stays a 500


def test_a_settlement_while_redis_is_out_keeps_the_charge_and_raises_nothing(redis_out, caplog):
    reservation = limits.Reservation([("key", "k1", 100)], [50], [50])
    reservation.settle(10)
    assert reservation.settled and "charge stands" in caplog.text


@pytest.mark.parametrize("saved, pieces, expected", [
    ("", [], ""),
    ("abc", [], "abc"),
    ("", [[0, "ab"], [2, "cd"]], "abcd"),                    # killed before the first save
    ("abcd", [[2, "cd"], [4, "ef"]], "abcdef"),              # a piece the save already holds
    ("ab", [[0, "ab"], [2, "cd"], [4, "ef"]], "abcdef"),
    ("abcdef", [[2, "cd"]], "abcdef"),                       # the row is ahead of the log
    ("ab", [[2, "cd"], [6, "gh"]], "abcd"),                  # a gap (a write skipped): stop there
    ("ab", [[4, "ef"]], "ab"),
    ("a\ufffdb", [[3, "é😀"]], "a\ufffdbé😀"),               # offsets in code points
])
def test_a_tail_log_extends_the_saved_text_up_to_its_first_gap(saved, pieces, expected):
    assert extended(saved, pieces) == expected


def test_a_tail_log_written_by_the_relay_is_what_the_sweep_recovers(monkeypatch):
    """Through the shared Redis (the test's own message id, removed after). The log's content is
    at stake here, not its 0.25 s bound, which a connect on a loaded host can pass (the relay then
    saves the row instead): the bound is lifted."""
    from chat import relay

    monkeypatch.setattr(relay, "TAIL_TIMEOUT_S", 30.0)
    monkeypatch.setattr(relay, "_tail_down_until", 0.0)

    msg_id = 2 ** 62 + time.monotonic_ns() % 10 ** 9

    async def write():
        assert await relay._log_tail(msg_id, 0, "Let me", relay.THINKING)
        assert await relay._log_tail(msg_id, 0, "Hello")
        assert await relay._log_tail(msg_id, 6, " think", relay.THINKING)
        assert await relay._log_tail(msg_id, 5, ", wor")
        assert await relay._log_tail(msg_id, 10, "ld 😀")

    try:
        asyncio.run(write())
        assert relay.recovered_text(msg_id, relay.PROCESS, "") == ("Hello, world 😀", "Let me think")
        assert relay.recovered_text(msg_id, relay.PROCESS, "Hello, w", "Let") == ("Hello, world 😀", "Let me think")
        assert relay.recovered_text(msg_id, "another process", "Hello") == ("Hello", "")  # its own log only
        asyncio.run(relay.drop_tail(msg_id))
        assert relay.recovered_text(msg_id, relay.PROCESS, "Hello", "Let") == ("Hello", "Let")
    finally:
        asyncio.run(relay.drop_tail(msg_id))


def test_the_sweep_keeps_the_saved_text_when_the_tail_log_cannot_be_read(redis_out):
    from chat import relay

    assert relay.recovered_text(1, relay.PROCESS, "saved", "thought") == ("saved", "thought")


def test_a_delta_the_tail_log_cannot_take_is_in_the_row_before_any_socket_gets_it(redis_out, alice, monkeypatch):
    """A tail-log write that fails (Redis out here; slow under load, past its 0.25 s bound, in a
    loaded full run) left a gap that ended the sweep's recovery, and the reply lost what its reader
    had seen. Such a delta is now saved in the row first."""
    from chat import relay
    from chat.models import Conversation, Message

    conv = Conversation.objects.create(owner=alice)
    msg = Message.objects.create(conversation=conv, role=Message.Role.ASSISTANT, text="",
                                 status=Message.Status.STREAMING)
    rows_at_publish = []

    async def publish(conversation_id, frame):  # stands in for the channel layer: what the row held then
        rows_at_publish.append(await relay.database_sync_to_async(
            lambda: Message.objects.get(pk=msg.pk).text)())

    monkeypatch.setattr(relay, "publish", publish)
    state = relay._State()
    state.text = "Hello"

    asyncio.run(relay._publish_delta(conv.pk, msg.pk, state, "text", [", world"]))
    assert state.text == "Hello, world" and rows_at_publish == ["Hello, world"]
    asyncio.run(relay._publish_delta(conv.pk, msg.pk, state, "reasoning", ["I should greet"]))
    assert Message.objects.get(pk=msg.pk).thinking == "I should greet"  # thinking too, before its frame


def test_a_tail_log_delete_that_redis_runs_late_loses_no_delivered_text(alice, monkeypatch):
    """Under load a relay's DELETE of its tail log passed its 0.25 s bound and reached Redis after
    the next delta's RPUSH (two connections, served out of order): the sweep then recovered the
    row's last save, short of text the reader had (CI: 4,668 characters received, 4,067 stored).
    The double below is that fault: every DELETE of a tail log runs after the next write to it.
    Mid-turn, the row and its log must together hold every delta published."""
    from chat import relay
    from chat.models import Conversation, Message

    conv = Conversation.objects.create(owner=alice)
    msg = Message.objects.create(conversation=conv, role=Message.Role.ASSISTANT, text="",
                                 status=Message.Status.STREAMING)
    published: list[str] = []
    checks: list[tuple[str, str]] = []

    class LateDeleteClient:  # test double: Redis serving a DELETE after a later RPUSH
        def __init__(self, real):
            self.real, self.late = real, []

        def __getattr__(self, name):
            return getattr(self.real, name)

        async def delete(self, key):
            self.late.append(key)

        def pipeline(self, **kw):
            pipe, late = self.real.pipeline(**kw), self

            class Pipe:
                def __getattr__(self, name):
                    return getattr(pipe, name)

                async def execute(self):
                    result = await pipe.execute()
                    for key in late.late:
                        await late.real.delete(key)
                    late.late.clear()
                    return result
            return Pipe()

    clients: dict = {}

    def late_client(c):
        loop = asyncio.get_running_loop()
        if loop not in clients:
            clients[loop] = LateDeleteClient(relay.async_client.__wrapped__(c))
        return clients[loop]

    late_client.__wrapped__ = relay.async_client
    monkeypatch.setattr(relay, "async_client", late_client)
    monkeypatch.setattr(relay, "RELAY_SAVE_EVERY_S", 0.25)  # a save every third batch or so

    async def publish(conversation_id, frame):
        if frame["type"] == "delta":
            published.append(frame["text"])

    monkeypatch.setattr(relay, "publish", publish)

    async def turn():
        queue: asyncio.Queue = asyncio.Queue()
        state = relay._State()
        never = asyncio.get_running_loop().create_future()
        consumer = asyncio.ensure_future(relay._consume(conv.pk, msg.pk, queue, never, state))
        for i in range(12):
            await queue.put({"kind": "text", "text": f"piece {i}; "})
            for _ in range(1000):  # until the relay has published it (10 s at most)
                if len(published) > i:
                    break
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.1)  # every third batch or so is saved meanwhile
            row = await relay.database_sync_to_async(lambda: Message.objects.get(pk=msg.pk).text)()
            recovered, _ = await relay.database_sync_to_async(relay.recovered_text)(msg.pk, relay.PROCESS, row)
            checks.append(("".join(published), recovered))
        consumer.cancel()
        await asyncio.gather(consumer, return_exceptions=True)
        await relay.drop_tail(msg.pk)

    asyncio.run(turn())
    assert len(checks) == 12 and checks[-1][0].count("piece") == 12
    for delivered, recovered in checks:
        assert recovered.startswith(delivered), (delivered, recovered)
