"""The project: settings, URLs, the ASGI application, the Celery app. It imports the apps; no app
imports it (what the apps share lives in colibri_base, see there)."""
from .celery import app as celery_app

__all__ = ["celery_app"]
