"""Who reaches what, kept beside the directory's records: each person's bots (owned or granted)
and channels, so authenticating a token reads that person's few records instead of every bot
and channel of the directory, and the access keys (actors/contracts.py `access_key`) a change of a
record touches, so gateways drop only what it changed."""

from __future__ import annotations

from actors.contracts import access_key
from engine.directory import Bot, Channel


def _users_of_bot(bot: Bot | None) -> set[str]:
    return set() if bot is None else {bot.owner, *bot.grants}


def _users_of_channel(channel: Channel | None) -> set[str]:
    return set() if channel is None else set(channel.people)


class AccessIndex:
    def __init__(self, bots: dict[str, Bot], channels: dict[str, Channel]) -> None:
        self._bots: dict[str, set[str]] = {}  # user → bots they own or hold a grant on
        self._channels: dict[str, set[str]] = {}  # user → channels they are a person of
        for bot in bots.values():
            self._add(self._bots, _users_of_bot(bot), bot.id)
        for channel in channels.values():
            self._add(self._channels, _users_of_channel(channel), channel.id)

    @staticmethod
    def _add(index: dict[str, set[str]], users: set[str], record: str) -> None:
        for user in users:
            index.setdefault(user, set()).add(record)

    @staticmethod
    def _remove(index: dict[str, set[str]], users: set[str], record: str) -> None:
        for user in users:
            held = index.get(user)
            if held is not None:
                held.discard(record)
                if not held:
                    del index[user]

    def bots_of(self, user: str) -> set[str]:
        return self._bots.get(user, set())

    def channels_of(self, user: str) -> set[str]:
        return self._channels.get(user, set())

    def changed(self, table: str, before, after) -> list[str]:
        """Update the index for a record stored over `before` (None: new); returns the access
        keys the change touched: the record, and the principals whose bots or channels it
        changed (a bot's rename touches no principal; its new owner's does)."""
        if table == "bots":
            old, new = _users_of_bot(before), _users_of_bot(after)
            self._remove(self._bots, old - new, after.id)
            self._add(self._bots, new - old, after.id)
            kind = "bot"
        elif table == "channels":
            old, new = _users_of_channel(before), _users_of_channel(after)
            self._remove(self._channels, old - new, after.id)
            self._add(self._channels, new - old, after.id)
            kind = "channel"
        else:  # orgs, users
            return [access_key(table.removesuffix("s"), after.id)]
        return [access_key(kind, after.id), *(access_key("user", u) for u in sorted(old ^ new))]
