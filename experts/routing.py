from django.urls import path

from experts.consumers import AtlasConsumer

# channels routes websockets with Django's path(), whose stub takes only views.
websocket_urlpatterns = [path("ws/atlas/", AtlasConsumer.as_asgi())]  # type: ignore[arg-type]
