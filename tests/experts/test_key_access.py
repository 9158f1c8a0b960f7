"""/experts with API keys (issue 13 item 5): a staff user's key reads it, a member's key gets 403,
a wrong key 401, and the key never opens a page outside API_KEY_PATHS."""
import pytest

from api.models import ApiKey

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_key(django_user_model):
    user = django_user_model.objects.create_user("ops", password="x" * 12, is_staff=True)
    return ApiKey.issue(user=user, name="ops")[1]


@pytest.fixture
def member_key(django_user_model):
    user = django_user_model.objects.create_user("member", password="x" * 12)
    return ApiKey.issue(user=user, name="m")[1]


def test_a_staff_key_reads_the_expert_map(client, staff_key):
    r = client.get("/experts", HTTP_AUTHORIZATION=f"Bearer {staff_key}")
    assert r.status_code == 200 and {"rows", "cols", "map", "hits"} <= set(r.json())
    assert client.get("/experts", HTTP_X_API_KEY=staff_key).status_code == 200


def test_a_members_key_is_refused(client, member_key):
    assert client.get("/experts", HTTP_AUTHORIZATION=f"Bearer {member_key}").status_code == 403


def test_a_wrong_key_is_401_json(client, staff_key):
    r = client.get("/experts", HTTP_AUTHORIZATION=f"Bearer {staff_key[:-3]}xyz")
    assert r.status_code == 401 and "API key" in r.json()["error"]


def test_a_key_opens_nothing_outside_its_paths(client, staff_key):
    r = client.get("/api/conversations", HTTP_AUTHORIZATION=f"Bearer {staff_key}")
    assert r.status_code in (401, 403)
    r = client.get("/admin/", HTTP_AUTHORIZATION=f"Bearer {staff_key}")
    assert r.status_code == 302  # the admin's login page: the key is not a session


@pytest.mark.django_db(transaction=True)  # the async path reads the key from another thread's connection
async def test_the_key_works_on_the_async_path_too(async_client, staff_key):
    r = await async_client.get("/experts", headers={"Authorization": f"Bearer {staff_key}"})
    assert r.status_code == 200, r.content
