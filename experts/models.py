"""Atlases (experts.json documents) per model, with their history, and the builder's jobs.

An Atlas row is immutable once written: a new import or build adds a row, it never replaces
one, so every atlas a model ever had stays downloadable. The current atlas of a model is its
newest row.
"""
from typing import Any

from django.conf import settings
from django.db import models


class Atlas(models.Model):
    IMPORTED, BUILT = "imported", "built"

    model_name = models.CharField(max_length=200, db_index=True)
    source = models.CharField(max_length=16, choices=[(IMPORTED, IMPORTED), (BUILT, BUILT)])
    content = models.BinaryField()          # the experts.json bytes, exactly as imported / built
    sha256 = models.CharField(max_length=64)
    filename = models.CharField(max_length=200, blank=True, default="")
    entries = models.IntegerField(default=0)
    specialists = models.IntegerField(default=0)
    categories = models.JSONField(default=list)
    projection = models.JSONField(default=dict)   # atlas_format.projection(), computed once
    validation = models.JSONField(null=True, blank=True)  # builder's leave-one-prompt-out figure
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created", "-id"]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.pk, "model": self.model_name, "source": self.source, "sha256": self.sha256,
                "filename": self.filename, "entries": self.entries, "specialists": self.specialists,
                "categories": self.categories, "validation": self.validation, "bytes": len(self.content),
                "created": self.created.isoformat()}


class AtlasBuild(models.Model):
    QUEUED, RUNNING, DONE, FAILED, CANCELLED = "queued", "running", "done", "failed", "cancelled"
    FINAL = (DONE, FAILED, CANCELLED)

    model_name = models.CharField(max_length=200)  # the display name its atlas is stored under
    served_model = models.CharField(max_length=64, blank=True, default="")  # ServedModel.id its probes ask
                                                                             # for ("" before: the default)
    status = models.CharField(max_length=16, default=QUEUED)
    done = models.IntegerField(default=0)      # probes finished
    total = models.IntegerField(default=0)     # probes to run
    cancel_requested = models.BooleanField(default=False)
    atlas = models.ForeignKey(Atlas, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    error = models.TextField(blank=True, default="")
    wall_s = models.FloatField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)  # every probe saves progress: a heartbeat

    class Meta:
        ordering = ["-created", "-id"]

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.pk, "model": self.model_name, "served_model": self.served_model,
                "status": self.status, "done": self.done,
                "total": self.total, "atlas": self.atlas_id, "error": self.error, "wall_s": self.wall_s,
                "created": self.created.isoformat()}
