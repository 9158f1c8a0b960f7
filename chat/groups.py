"""The channel-layer groups of the chat: one per conversation (its turn's frames) and one per
user (every socket of the account).

Why its own module: the relay and the titles job publish to a conversation's group, the consumer
joins both, the deactivation signal closes a user's: each names the group here, so that none of
them imports another for a name (the titles job importing the relay closed a circle through the
services that queue it).
"""


def group_for(conversation_id: int) -> str:
    """The group of one conversation's sockets, in every web process."""
    return f"conv-{conversation_id}"


def user_group(user_id: int) -> str:
    """Every socket of one user: closed together when the account is deactivated."""
    return f"user-{user_id}"
