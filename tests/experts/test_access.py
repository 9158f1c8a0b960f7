"""/experts, /experts.json and /atlas are for staff: members get 403, strangers the login."""
import pytest

from experts import services

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_bridge")]
SEED_KEYS = {"rows", "cols", "map", "hits", "seq", "gpus", "entropy", "repin", "tiers"}


def test_it_serves_experts_to_staff_in_the_seed_shape(staff_client):
    response = staff_client.get("/experts")
    assert response.status_code == 200
    assert set(response.json()) == SEED_KEYS


def test_it_refuses_experts_to_members(member_client):
    response = member_client.get("/experts")
    assert response.status_code == 403
    assert response.json() == {"error": "staff only"}


def test_it_asks_strangers_to_log_in_for_experts(client):
    assert client.get("/experts").status_code == 401


def test_it_serves_the_current_experts_json_byte_for_byte(staff_client, sample_bytes):
    assert staff_client.get("/experts.json").status_code == 404
    services.atlas_import(content=sample_bytes, model_name="tiny-moe")
    response = staff_client.get("/experts.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.content == sample_bytes


def test_it_refuses_experts_json_to_members(member_client, sample_bytes):
    services.atlas_import(content=sample_bytes, model_name="tiny-moe")
    assert member_client.get("/experts.json").status_code == 403


def test_it_renders_the_atlas_page_for_staff_only(staff_client, member_client, client):
    assert staff_client.get("/atlas").status_code == 200
    anonymous = client.get("/atlas")
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    assert member_client.get("/atlas").status_code == 403
