"""The gateway's access cache dropped by what a change touched (gateway/auth.py, actors/
access_watch.py, actors/directory/index.py): a member's creation drops only its bot's and its
owner's entries, everyone else stays cached; authenticating reads the person's own bots and
channels from an index that follows grants, revocations and channels; unknown tokens are
remembered as misses (bounded, briefly), and a token created while requests with it are in
flight is never answered from a miss once its creation returned. A real directory on a DuckDB
file, called in this process through a counting port (no Ray)."""

from __future__ import annotations

import asyncio
import collections
import time
from types import SimpleNamespace

import pytest

import actors.access_watch as access_watch
import actors.directory.admin as directory_admin
import gateway.auth as auth_mod
from actors.access_watch import AccessWatch
from actors.directory import DirectoryService
from engine.directory import Permission, Principal, may_use
from engine.errors import Unauthenticated
from gateway.auth import Auth
from storage.directory_store import hash_token

ADMIN = "admin-token-for-this-test"


class Port:
    """The directory's gateway methods, in process, counted by name; `hold` keeps each
    authentication's answer back (after the directory read it) until it is set."""

    def __init__(self, directory: DirectoryService) -> None:
        self.directory = directory
        self.calls: collections.Counter[str] = collections.Counter()
        self.hold: asyncio.Event | None = None
        self.read = 0
        self.slow = 0.0

    async def authenticate_at(self, token_hash: str):
        self.calls["authenticate_at"] += 1
        got = await self.directory.authenticate_at(token_hash)
        self.read += 1
        if self.hold is not None:
            await self.hold.wait()
        return got

    async def bot_at(self, bot_id: str):
        self.calls["bot_at"] += 1
        return await self.directory.bot_at(bot_id)

    async def watch_access(self, watcher: str, since: int, wait: float):
        answer = await self.directory.watch_access(watcher, since, wait)
        if answer[0] != since:  # news of a change reaches the gateway `slow` seconds late
            await asyncio.sleep(self.slow)
        return answer

    async def unwatch_access(self, watcher: str) -> None:
        await self.directory.unwatch_access(watcher)


async def _gateway(directory: DirectoryService, clock=time.monotonic) -> tuple[Auth, Port]:
    """A caching gateway's auth whose watch has answered (its cache is trusted)."""
    port = Port(directory)
    auth = Auth(SimpleNamespace(directory_port=port, shard_ports=[]), ADMIN, 60.0, clock=clock)  # type: ignore[arg-type]
    with pytest.raises(Unauthenticated):  # starts the watch
        await auth.principal_for("obt_warming_up")
    await _applied(directory)
    port.calls.clear()
    return auth, port


async def _applied(directory: DirectoryService) -> None:
    """Until every watching gateway applied the directory's current revision."""
    for _ in range(200):
        if directory.records.access.watchers():
            break
        await asyncio.sleep(0.005)
    await directory.records.access.settled(directory.records.access.revision)


async def _people(directory: DirectoryService):
    org = await directory.create_org("o", "o_1")
    tokens = {}
    for name in ("alice", "bob", "carol"):
        _, tokens[name] = await directory.create_user(name, [org.id], f"u_{name}")
    lead = await directory.create_bot(name="Lead", org=org.id, owner="u_alice")
    bobs = await directory.create_bot(name="Bobs", org=org.id, owner="u_bob")
    await directory.grant(lead.id, "u_carol", Permission.READ)
    return org, tokens, lead, bobs


@pytest.mark.anyio
async def test_a_member_creation_drops_only_its_bot_and_its_owners_entries(directory):
    _, tokens, lead, bobs = await _people(directory)
    auth, port = await _gateway(directory)
    for _ in range(2):  # cached on the first round, answered from it on the second
        for token in tokens.values():
            await auth.principal_for(token)
        for bot in (lead.id, bobs.id):
            await auth.bot(bot)
    warm = dict(port.calls)
    port.calls.clear()
    member = await directory.create_member(lead.id, "Helper", None, None)
    await _applied(directory)
    for name in ("bob", "carol"):
        await auth.principal_for(tokens[name])
    await auth.bot(lead.id)
    await auth.bot(bobs.id)
    others = dict(port.calls)
    alice = await auth.principal_for(tokens["alice"])
    await auth.bot(member.id)
    after = dict(port.calls)
    assert warm == {"authenticate_at": 3, "bot_at": 2}
    assert others == {}, others  # bob's, carol's, and both bots' entries stayed cached
    assert after == {"authenticate_at": 1, "bot_at": 1}  # the owner's principal, the new bot
    assert member.id in alice.bots


@pytest.mark.anyio
async def test_authentication_reads_an_index_that_follows_every_change(directory):
    """What `authenticate` answers equals what every bot and channel of the directory say."""

    def expected(directory: DirectoryService, user_id: str) -> Principal:
        user = directory.records.users[user_id]
        return Principal(
            user=user,
            channels=frozenset(
                c.id for c in directory.records.channels.values() if user_id in c.people
            ),
            bots=frozenset(b.id for b in directory.records.bots.values() if may_use(b, user)),
        )

    org, tokens, lead, bobs = await _people(directory)
    other = await directory.create_org("p", "o_2")
    await directory.create_user("dave", [other.id], "u_dave")
    await directory.create_bot(name="Elsewhere", org=other.id, owner="u_dave")
    await directory.grant(bobs.id, "u_alice", Permission.WRITE)
    await directory.grant(bobs.id, "u_carol", Permission.READ)
    await directory.revoke_grant(lead.id, "u_carol")
    await directory.grant(bobs.id, "u_carol", Permission.WRITE)  # (level change)
    await directory.create_channel(org=org.id, people=["u_alice", "u_bob"], bots=[])
    await directory.create_member(lead.id, "Helper", None, None)
    found = {}
    for name, token in tokens.items():
        found[name] = (await directory.authenticate(hash_token(token)), f"u_{name}")
    for got, want in [(p, expected(directory, u)) for p, u in found.values()]:
        assert got == want


