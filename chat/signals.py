"""Closes every chat socket of a user whose account is deactivated, once the change is committed.

A socket authenticates once, at connect; without this, a deactivated user's open tab could go on
generating. The consumer also re-checks is_active on every frame (a socket in a web process that
missed the broadcast still refuses work)."""
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from chat.groups import user_group
from colibri_base.layers import channel_layer


@receiver(post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="chat-close-deactivated")
def close_sockets_of_deactivated(sender: type, instance: AbstractBaseUser, **kwargs: object) -> None:
    if instance.is_active:
        return
    group = user_group(instance.pk)
    transaction.on_commit(lambda: async_to_sync(channel_layer().group_send)(group, {"type": "user.revoked"}))
