from django.contrib import admin
from django.http import HttpRequest

from api.models import ApiKey, UserApiLimit


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "user", "created", "last_used", "revoked", "requests_per_minute",
                    "tokens_per_minute")
    list_filter = ("revoked",)
    search_fields = ("prefix", "name", "user__username")
    # The hash is useless to an admin and the secret is unrecoverable: keep both out of forms.
    exclude = ("hashed_secret",)
    readonly_fields = ("prefix", "created", "last_used")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # keys are issued through POST /api/keys, which shows the secret once


@admin.register(UserApiLimit)
class UserApiLimitAdmin(admin.ModelAdmin):
    list_display = ("user", "requests_per_minute", "tokens_per_minute")
    search_fields = ("user__username",)
    autocomplete_fields = ("user",)
