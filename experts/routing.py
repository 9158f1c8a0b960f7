from django.urls import path

from experts.consumers import AtlasConsumer

websocket_urlpatterns = [path("ws/atlas/", AtlasConsumer.as_asgi())]
