"""Session fixtures shared by every test package: the built engine, the tiny fixture model, and a
test database of this session's own."""
import os

import pytest
from django.conf import settings

from tests.support import procs


@pytest.fixture(scope="session")
def django_db_modify_db_settings():
    """Each test session gets its own test database (test_<name>_<pid>), as it claims its own Redis
    database (procs.claim_redis_db): two sessions on one host (a developer's beside CI's, or two
    checkouts) shared test_<name>, and the second one's setup dropped it under the first."""
    for db in settings.DATABASES.values():
        if db.get("ENGINE", "").endswith("sqlite3"):
            continue
        test = db.setdefault("TEST", {})
        test["NAME"] = f"{test.get('NAME') or 'test_' + db['NAME']}_{os.getpid()}"


@pytest.fixture(scope="session", autouse=True)
def cache_of_this_session():
    """This session's own key prefix in the shared Redis cache (under pytest-xdist, each worker's: a
    worker is a session of its own). The workers' test databases are apart but their users and keys
    share ids, and the cache is one: a key saved on one worker bumped the key generation that the
    other's cached keys were read under (a re-read mid-test), and rate-limit windows and outage marks
    would meet the same way. The prefix is the deployment's namespace of every shared key (the
    bridges' inboxes and registry too: engine_bridge.transport), so the bridges and web processes
    the tests start inherit it (CACHE_PREFIX)."""
    from django.core.cache import caches
    import redis

    from chat import relay

    prefix = f"colibri-test-{os.getpid()}"
    settings.CACHES["default"]["KEY_PREFIX"] = prefix
    os.environ["CACHE_PREFIX"] = prefix
    # this process's relay owner id names its deployment by the cache, and was made at import
    relay.PROCESS = relay.deployment_tag() + relay.PROCESS[8:]
    try:
        del caches["default"]            # a cache made before this fixture would keep the old prefix
    except AttributeError:
        pass
    yield prefix
    client = redis.Redis.from_url(settings.CACHES["default"]["LOCATION"])
    try:
        for key in client.scan_iter(match=f"{prefix}:*", count=1000):
            client.delete(key)
    except redis.RedisError:
        pass                             # Redis gone at the end: nothing of ours to remove
    finally:
        client.close()


@pytest.fixture(scope="session")
def engine_binary():
    return procs.build_engine()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return procs.make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-moe.gguf")
