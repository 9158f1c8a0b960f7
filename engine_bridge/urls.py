from django.urls import path

from engine_bridge import views

urlpatterns = [
    path("health", views.health, name="health"),
]
