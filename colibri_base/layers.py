"""The default channel layer, for the code that sends to groups and channels (chat replies and
titles, atlas builds, the bridge's telemetry push).

Why here: channels' get_channel_layer() answers None when settings.CHANNEL_LAYERS has no default
layer, and every caller would then fail on None with an AttributeError far from the cause. The
site cannot work without the layer, so that is a configuration error, raised once, here.
"""
from channels.layers import BaseChannelLayer, get_channel_layer
from django.core.exceptions import ImproperlyConfigured


def channel_layer() -> BaseChannelLayer:
    """The default layer; ImproperlyConfigured when settings.CHANNEL_LAYERS has none."""
    layer = get_channel_layer()
    if layer is None:
        raise ImproperlyConfigured("settings.CHANNEL_LAYERS has no default layer")
    return layer
