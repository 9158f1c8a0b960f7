from django.contrib import admin
from django.urls import include, path

# The API's routes first: the resolver tries patterns in order and records every miss, and /v1 is
# where a request's milliseconds are a client's (issue 14). Its catch-all takes only v1/... paths.
urlpatterns = [
    path("", include("api.urls")),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("engine_bridge.urls")),
    path("", include("experts.urls")),
    path("", include("ops.urls")),
    path("", include("chat.urls")),
]
