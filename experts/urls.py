from django.urls import path

from experts import views

urlpatterns = [
    path("experts", views.experts, name="experts"),
    path("experts.json", views.experts_json, name="experts-json"),
    path("atlas", views.atlas_page, name="atlas"),
    path("atlas/api/atlases", views.atlases, name="atlas-list"),
    path("atlas/api/atlases/<int:pk>/experts.json", views.atlas_download, name="atlas-download"),
    path("atlas/api/atlases/<int:pk>/map", views.atlas_map, name="atlas-map"),
]
urlpatterns += [
    path("atlas/api/builds", views.builds, name="atlas-builds"),
    path("atlas/api/builds/<int:pk>/cancel", views.build_cancel, name="atlas-build-cancel"),
]
