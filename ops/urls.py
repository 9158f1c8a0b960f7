from django.urls import path

from ops import views

urlpatterns = [
    path("ops", views.ops_page, name="ops"),
    path("ops/stats.json", views.ops_stats, name="ops-stats"),
]
