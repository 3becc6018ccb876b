"""Bots shared across orgs (MB-1: "org:<organizationId>", only work in that org sees
it), over random org/grant graphs: orgs, people of one or more of them, bots each with a home
org and some orgs it is shared with, grants, and shares stopped after the memory was written.

The directory is a real one (in this process, on a DuckDB file); every piece of memory is made
by the code that makes it in the server (a Remember, a workspace bot record, a learned fact's
tags) in the org the directory let the work happen in. Then, for every person, bot and org they
name: no entry tagged with another org reaches the prompt or a search (the visibility rule
both read through), the workspace listing or the Markdown export (the workspace reader), or an
event (the audience of the entry and the listener the gateway builds)."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.contracts import WorkspaceAccess
from actors.directory import DirectoryService
from actors.workspace.access import WorkspaceRules
from engine import commands
from engine import memory_union as bm
from engine import tags as tagmod
from engine.directory import Permission, bot_orgs, bot_pool, may_use, work_org
from engine.errors import OpenBotError
from engine.events import Listener, admits, entry_audience
from engine.memory_entries import EntryMeta, Layer, Reader, Scope, Tier
from engine.scoped_memory import WorkspaceEntry
from engine.visibility import Visibility

ORGS = ("o0", "o1", "o2", "o3")


@st.composite
def graphs(draw):
    n = draw(st.integers(2, 4))
    orgs = ORGS[:n]
    org_sets = st.lists(st.sampled_from(orgs), min_size=1, max_size=n, unique=True)
    people = draw(st.lists(org_sets, min_size=2, max_size=5))
    bots = []
    for _ in range(draw(st.integers(1, 3))):
        owner = draw(st.integers(0, len(people) - 1))
        home = draw(st.sampled_from(people[owner]))
        shared = draw(st.lists(st.sampled_from(orgs), max_size=n, unique=True))
        bots.append((owner, home, shared))
    grants = draw(
        st.lists(
            st.tuples(
                st.integers(0, len(bots) - 1),
                st.integers(0, len(people) - 1),
                st.sampled_from(["read", "write"]),
            ),
            max_size=8,
        )
    )
    named = st.one_of(st.none(), st.sampled_from(orgs))
    work = draw(
        st.lists(
            st.tuples(st.integers(0, len(people) - 1), st.integers(0, len(bots) - 1), named),
            min_size=1,
            max_size=10,
        )
    )
    stopped = draw(
        st.lists(st.tuples(st.integers(0, len(bots) - 1), st.sampled_from(orgs)), max_size=3)
    )
    return orgs, people, bots, grants, work, stopped


async def _build(path, orgs, people, bots, grants, work, stopped):
    """The graph in a real directory, the memory its work wrote (entry, the org it was written
    in) and the directory's final records."""
    d = DirectoryService(path)
    try:
        for o in orgs:
            await d.admin.create_org(o, id=o)
        users = [
            (await d.admin.create_user(f"p{k}", list(os), id=f"u{k}"))[0]
            for k, os in enumerate(people)
        ]
        made = []
        for k, (owner, home, shared) in enumerate(bots):
            owner_id = users[owner].id
            bot = await d.admin.create_bot(name=f"b{k}", org=home, owner=owner_id, id=f"b{k}")
            for o in shared:
                bot = await d.admin.share_bot(bot.id, o)
            made.append(bot)
        for b, u, permission in grants:
            # Refused (another org, or write from a shared org): nothing stored.
            with contextlib.suppress(OpenBotError):
                await d.admin.grant(made[b].id, users[u].id, Permission(permission))
        entries: list[EntryMeta] = []
        records: list[WorkspaceEntry] = []
        for n, (u, b, named) in enumerate(work):
            user, bot = users[u], made[b]
            try:
                chat = await d.chat_registry.create_chat(user.id, named, bot=bot.id)
            except OpenBotError:
                continue  # the directory let no work happen here
            org = chat.org
            # The gateway's choice of org for the same request is the directory's.
            assert work_org(d.records.bots[bot.id], user, named) == org
            reader = Reader(user=user.id, org=org, uses_bot=True)
            pinned = commands.remember(
                pool=bot_pool(bot.id), entry_id=f"p{n}", reader=reader, topics=(), now=1, version=0
            ).upserts[0]
            learned = EntryMeta(
                id=f"f{n}",
                pool=bot_pool(bot.id),
                layer=Layer.PINNED,  # its proofs aside, a fact's org rule is a pinned one's
                tags=(tagmod.author(user.id), tagmod.FOR_BOT, tagmod.org(org)),
                created_at=1,
                updated_at=1,
            )
            entries += [pinned, learned]
            access = WorkspaceAccess(
                account=user.id,
                bots=frozenset({bot.id}),
                orgs=(named or org,),
                bot_orgs={bot.id: work_org(d.records.bots[bot.id], user, named) or ""},
            )
            pool = SimpleNamespace(id=bot_pool(bot.id), bot_org=bot.org)
            written_in = _rules().bot_reader(pool, access).org
            assert written_in == org
            records.append(
                WorkspaceEntry(
                    id=f"w{n}",
                    scope=Scope.BOT,
                    pool=bot_pool(bot.id),
                    contributor=bot.id,
                    tier=Tier.PROFILE,
                    content_fp="x",
                    created_at=1,
                    updated_at=1,
                    tags=bm.record_tags(user.id, written_in),
                )
            )
        for b, o in stopped:
            with contextlib.suppress(OpenBotError):  # not shared with that org
                await d.admin.unshare_bot(made[b].id, o)
        final = {b.id: d.records.bots[b.id] for b in made}
        principals = [await d.reads.authenticate(_token_of(d, u.id)) for u in users]
        return users, final, principals, entries, records
    finally:
        d.store.db.close()


