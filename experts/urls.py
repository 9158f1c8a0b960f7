from django.urls import path

from experts import views

urlpatterns = [
    path("experts", views.experts, name="experts"),
]
