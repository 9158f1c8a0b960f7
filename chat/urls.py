from django.urls import path

from chat import pages, views

urlpatterns = [
    path("", pages.index, name="index"),
    path("api/conversations", views.ConversationListApi.as_view(), name="conversation-list"),
    path("api/conversations/import", views.ConversationImportApi.as_view(), name="conversation-import"),
    path("api/conversations/<int:pk>", views.ConversationDetailApi.as_view(), name="conversation-detail"),
    path("api/models", views.ModelListApi.as_view(), name="chat-models"),
    path("api/conversations/<int:pk>/messages", views.ConversationMessagesApi.as_view(), name="conversation-messages"),
    path("conversations/export", views.export_view, name="conversation-export"),
    # The atlas page's ?message=<id> filter: under its path, served by the app that owns the rows.
    path("atlas/api/messages/<int:pk>/routing", views.message_routing, name="atlas-message-routing"),
]
