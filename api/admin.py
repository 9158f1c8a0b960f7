from django.contrib import admin

from api.models import ApiKey


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "name", "user", "created", "last_used", "revoked")
    list_filter = ("revoked",)
    search_fields = ("prefix", "name", "user__username")
    # The hash is useless to an admin and the secret is unrecoverable: keep both out of forms.
    exclude = ("hashed_secret",)
    readonly_fields = ("prefix", "created", "last_used")

    def has_add_permission(self, request):
        return False  # keys are issued through POST /api/keys, which shows the secret once
