"""Celery jobs of the experts app: thin wrappers over services."""
from celery import shared_task

from experts import services


@shared_task(ignore_result=True)
def build_atlas(build_id: int) -> None:
    services.build_run(build_id=build_id)
