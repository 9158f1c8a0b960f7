from django.urls import path

from api import openapi, surfaces, views

urlpatterns = [
    path("v1/models", views.ModelListApi.as_view(), name="v1-models"),
    path("v1/models/<path:model_id>", views.ModelDetailApi.as_view(), name="v1-model"),
    path("v1/messages/count_tokens", views.MessagesCountTokensApi.as_view(), name="v1-messages-count-tokens"),
    # one route per wire surface (api.surfaces)
    *(path(s.route, views.GENERATION_VIEWS[s.name].as_view(), name=s.url_name) for s in surfaces.SURFACES),
    path("api/keys", views.ApiKeysApi.as_view(), name="api-keys"),
    path("api/keys/<int:pk>", views.ApiKeyRevokeApi.as_view(), name="api-key"),
    path("v1/openapi.json", openapi.schema_view, name="v1-openapi"),
    path("v1/stats", views.StatsApi.as_view(), name="v1-stats"),
    path("metrics", views.metrics_view, name="metrics"),
    path("v1/<path:rest>", views.V1NotFoundApi.as_view(), name="v1-not-found"),
]
