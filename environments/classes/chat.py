"""A team chat workspace: channels, members and messages."""


class ChatWorkspace:
    """A team chat: channels with members, messages, pins and topics."""

    def __init__(self, users=None, channels=None):
        self.users = list(users or ["ana", "ben", "chloe", "dev"])
        self.channels = {name: {"members": list(c.get("members", [])), "topic": c.get("topic", ""),
                                "messages": list(c.get("messages", [])), "pinned": list(c.get("pinned", []))}
                         for name, c in (channels or {
                             "general": {"members": ["ana", "ben", "chloe", "dev"], "topic": "all hands"},
                             "ops": {"members": ["ana", "dev"], "topic": "incidents"}}).items()}

    def list_channels(self) -> str:
        """List channels with their topic and members."""
        return "\n".join(f"#{n}: topic={c['topic']!r}, members={', '.join(c['members'])}"
                         for n, c in sorted(self.channels.items()))

    def read_channel(self, channel: str) -> str:
        """Show a channel's messages (numbered) and pins.

        Args:
            channel: Channel name without '#'.
        """
        c = self._channel(channel)
        msgs = [f"[{i}] {m['author']}: {m['text']}" for i, m in enumerate(c["messages"])]
        return "\n".join(msgs) or "(no messages)"

    def _channel(self, channel):
        if channel not in self.channels:
            raise KeyError(f"no channel #{channel}")
        return self.channels[channel]

    def create_channel(self, name: str, topic: str) -> str:
        """Create a channel.

        Args:
            name: Channel name (lower case, no spaces).
            topic: Channel topic.
        """
        if name in self.channels or not name.isidentifier():
            raise ValueError(f"cannot create #{name} (exists or invalid)")
        self.channels[name] = {"members": [], "topic": topic, "messages": [], "pinned": []}
        return f"created #{name}"

    def invite(self, channel: str, user: str) -> str:
        """Add a user to a channel.

        Args:
            channel: Channel name.
            user: User name.
        """
        c = self._channel(channel)
        if user not in self.users:
            raise KeyError(f"no user {user!r}")
        if user in c["members"]:
            raise ValueError(f"{user} is already in #{channel}")
        c["members"].append(user)
        return f"{user} joined #{channel}"

    def post(self, channel: str, author: str, text: str) -> str:
        """Post a message in a channel as one of its members.

        Args:
            channel: Channel name.
            author: The posting member.
            text: Message text.
        """
        c = self._channel(channel)
        if author not in c["members"]:
            raise ValueError(f"{author} is not a member of #{channel}")
        c["messages"].append({"author": author, "text": text})
        return f"posted in #{channel} as message {len(c['messages']) - 1}"

    def pin(self, channel: str, index: int) -> str:
        """Pin a message of a channel by its number.

        Args:
            channel: Channel name.
            index: Message number as shown by read_channel.
        """
        c = self._channel(channel)
        if not 0 <= index < len(c["messages"]) or index in c["pinned"]:
            raise ValueError(f"cannot pin message {index}")
        c["pinned"].append(index)
        return f"pinned message {index} in #{channel}"

    def set_topic(self, channel: str, topic: str) -> str:
        """Change a channel's topic.

        Args:
            channel: Channel name.
            topic: New topic.
        """
        self._channel(channel)["topic"] = topic
        return f"#{channel} topic set"
