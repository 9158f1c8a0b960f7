from django.urls import path

from api import openapi, views

urlpatterns = [
    path("v1/models", views.ModelListApi.as_view(), name="v1-models"),
    path("v1/models/<path:model_id>", views.ModelDetailApi.as_view(), name="v1-model"),
    path("v1/chat/completions", views.ChatCompletionsApi.as_view(), name="v1-chat-completions"),
    path("v1/completions", views.CompletionsApi.as_view(), name="v1-completions"),
    path("v1/messages", views.MessagesApi.as_view(), name="v1-messages"),
    path("v1/responses", views.ResponsesApi.as_view(), name="v1-responses"),
    path("api/keys", views.ApiKeysApi.as_view(), name="api-keys"),
    path("api/keys/<int:pk>", views.ApiKeyRevokeApi.as_view(), name="api-key"),
    path("v1/openapi.json", openapi.schema_view, name="v1-openapi"),
    path("v1/stats", views.StatsApi.as_view(), name="v1-stats"),
    path("metrics", views.metrics_view, name="metrics"),
    path("v1/<path:rest>", views.V1NotFoundApi.as_view(), name="v1-not-found"),
]
