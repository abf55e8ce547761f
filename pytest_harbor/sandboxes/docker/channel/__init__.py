"""Command channels, the docker provider's way of carrying a harness's commands without
one exec each: the channel's script and requests (`protocol`), the reading of a reply
and what it comes to (`reply`), and the channels a sandbox holds open (`pool`)."""

from pytest_harbor.sandboxes.docker.channel.pool import CHANNELS_PER_SANDBOX, ChannelPool

__all__ = ["CHANNELS_PER_SANDBOX", "ChannelPool"]
