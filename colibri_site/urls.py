from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("engine_bridge.urls")),
    path("", include("experts.urls")),
    path("", include("api.urls")),
    path("", include("ops.urls")),
    path("", include("chat.urls")),
]
