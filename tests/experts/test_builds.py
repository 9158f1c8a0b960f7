"""Builds: started from the page (staff only, one at a time), cancellable before or while running."""
import pytest

from experts import services
from experts.models import AtlasBuild

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_bridge")]


@pytest.fixture
def in_memory_layer(settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    from channels.layers import channel_layers
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def test_it_starts_one_build_at_a_time_for_staff(staff_client, member_client, in_memory_layer):
    response = staff_client.post("/atlas/api/builds")
    assert response.status_code == 202
    build = response.json()["build"]
    assert build["status"] == "queued" and build["total"] >= 30 and build["model"] == "tiny-moe"
    again = staff_client.post("/atlas/api/builds").json()["build"]
    assert again["id"] == build["id"]
    assert staff_client.get("/atlas/api/builds").json()["builds"][0]["id"] == build["id"]
    assert member_client.post("/atlas/api/builds").status_code == 403


def test_it_cancels_a_queued_build_at_once(staff_client, in_memory_layer):
    build = services.build_start()
    body = staff_client.post(f"/atlas/api/builds/{build.pk}/cancel").json()["build"]
    assert body["status"] == "cancelled"
    assert services.build_run(build_id=build.pk).status == "cancelled"  # a late job does nothing


@pytest.mark.django_db(transaction=True)  # the job's database_sync_to_async closes connections
def test_it_stops_a_running_build_before_its_next_probe(in_memory_layer):
    build = services.build_start()
    AtlasBuild.objects.filter(pk=build.pk).update(cancel_requested=True)
    finished = services.build_run(build_id=build.pk)
    assert finished.status == "cancelled" and finished.atlas is None and finished.done == 0


def test_it_fails_a_build_whose_job_stopped_reporting(in_memory_layer):
    from datetime import timedelta

    from django.utils import timezone

    stuck = services.build_start()
    AtlasBuild.objects.filter(pk=stuck.pk).update(
        status=AtlasBuild.RUNNING, updated=timezone.now() - timedelta(seconds=services.STALE_BUILD_S + 1))
    fresh = services.build_start()
    assert fresh.pk != stuck.pk and fresh.status == AtlasBuild.QUEUED
    stuck.refresh_from_db()
    assert stuck.status == AtlasBuild.FAILED and "stopped reporting" in stuck.error