@pytest.mark.anyio
async def test_an_unknown_token_is_a_bounded_short_lived_miss(directory, monkeypatch):
    monkeypatch.setattr(auth_mod, "MISSES", 4)
    now = [1000.0]
    await _people(directory)
    auth, port = await _gateway(directory, clock=lambda: now[0])
    asked = []
    for token in ("obt_a", "obt_a", "obt_a"):
        with pytest.raises(Unauthenticated):
            await auth.principal_for(token)
        asked.append(port.calls["authenticate_at"])
    now[0] += auth_mod.MISS_TTL + 0.1  # forgotten: asked again, then a miss again
    for _ in range(2):
        with pytest.raises(Unauthenticated):
            await auth.principal_for("obt_a")
        asked.append(port.calls["authenticate_at"])
    for token in ("obt_b", "obt_c", "obt_d", "obt_e", "obt_a"):  # 4 kept: a's dropped
        with pytest.raises(Unauthenticated):
            await auth.principal_for(token)
    asked.append(port.calls["authenticate_at"])
    assert asked == [1, 1, 1, 2, 2, 7]


@pytest.mark.anyio
async def test_a_token_created_while_requests_with_it_are_in_flight_is_not_a_miss(
    directory, monkeypatch
):
    """24 requests with a token read the directory before the token exists, and answer after
    its creation returned: each is refused (it was unknown when it asked), none leaves a miss
    that answers the created token, though news of the change reaches the gateway late."""
    token = "obt_made_while_asked_for"
    monkeypatch.setattr(
        directory_admin, "secrets", SimpleNamespace(token_urlsafe=lambda n: token[4:])
    )
    org = await directory.create_org("o", "o_1")
    auth, port = await _gateway(directory)
    port.hold = asyncio.Event()
    port.read = 0
    port.slow = 0.2
    in_flight = [asyncio.ensure_future(auth.principal_for(token)) for _ in range(24)]
    while port.read < 24:  # every one has its answer from before the token
        await asyncio.sleep(0.001)
    _, made = await directory.create_user("late", [org.id], "u_late")
    port.hold.set()
    port.hold = None
    answers = await asyncio.gather(*in_flight, return_exceptions=True)
    after = [await auth.principal_for(token) for _ in range(3)]
    assert made == token
    assert all(isinstance(a, Unauthenticated) for a in answers), answers
    assert [p.user.id for p in after] == ["u_late"] * 3


def test_the_watch_names_changes_only_while_it_knows_them_all(monkeypatch):
    """`changes` answers the keys changed since a revision, or None (drop everything) when it
    cannot: older than its log, a change that named nothing, or a restarted directory (whose
    revisions start above any its predecessor reached)."""
    monkeypatch.setattr(access_watch, "KEPT", 3)
    w = AccessWatch(start=100)
    w.bump(["bot:a", "user:u"])
    w.bump(["bot:b"])
    assert w.changes(100) == ("bot:a", "bot:b", "user:u")
    assert (w.changes(101), w.changes(102)) == (("bot:b",), ())
    assert w.changes(99) is None  # older than what it ever logged
    for k in range(3):
        w.bump([f"bot:{k}"])
    assert w.changes(101) is None and w.changes(102) == ("bot:0", "bot:1", "bot:2")
    w.bump(None)
    assert w.changes(104) is None
    before = time.time_ns() // 1000
    assert AccessWatch().revision >= before  # counted from the wall clock, in microseconds
    old = AccessWatch(start=before)
    for k in range(3):
        old.bump([f"bot:{k}"])
    restarted = AccessWatch(start=before + 5_000_000)  # its restart, seconds later
    restarted.bump(["bot:x"])
    assert restarted.changes(old.revision) is None


@pytest.mark.anyio
async def test_a_gateway_that_closes_leaves_the_watch(directory):
    """`Auth.close` tells the directory: the gateway is no longer among those a revocation
    waits for, and a revocation already waiting for it stops waiting."""
    auth, _ = await _gateway(directory)
    assert directory.records.access.watchers() == 1
    await auth.close()
    assert directory.records.access.watchers() == 0
    w = AccessWatch(start=0)
    await w.watch("late", 0, wait=0)  # a live gateway, about to fall behind the revision
    waiting = asyncio.ensure_future(w.settled(w.bump(), timeout=3600))
    await asyncio.sleep(0)
    assert not waiting.done()
    w.leave("late")
    await asyncio.wait_for(waiting, 1)


def test_token_hashes_are_kept_at_hand_within_a_bound(monkeypatch):
    """The hash a token is known by is kept per token, so a client's next request does not
    hash it again; at most `HASHED` of them (random tokens cannot grow the gateway)."""
    monkeypatch.setattr(auth_mod, "HASHED", 8)
    auth = Auth(SimpleNamespace(directory_port=None, shard_ports=[]), ADMIN)  # type: ignore[arg-type]
    for n in range(50):
        token = f"obt_{n}"
        assert auth.key_of(token) == hash_token(token) == auth.key_of(token)
        assert 1 <= auth.hashed <= 8
