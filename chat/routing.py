from django.urls import path

from chat.consumers import ChatConsumer

# channels routes websockets with Django's path(), whose stub takes only views.
websocket_urlpatterns = [path("ws/chat/", ChatConsumer.as_asgi())]  # type: ignore[arg-type]
