"""The account file tree (FS-1, FS-2), pure: paths, line format, and `parse(render(s))`."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.directory import Bot, Channel, Org, User
from engine.errors import InvalidInput
from engine.file_tree import (
    AccountSnapshot,
    BotProject,
    CommandReceipt,
    MemoryJob,
    MemoryRecord,
    PoolSnapshot,
    Tombstone,
    canonical,
    escape,
    memory_line,
    parse,
    render,
    unescape,
)
from engine.memory_entries import Scope, Tier
from engine.projects import Project
from engine.scoped_memory import Origin, Revision, WorkspaceStatus

DAY = 86_400_000
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
ACCOUNT = User(id="u_1", name="Ada", orgs=("o_1",))


def _rec(id, pool, contributor, content, at, **kw) -> MemoryRecord:
    return MemoryRecord(
        id=id,
        scope=Scope(pool.partition(":")[0]),
        pool=pool,
        contributor=contributor,
        tier=kw.pop("tier", Tier.LOG),
        content=content,
        created_at=kw.pop("created_at", at),
        updated_at=at,
        **kw,
    )


def _sample() -> AccountSnapshot:
    return AccountSnapshot(
        account=ACCOUNT,
        orgs=(Org(id="o_1", name="Acme"),),
        users=(User(id="u_2", name="Bo", orgs=("o_1",)),),
        bots=(Bot(id="b_1", name="Ada bot", org="o_1", owner="u_1"),),
        channels=(
            Channel(id="c_1", org="o_1", people=("u_1", "u_2"), bots=("b_1",)),
            Channel(id="c_9", org="o_1", people=("u_1",)),
        ),
        projects=(
            Project(
                id="p_1",
                org="o_1",
                owner="u_1",
                name="Launch",
                members=("u_1", "u_2"),
                channels=("c_1",),
                metadata={"goal": "ship"},
                revision=3,
                created_at=T0,
                updated_at=T0 + DAY,
            ),
        ),
        bot_projects={
            "b_1": (BotProject(id="p_1", name="Launch", owner="u_1", channels=("c_1",)),)
        },
        pools=(
            PoolSnapshot(
                pool="bot:b_1",
                records=(
                    _rec("m1", "bot:b_1", "b_1", "Short answers.", T0, tier=Tier.PROFILE),
                    _rec(
                        "m2",
                        "bot:b_1",
                        "b_1",
                        "Met in Lyon.",
                        T0 + 40 * DAY,
                        thread="trip",
                        position=7,
                    ),
                    _rec(
                        "m3",
                        "bot:b_1",
                        "b_1",
                        "Old fact.",
                        T0 + 2 * DAY,
                        status=WorkspaceStatus.FORGOTTEN,
                        revision=2,
                        evidence=("chat_1/i-3",),
                    ),
                ),
                revisions=(
                    Revision(
                        entry="m3",
                        revision=1,
                        operator="b_1",
                        at=T0,
                        change="extracted",
                        after="Old fact.",
                    ),
                    Revision(
                        entry="m3",
                        revision=2,
                        operator="u_1",
                        at=T0 + 2 * DAY,
                        change="forgotten",
                        before="Old fact.",
                    ),
                ),
                tombstones=(
                    Tombstone(
                        entry="m3",
                        revision=2,
                        reason="forgotten",
                        at=T0 + 2 * DAY,
                        evidence=("chat_1/i-3",),
                        content="Old fact.",
                    ),
                ),
                jobs=(
                    MemoryJob(
                        id="job_1",
                        pool="bot:b_1",
                        chat="chat_1",
                        turn="turn_1",
                        upto=3,
                        org="o_1",
                        grant="for:person:u_1",
                        status="failed",
                        attempts=4,
                        error="the learning step failed: model_error",
                        created_at=T0,
                        updated_at=T0 + 1,
                    ),
                ),
            ),
            PoolSnapshot(
                pool="user:u_1",
                records=(
                    _rec(
                        "m4",
                        "user:u_1",
                        "b_1",
                        "我住在里昂。",
                        T0,
                        tier=Tier.PROFILE,
                        origin=Origin.EXPLICIT,
                        protected=True,
                    ),
                ),
            ),
            PoolSnapshot(
                pool="project:p_1",
                records=(_rec("m5", "project:p_1", "b_7", "Ship on Friday.", T0 + DAY),),
            ),
        ),
        commands=(
            CommandReceipt(
                request_id="r-1",
                pool="project:p_1",
                fingerprint="f" * 64,
                at=T0,
                response={"id": "p_1", "revision": 1},
            ),
        ),
    )


def test_the_seed_002_paths():
    base = "bot-workspace/u_1/"
    paths = {p.removeprefix(base) for p in render(_sample())}
    assert {
        "account.json",
        "agents/b_1/projects.json",
        "agents/b_1/memory/profile.md",
        "agents/b_1/memory/log/2026-02.md",
        "agents/b_1/memory/.dreaming/records.json",
        "agents/b_1/memory/.dreaming/synthesized/m1.json",
        "agents/b_1/memory/.dreaming/tombstones/m3.2.json",
        "agents/b_1/memory/.dreaming/forgotten-sources.json",
        "agents/b_1/memory/.dreaming/revisions/m3.json",
        "agents/b_1/memory/.dreaming/jobs/job_1.json",
        "agents/b_1/memory/.dreaming/next-refresh-at",
        "user-memory/agents/b_1/profile.md",
        "user-memory/.dreaming/explicit/m4.json",
        "projects/p_1/project.md",
        "projects/p_1/groups.json",
        "projects/p_1/memory/agents/b_7/log/2026-01.md",
        "projects/p_1/memory/.dreaming/records.json",
    } <= paths
    assert all(p.startswith(base) for p in render(_sample()))
    assert {p for p in paths if p.startswith(".commands/")} != set()


def test_memory_lines_and_files():
    files = render(_sample())
    base = "bot-workspace/u_1/"
    assert files[base + "agents/b_1/memory/profile.md"] == b"- (2026-01-01) Short answers.\n"
    assert files[base + "agents/b_1/memory/log/2026-02.md"] == b"- (2026-02-10) Met in Lyon.\n"
    assert (
        files[base + "user-memory/agents/b_1/profile.md"].decode()
        == "- (2026-01-01) 我住在里昂。\n"
    )
    # The forgotten record has no line; its text is in its tombstone.
    assert b"Old fact." not in b"".join(v for k, v in files.items() if k.endswith(".md"))
    tomb = msgspec.json.decode(files[base + "agents/b_1/memory/.dreaming/tombstones/m3.2.json"])
    assert tomb["content"] == "Old fact." and tomb["reason"] == "forgotten"
    records = msgspec.json.decode(files[base + "agents/b_1/memory/.dreaming/records.json"])
    assert records["pool"] == "bot:b_1"
    m3 = next(r for r in records["records"] if r["id"] == "m3")
    assert (m3["status"], m3["version"], m3["source"], m3["file"]) == (
        "forgotten",
        2,
        ["chat_1/i-3"],
        None,
    )
    assert m3["fingerprint"].startswith("fp1:")
    md = files[base + "projects/p_1/project.md"].decode()
    assert md.startswith('---\nid: "p_1"\nname: "Launch"\n') and "\n# Launch\n" in md
    groups = msgspec.json.decode(files[base + "projects/p_1/groups.json"])
    assert [g["id"] for g in groups["groups"]] == ["c_1"]
    assert files[base + "agents/b_1/memory/.dreaming/next-refresh-at"] == b"none\n"
    assert all(not v.endswith(b"\n\n") and v.endswith(b"\n") for v in files.values())


def test_round_trip_of_the_sample():
    snap = _sample()
    assert parse(render(snap)) == [canonical(snap)]
    assert render(parse(render(snap))[0]) == render(snap)


def test_escaping_keeps_one_record_on_one_line():
    for text in ["a\nb", "tab\tinside", "\\n literal", " lead", "trail ", "\u2028x\x85", "", "  "]:
        line = memory_line(text, T0)
        assert "\n" not in line and "\r" not in line and len(line.splitlines()) <= 1
        assert unescape(escape(text)) == text
    assert escape("C:\\new") == "C:\\\\new"
    assert escape("a\nb") == "a\\nb"


def test_a_hand_edited_line_is_taken_and_a_shifted_one_is_refused():
    files = render(_sample())
    path = "bot-workspace/u_1/agents/b_1/memory/profile.md"
    edited = dict(files)
    edited[path] = b"# Profile\n\n- (2026-01-01) Very short answers.\n"
    (snap,) = parse(edited)
    bot_pool = next(p for p in snap.pools if p.pool == "bot:b_1")
    assert next(r for r in bot_pool.records if r.id == "m1").content == "Very short answers."
    shifted = dict(files)
    shifted[path] = b"- (2026-01-02) Short answers.\n"
    with pytest.raises(InvalidInput, match="dated"):
        parse(shifted)
    extra = dict(files)
    extra[path] = files[path] + b"- (2026-01-01) One more.\n"
    with pytest.raises(InvalidInput, match="2 lines for 1 records"):
        parse(extra)


def test_unexpected_and_unsafe_paths_are_refused():
    files = render(_sample())
    with pytest.raises(InvalidInput, match="unexpected"):
        parse({**files, "bot-workspace/u_1/agents/b_1/notes.txt": b"x"})
    with pytest.raises(InvalidInput):
        parse({**files, "elsewhere/x": b""})
    with pytest.raises(InvalidInput):
        parse({"bot-workspace/../account.json": b"{}"})
    bad = msgspec.structs.replace(_sample(), bots=(Bot(id="..", name="x", org="o_1", owner="u_1"),))
    with pytest.raises(InvalidInput):
        render(bad)


def test_a_forgotten_record_without_tombstone_keeps_its_text_in_records_json():
    snap = _sample()
    pool = snap.pools[0]
    pool = msgspec.structs.replace(pool, tombstones=())
    snap = msgspec.structs.replace(snap, pools=(pool, *snap.pools[1:]))
    files = render(snap)
    records = msgspec.json.decode(
        files["bot-workspace/u_1/agents/b_1/memory/.dreaming/records.json"]
    )
    assert next(r for r in records["records"] if r["id"] == "m3")["content"] == "Old fact."
    assert parse(files) == [canonical(snap)]


# --- random snapshots -----------------------------------------------------------------------------

_ids = st.text(alphabet="abcdefghijk0123456789_", min_size=1, max_size=6)
_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=0, max_size=40
) | st.sampled_from(
    ["多行\n内容", "\\u0041", "a\r\nb", " x ", "\t", "🙂 emoji", "- (2026-01-01) x"]
)
_ms = st.integers(min_value=0, max_value=253_402_300_799_999)  # up to 9999-12-31


@st.composite
def _snapshots(draw) -> AccountSnapshot:
    bots = draw(st.lists(_ids, min_size=1, max_size=3, unique=True))
    bots = [f"b_{b}" for b in bots]
    projects = [f"p_{p}" for p in draw(st.lists(_ids, max_size=2, unique=True))]
    contributors = [*bots, "b_other"]
    pools = [f"bot:{b}" for b in bots] + ["user:u_1"] + [f"project:{p}" for p in projects]
    snaps = []
    used: set[str] = set()
    for pool in pools:
        records, tombs, revs, jobs = [], [], [], []
        for _ in range(draw(st.integers(0, 5))):
            rid = f"m_{len(used)}"
            used.add(rid)
            status = draw(st.sampled_from(list(WorkspaceStatus)))
            revision = draw(st.integers(1, 4))
            content = draw(_text)
            contributor = (
                pool[4:] if pool.startswith("bot:") else draw(st.sampled_from(contributors))
            )
            records.append(
                _rec(
                    rid,
                    pool,
                    contributor,
                    content,
                    draw(_ms),
                    tier=draw(st.sampled_from(list(Tier))),
                    status=status,
                    revision=revision,
                    origin=draw(st.sampled_from(list(Origin))),
                    topics=tuple(draw(st.lists(_ids, max_size=2))),
                    evidence=tuple(draw(st.lists(_ids.map(lambda x: f"chat_{x}/i-1"), max_size=2))),
                    protected=draw(st.booleans()),
                    review=draw(st.booleans()),
                )
            )
            if draw(st.booleans()):
                tombs.append(
                    Tombstone(
                        entry=rid,
                        revision=revision,
                        reason=draw(st.sampled_from(["forgotten", "revised"])),
                        at=draw(_ms),
                        evidence=tuple(draw(st.lists(_ids, max_size=2))),
                        content=draw(st.none() | st.just(content) | _text),
                        fingerprint=draw(st.sampled_from(["", "fp1:abc"])),
                    )
                )
            for n in range(draw(st.integers(0, 2))):
                revs.append(
                    Revision(
                        entry=rid,
                        revision=n + 1,
                        operator="u_1",
                        at=draw(_ms),
                        change="edited",
                        before=draw(st.none() | _text),
                        after=draw(st.none() | _text),
                    )
                )
        if pool.startswith("bot:"):
            for n in range(draw(st.integers(0, 2))):
                jobs.append(
                    MemoryJob(
                        id=f"job_{n}",
                        pool=pool,
                        chat="chat_1",
                        turn="t",
                        upto=n,
                        org="o_1",
                        grant="for:person:u_1",
                        status=draw(st.sampled_from(["pending", "done", "failed"])),
                        error=draw(st.none() | _text),
                        updated_at=draw(_ms),
                    )
                )
        snaps.append(
            PoolSnapshot(
                pool=pool,
                records=tuple(records),
                tombstones=tuple(tombs),
                revisions=tuple(revs),
                jobs=tuple(jobs),
            )
        )
    return AccountSnapshot(
        account=ACCOUNT,
        bots=tuple(Bot(id=b, name=draw(_text), org="o_1", owner="u_1") for b in bots),
        channels=(Channel(id="c_1", org="o_1", name=draw(_text), bots=tuple(bots)),),
        projects=tuple(
            Project(
                id=p,
                org="o_1",
                owner="u_1",
                name=draw(_text),
                members=("u_1",),
                channels=draw(st.sampled_from([(), ("c_1",), ("c_1", "c_gone")])),
                metadata=draw(st.dictionaries(_ids, _text, max_size=2)),
            )
            for p in projects
        ),
        bot_projects={b: (BotProject(id="p_x", name="X", owner="u_9"),) for b in bots[:1]},
        pools=tuple(snaps),
        commands=tuple(
            CommandReceipt(
                request_id=r,
                pool="user:u_1",
                fingerprint="f",
                at=1,
                response={"content": draw(_text)},
            )
            for r in draw(
                st.lists(
                    st.text(alphabet="ab/-:%!~Z9", min_size=1, max_size=12), max_size=3, unique=True
                )
            )
        ),
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_snapshots())
def test_random_snapshots_round_trip_byte_for_byte(snap):
    files = render(snap)
    (back,) = parse(files)
    assert back == canonical(snap)
    assert render(back) == files
    for path, data in files.items():
        if path.endswith(".md") and "/project.md" not in path:
            for line in data.decode().split("\n")[:-1]:
                assert line.startswith("- (") and line[13:15] == ") "


@given(_text)
def test_any_text_survives_a_line(text):
    line = memory_line(text, T0)
    assert "\n" not in line and "\r" not in line
    assert line.splitlines() == [line] or line == ""
    assert unescape(line.removeprefix("- (2026-01-01) ")) == text
