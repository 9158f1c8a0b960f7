"""Celery app: background work (titles, exports) over the Redis broker."""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "colibri_site.settings")

app = Celery("colibri_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