def _token_of(d: DirectoryService, user: str) -> str:
    return next(h for h, u in d.records.tokens.items() if u == user)


def _rules() -> WorkspaceRules:
    pools = SimpleNamespace(get=lambda _pool: None)
    return WorkspaceRules(pools=pools, projects=None, peers=None, index=0)


def _org(tags) -> str:
    (org,) = tagmod.orgs_of(tags)
    return org


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(graphs())
def test_mb1_no_entry_of_one_org_reaches_work_in_another(graph):
    orgs = graph[0]
    with tempfile.TemporaryDirectory(prefix="obshare") as path:
        users, bots, principals, entries, records = asyncio.run(_build(path, *graph))
    rules = _rules()
    for bot in bots.values():
        # A bot's grantees are people of an org it works in; write only from its home org.
        for u, p in bot.grants.items():
            user = next(x for x in users if x.id == u)
            assert set(user.orgs) & set(bot_orgs(bot))
            assert p != Permission.WRITE or bot.org in user.orgs
    for user, principal in zip(users, principals, strict=True):
        listener = Listener(
            user=user.id,
            orgs=frozenset(user.orgs),
            channels=principal.channels,
            bots=principal.bots,
            unshared=principal.unshared,
        )
        for bot in bots.values():
            pool = bot_pool(bot.id)
            mine = {e.id: e for e in entries if e.pool == pool}
            kept = [r for r in records if r.pool == pool]
            for named in (None, *orgs):
                org = work_org(bot, user, named) if may_use(bot, user) else None
                if org is None:
                    continue
                # The org of the work is one the person and the bot share.
                assert org in user.orgs and org in bot_orgs(bot)
                reader = Reader(user=user.id, org=org, uses_bot=True)
                seen = Visibility(reader, mine)
                for e in mine.values():
                    if seen.visible(e.id):  # prompt packing and search read through this
                        assert _org(e.tags) == org, (e, reader)
                access = WorkspaceAccess(
                    account=user.id, bots=principal.bots, orgs=(org,), bot_orgs={bot.id: org}
                )
                ws_reader = rules.bot_reader(SimpleNamespace(id=pool, bot_org=bot.org), access)
                for r in kept:
                    if bm.record_visible(ws_reader, r):  # listing, search, export
                        assert _org(r.tags) == org, (r, ws_reader)
            # Events: heard only by a person of the entry's org, who uses the bot there.
            for e in mine.values():
                if admits(entry_audience(bot.id, e.id, mine), listener):
                    entry_org = _org(e.tags)
                    assert entry_org in user.orgs
                    assert tagmod.person(user.id) in e.tags or entry_org in bot_orgs(bot)
            for r in kept:
                if admits(rules.audience(pool, r), listener):
                    assert _org(r.tags) in user.orgs and _org(r.tags) in bot_orgs(bot)


