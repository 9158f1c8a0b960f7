from django.apps import AppConfig


class EngineBridgeConfig(AppConfig):
    name = "engine_bridge"
