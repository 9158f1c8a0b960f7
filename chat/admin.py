from django.contrib import admin

from chat.models import Conversation, Message


class MessageInline(admin.TabularInline):
    model = Message
    extra = 0
    fields = ("role", "status", "text", "tool_calls", "tool_call_id", "stats", "created")
    readonly_fields = ("created",)


@admin.register(Conversation)
class ConversationAdmin(admin.ModelAdmin):
    list_display = ("id", "title", "owner", "kv_slot", "updated")
    list_filter = ("owner",)
    search_fields = ("title",)
    inlines = [MessageInline]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ("id", "conversation", "role", "status", "created")
    list_filter = ("role", "status")
    search_fields = ("text",)