def test_mb1_managing_a_shared_bot_needs_its_home_org():
    """A write grant held by a person of a shared org only (a directory row written before the
    rule, or by hand) still does not let them purge or change the memory bot: those act on
    every org's memory."""
    from engine.directory import Bot, User, require_use, require_write
    from engine.errors import Forbidden

    bot = Bot(id="b1", name="B", org="o0", owner="u0", grants={"u1": "write"}, sharedOrgs=("o1",))
    away = User(id="u1", name="Away", orgs=("o1",))
    require_use(bot, away, "o1")
    try:
        require_write(bot, away)
    except Forbidden as e:
        assert e.code == "home_org_only"
    else:
        raise AssertionError("write from a shared org was let through")


def test_mb1_concurrent_directory_changes_are_each_one_step():
    """In one directory, all at once: 24 shares with distinct orgs and 24 with one org all
    land (the org once); then 24 stops of one share: exactly one answers, the others find no
    share; and 24 chat creations racing a stop either made their chat in the shared org before
    it or were refused, never a chat in an org the bot no longer works in."""

    async def go(path):
        d = DirectoryService(path)
        try:
            orgs = [f"c{k}" for k in range(24)]
            for o in ("home", "x", *orgs):
                await d.admin.create_org(o, id=o)
            await d.admin.create_user("owner", ["home"], id="u0")
            await d.admin.create_user("dave", ["x"], id="u1")
            await d.admin.create_bot(name="b", org="home", owner="u0", id="b1")
            await asyncio.gather(
                *(d.admin.share_bot("b1", o) for o in orgs),
                *(d.admin.share_bot("b1", "x") for _ in range(24)),
            )
            shared = d.records.bots["b1"].sharedOrgs
            await d.admin.grant("b1", "u1", Permission.READ)
            stops = await asyncio.gather(
                *(d.admin.unshare_bot("b1", "x") for _ in range(24)), return_exceptions=True
            )
            await d.admin.share_bot("b1", "x")
            await d.admin.grant("b1", "u1", Permission.READ)
            made = await asyncio.gather(
                *(d.chat_registry.create_chat("u1", None, bot="b1") for _ in range(24)),
                d.admin.unshare_bot("b1", "x"),
                *(d.chat_registry.create_chat("u1", None, bot="b1") for _ in range(24)),
                return_exceptions=True,
            )
            return orgs, shared, stops, made
        finally:
            d.store.db.close()

    with tempfile.TemporaryDirectory(prefix="obshare") as path:
        orgs, shared, stops, made = asyncio.run(go(path))
    assert sorted(shared) == sorted(["x", *orgs])
    assert len([s for s in stops if not isinstance(s, BaseException)]) == 1
    assert all(s.code == "share_not_found" for s in stops if isinstance(s, BaseException))
    chats, stop, after = made[:24], made[24], made[25:]
    assert not isinstance(stop, BaseException)
    for result in (*chats, *after):
        if isinstance(result, BaseException):
            assert getattr(result, "code", None) == "bot_not_found", result
        else:
            assert result.org == "x"
    # The ones asked after the stop was queued behind its lock are all refused.
    assert all(isinstance(r, BaseException) for r in after)
