"""Atlases per model with history: import (page upload, manage.py import_atlas), export."""
import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from experts import services
from experts.models import Atlas

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_bridge")]


def test_it_exports_an_upload_byte_for_byte(staff_client, sample_bytes):
    response = staff_client.post("/atlas/api/atlases",
                                 {"file": SimpleUploadedFile("experts.json", sample_bytes)})
    assert response.status_code == 201
    atlas = response.json()["atlas"]
    assert atlas["model"] == "tiny-moe" and atlas["entries"] == 3 and atlas["specialists"] == 2
    download = staff_client.get(f"/atlas/api/atlases/{atlas['id']}/experts.json")
    assert download["Content-Disposition"] == 'attachment; filename="experts.json"'
    assert download.content == sample_bytes


def test_it_refuses_an_upload_that_is_not_colibris_format(staff_client):
    response = staff_client.post("/atlas/api/atlases",
                                 {"file": SimpleUploadedFile("x.json", b'{"experts": {}}')})
    assert response.status_code == 400
    assert "categories" in response.json()["error"]
    assert not Atlas.objects.exists()


def test_it_refuses_uploads_from_members(member_client, sample_bytes):
    response = member_client.post("/atlas/api/atlases",
                                  {"file": SimpleUploadedFile("experts.json", sample_bytes)})
    assert response.status_code == 403


def test_it_keeps_history_when_a_new_atlas_arrives(staff_client, sample_bytes):
    first = services.atlas_import(content=sample_bytes, model_name="tiny-moe")
    second = services.atlas_import(content=sample_bytes.replace(b"0.72", b"0.7219"), model_name="tiny-moe")
    other = services.atlas_import(content=sample_bytes, model_name="glm-5.2")
    body = staff_client.get("/atlas/api/atlases").json()
    assert body["model"] == "tiny-moe"
    assert body["current"]["id"] == second.pk
    assert {a["id"] for a in body["history"]} == {first.pk, second.pk, other.pk}
    assert bytes(Atlas.objects.get(pk=first.pk).content) == sample_bytes


def test_it_imports_from_the_command_line(tmp_path, sample_bytes):
    path = tmp_path / "experts.json"
    path.write_bytes(sample_bytes)
    call_command("import_atlas", str(path), "--model", "glm-5.2")
    atlas = services.atlas_current(model_name="glm-5.2")
    assert bytes(atlas.content) == sample_bytes and atlas.filename == "experts.json"
    path.write_bytes(b"[]")
    with pytest.raises(CommandError, match="JSON object"):
        call_command("import_atlas", str(path))


def test_it_serves_the_map_of_an_atlas(staff_client, sample_bytes):
    atlas = services.atlas_import(content=sample_bytes, model_name="tiny-moe")
    body = staff_client.get(f"/atlas/api/atlases/{atlas.pk}/map").json()
    assert body["categories"][0] == "casual_chat"
    assert len(body["points"]) == 3


def test_it_labels_rows_with_layers_from_data_never_constants():
    assert services.row_layers(rows=2, model={"moe_layers": [5, 9]}) == ([5, 9], "engine")
    assert services.row_layers(rows=3, model={}, atlas_layers=[3, 4, 5]) == ([3, 4, 5], "atlas")
    assert services.row_layers(rows=4, model={}, atlas_layers=[3, 4, 5]) == ([3, 4, 5, 6], "atlas+extra")
    assert services.row_layers(rows=2, model={"n_layers": 5}) == ([3, 4], "model")
    assert services.row_layers(rows=2, model=None) == ([0, 1], "rows")
