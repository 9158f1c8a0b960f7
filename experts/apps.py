from django.apps import AppConfig


class ExpertsConfig(AppConfig):
    name = "experts"
