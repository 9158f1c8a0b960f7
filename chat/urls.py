from django.urls import path

from chat import pages

urlpatterns = [
    path("", pages.index, name="index"),
]
