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


@pytest.fixture(scope="session")
def engine_binary():
    return procs.build_engine()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return procs.make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-moe.gguf")
