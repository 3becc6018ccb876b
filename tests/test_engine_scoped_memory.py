"""Workspace memory records (SC-1..SC-4): contributions, protection, review flags, user quotes,
forget barriers, manual revision and stale revisions."""

from __future__ import annotations

import hmac
import itertools

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import Conflict, InvalidInput
from engine.fingerprints import content_fingerprint, normalize
from engine.memory_entries import Scope, Tier
from engine.scoped_memory import (
    MIN_QUOTE_CHARS,
    Extraction,
    ForgetBarrier,
    Origin,
    SourceItem,
    WorkspaceEntry,
    WorkspaceStatus,
    forget,
    may_access,
    pool_of,
    pool_owner,
    propose_all,
    propose_extraction,
    quote_ok,
    scope_of,
    settled_reviews,
    source_marker,
    to_scoped,
    user_create,
    user_edit,
    view,
)

T0 = 1_790_000_000_000
BOT_POOL = "bot:b_ada"
USER_POOL = "user:u_ann"
PROJ_POOL = "project:p_1"

SOURCES = {
    s.marker: s
    for s in (
        SourceItem(
            chat="chat_1", item="i-1", kind="person", author="u_ann", text="I live in Paris."
        ),
        SourceItem(
            chat="chat_1",
            item="i-2",
            kind="bot",
            author="b_ada",
            text="Noted, you live in Paris and like tea.",
        ),
        SourceItem(
            chat="chat_1",
            item="i-3",
            kind="person",
            author="u_ann",
            text="Please  remember:\nI never drink coffee after 6pm.",
        ),
        SourceItem(
            chat="chat_2", item="i-1", kind="person", author="u_bob", text="Ann loves jazz."
        ),
        SourceItem(chat="chat_3", item="i-9", kind="person", author="u_ann", text="我不吃辣"),
        SourceItem(chat="chat_4", item="i-1", kind="person", author="u_ann", text="ok"),
        SourceItem(
            chat="chat_5", item="i-1", kind="person", author="u_ann", text="We ship on Fridays."
        ),
    )
}


def ids(prefix: str = "new_"):
    counter = itertools.count(1)
    return lambda: f"{prefix}{next(counter)}"


def propose(entries, proposal, barriers=(), *, new_id=None, contents=None, now=T0 + 10):
    return propose_extraction(
        {e.id: e for e in entries},
        proposal,
        list(barriers),
        now,
        new_id or ids(),
        sources=SOURCES,
        contents=contents,
    )


def record(entry_id, pool, contributor, content, **kw) -> WorkspaceEntry:
    return WorkspaceEntry(
        id=entry_id,
        scope=scope_of(pool),
        pool=pool,
        contributor=contributor,
        tier=kw.pop("tier", Tier.LOG),
        content_fp=content_fingerprint(content),
        created_at=T0,
        updated_at=T0,
        **kw,
    )


def fact(pool=BOT_POOL, contributor="b_ada", content="Ann lives in Paris", **kw) -> Extraction:
    kw.setdefault("evidence", ("chat_1/i-1",))
    return Extraction(pool=pool, contributor=contributor, content=content, **kw)


# --- fingerprints and quotes ----------------------------------------------------------------------


def test_fingerprint_ignores_case_spacing_and_punctuation_but_not_rewording():
    fp = content_fingerprint("Ann lives in Paris.")
    assert content_fingerprint("  ann LIVES   in\nparis ") == fp
    assert content_fingerprint("Ann lives in Paris!!") == fp
    assert content_fingerprint("Ann resides in Paris") != fp
    assert content_fingerprint("我不吃辣。") == content_fingerprint("我不吃辣")
    assert content_fingerprint("\uff21\uff22\uff23") == content_fingerprint("abc")  # full-width ABC
    assert content_fingerprint("Ann lives in Paris", key=b"pool-key") != fp


words_st = st.lists(st.text(alphabet="abcXYZ我们", min_size=1, max_size=6), min_size=1, max_size=6)
gap_st = st.sampled_from([" ", "  ", "\n", "\t ", ", ", " - ", "! ", "; "])


@settings(max_examples=200, deadline=None)
@given(words_st, st.data())
def test_fingerprint_is_stable_under_case_spacing_and_punctuation(words, data):
    plain = " ".join(words)
    gaps = [data.draw(gap_st) for _ in words]
    noisy = "".join(w.upper() + g for w, g in zip(words, gaps, strict=True))
    assert normalize(noisy) == normalize(plain)
    assert content_fingerprint(noisy) == content_fingerprint(plain)


@settings(max_examples=200, deadline=None)
@given(
    key=st.one_of(st.binary(max_size=130), st.sampled_from([b"", b"k" * 64, b"k" * 65])),
    texts=st.lists(st.text(max_size=200), min_size=1, max_size=3),
)
def test_fingerprints_are_hmac_sha256_whatever_the_key(key, texts):
    """Exactly HMAC-SHA256 of the normalized text, text after text under one key (the keyed
    HMAC kept per key is copied, never used up), so a stored fingerprint still matches."""
    for text in texts:
        expected = "fp1:" + hmac.digest(key, normalize(text).encode(), "sha256").hex()
        assert content_fingerprint(text, key) == expected
    expected = "fp1:" + hmac.digest(key, b"ann lives in paris", "sha256").hex()
    assert content_fingerprint("Ann lives in Paris.", key) == expected


def test_quote_ok():
    source = "Please  remember:\nI never drink coffee after 6pm."
    assert quote_ok("I never drink coffee after 6pm", source)
    assert quote_ok("remember: I never", source)  # whitespace runs count as one
    assert not quote_ok("I never drink tea", source)
    assert not quote_ok("i never drink coffee", source)  # the user's words, as they wrote them
    assert not quote_ok("   ", source)
    assert quote_ok("不吃辣", "我不吃辣")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.integers(0, 60), st.integers(0, 60))
def test_every_non_blank_slice_of_a_text_is_a_quote_of_it(text, a, b):
    part = text[min(a, b) : max(a, b)]
    assert quote_ok(part, text) == bool(part.strip())


# --- extraction -----------------------------------------------------------------------------------


def test_a_new_fact_is_created_with_its_evidence():
    d = propose([], fact(topics=("home",), tier=Tier.PROFILE))
    assert d.outcome == "created" and d.accepted
    e = d.entry
    assert e is not None and d.content == "Ann lives in Paris"
    assert (e.id, e.pool, e.scope, e.contributor, e.tier) == (
        "new_1",
        BOT_POOL,
        Scope.BOT,
        "b_ada",
        Tier.PROFILE,
    )
    assert e.evidence == ("chat_1/i-1",) and e.topics == ("home",)
    assert (e.protected, e.review, e.status, e.origin, e.revision) == (
        False,
        False,
        WorkspaceStatus.ACTIVE,
        Origin.SYNTHESIZED,
        1,
    )
    assert d.revision is not None and d.revision.change == "extracted"
    assert d.revision.after == "Ann lives in Paris" and d.revision.operator == "b_ada"


def test_bot_memory_goes_only_into_the_bots_own_pool():
    d = propose([], fact(pool="bot:b_other"))
    assert (d.outcome, d.code) == ("refused", "not_own_pool")


@pytest.mark.parametrize(
    "proposal",
    [
        fact(content=""),
        fact(content="x" * 5000),
        fact(topics=("for:person:u_eve",)),
        fact(topics=("Bad Topic",)),
        fact(pool="elsewhere:1"),
        fact(tier="bogus"),
    ],
)
def test_malformed_proposals_are_refused(proposal):
    d = propose([], proposal)
    assert (d.outcome, d.code) == ("refused", "invalid")


def test_evidence_must_be_in_the_turn_and_include_a_persons_words():
    assert propose([], fact(evidence=("chat_9/i-1",))).code == "no_evidence"
    assert propose([], fact(evidence=())).code == "no_evidence"
    # LRN-9: the bot's own words alone never become memory.
    assert propose([], fact(content="Ann likes tea", evidence=("chat_1/i-2",))).code == (
        "no_evidence"
    )
    assert propose([], fact(evidence=("chat_1/i-1", "chat_1/i-2"))).accepted


def test_a_taken_new_id_is_the_callers_bug_not_a_silent_overwrite():
    theirs = record("new_1", BOT_POOL, "b_bob", "something else")
    with pytest.raises(Conflict):
        propose([theirs], fact())


def test_same_content_already_in_the_pool_is_a_duplicate():
    existing = record("mem_9", BOT_POOL, "b_ada", "Ann lives in Paris")
    d = propose([existing], fact(content="ann lives in paris!"))
    assert d.outcome == "duplicate" and d.entry is None and not d.accepted


# --- user scope: the user's own words -------------------------------------------------------------


def test_user_memory_quotes_the_users_own_words():
    ok = fact(
        pool=USER_POOL,
        content='Ann said: "I never drink coffee after 6pm"',
        quote="I never drink coffee after 6pm",
        evidence=("chat_1/i-3",),
    )
    d = propose([], ok)
    assert d.outcome == "created" and d.entry is not None and d.entry.scope == Scope.USER


@pytest.mark.parametrize(
    ("content", "quote", "evidence"),
    [
        # a paraphrase is not a quote
        ("Ann avoids late coffee", None, ("chat_1/i-3",)),
        ("Ann avoids late coffee", "I avoid late coffee", ("chat_1/i-3",)),
        # someone else's words about the user
        ('"Ann loves jazz"', "Ann loves jazz", ("chat_2/i-1",)),
        # the bot's words
        ('"you live in Paris"', "you live in Paris", ("chat_1/i-1", "chat_1/i-2")),
        # a real quote that the content does not carry
        ("Ann has a coffee rule", "I never drink coffee", ("chat_1/i-3",)),
        # too short to be a quote of a longer message
        ("I am never wrong", "I ", ("chat_1/i-3",)),
    ],
)
def test_user_memory_without_the_users_words_is_refused(content, quote, evidence):
    d = propose([], fact(pool=USER_POOL, content=content, quote=quote, evidence=evidence))
    assert (d.outcome, d.code) == ("refused", "not_users_words")


def test_a_short_quote_is_fine_when_it_is_the_whole_message():
    assert MIN_QUOTE_CHARS > 2
    d = propose(
        [], fact(pool=USER_POOL, content='Ann said "ok"', quote="ok", evidence=("chat_4/i-1",))
    )
    assert d.accepted
    cjk = fact(
        pool=USER_POOL, content="用户说\uff1a我不吃辣", quote="我不吃辣", evidence=("chat_3/i-9",)
    )
    assert propose([], cjk).accepted


# --- contributions: own records only, protected records never, review on shared topics ----------


def test_a_bot_updates_its_own_contribution():
    mine = record("mem_1", PROJ_POOL, "b_ada", "We ship on Thursdays", evidence=("chat_1/i-1",))
    d = propose(
        [mine],
        fact(
            pool=PROJ_POOL,
            content="We ship on Fridays",
            evidence=("chat_5/i-1",),
            replaces="mem_1",
            topics=("release",),
        ),
        contents={"mem_1": "We ship on Thursdays"},
    )
    assert d.outcome == "updated" and d.entry is not None
    assert d.entry.id == "mem_1" and d.entry.revision == 2 and d.entry.updated_at == T0 + 10
    assert d.entry.evidence == ("chat_1/i-1", "chat_5/i-1")
    assert d.entry.content_fp == content_fingerprint("We ship on Fridays")
    assert d.revision is not None
    assert (d.revision.before, d.revision.after, d.revision.change) == (
        "We ship on Thursdays",
        "We ship on Fridays",
        "updated",
    )


def test_a_bot_cannot_overwrite_another_contributors_record():
    theirs = record("mem_1", PROJ_POOL, "b_bob", "We ship on Thursdays")
    d = propose(
        [theirs],
        fact(
            pool=PROJ_POOL, content="We ship on Fridays", evidence=("chat_5/i-1",), replaces="mem_1"
        ),
    )
    assert (d.outcome, d.code) == ("refused", "not_yours")
    assert d.entry is None and d.flagged == ()


def test_the_memory_bot_never_changes_a_protected_record():
    edited = record("mem_1", BOT_POOL, "b_ada", "Ann lives in Lyon", protected=True)
    d = propose([edited], fact(replaces="mem_1"))
    assert (d.outcome, d.code) == ("refused", "protected")


def test_a_forgotten_record_is_not_revived_by_replacing_it():
    gone = record("mem_1", BOT_POOL, "b_ada", "Ann likes jazz", status=WorkspaceStatus.FORGOTTEN)
    assert propose([gone], fact(replaces="mem_1")).code == "not_active"
    assert propose([], fact(replaces="mem_404")).code == "not_found"
    other_pool = record("mem_2", "bot:b_zed", "b_ada", "x")
    assert propose([other_pool], fact(replaces="mem_2")).code == "not_found"


def test_a_second_contribution_on_a_topic_is_kept_and_both_are_flagged():
    theirs = record("mem_1", PROJ_POOL, "b_bob", "We ship on Thursdays", topics=("release",))
    d = propose(
        [theirs],
        fact(
            pool=PROJ_POOL,
            content="We ship on Fridays",
            evidence=("chat_5/i-1",),
            topics=("release",),
        ),
    )
    assert d.outcome == "created" and d.entry is not None and d.entry.review
    assert len(d.flagged) == 1
    flagged = d.flagged[0]
    assert flagged.id == "mem_1" and flagged.review
    # Only the flag moved: their content, revision and update time stay.
    assert msgspec.structs.replace(flagged, review=False) == theirs


def test_the_same_bot_on_its_own_topic_is_not_a_review_case():
    mine = record("mem_1", PROJ_POOL, "b_ada", "We ship on Thursdays", topics=("release",))
    d = propose(
        [mine],
        fact(
            pool=PROJ_POOL,
            content="We ship on Fridays",
            evidence=("chat_5/i-1",),
            topics=("release",),
        ),
    )
    assert d.accepted and d.entry is not None and not d.entry.review and d.flagged == ()


def test_a_persons_record_on_the_topic_is_flagged_even_under_the_same_bot():
    by_hand = record(
        "mem_1", PROJ_POOL, "b_ada", "Ship on Thursdays", topics=("release",), protected=True
    )
    d = propose(
        [by_hand],
        fact(
            pool=PROJ_POOL,
            content="We ship on Fridays",
            evidence=("chat_5/i-1",),
            topics=("release",),
        ),
    )
    assert d.entry is not None and d.entry.review
    assert [e.id for e in d.flagged] == ["mem_1"]


def test_review_flags_settle_when_the_rival_is_gone_or_the_person_edits():
    a = record("mem_a", PROJ_POOL, "b_bob", "Ship Thursdays", topics=("release",), review=True)
    b = record("mem_b", PROJ_POOL, "b_ada", "Ship Fridays", topics=("release",), review=True)
    c = record("mem_c", PROJ_POOL, "b_zed", "Unrelated", topics=("other",))
    assert settled_reviews({e.id: e for e in (a, b, c)}) == []
    gone = forget(a, 1, operator="u_ann", old_content="Ship Thursdays", now=T0).entry
    assert not gone.review
    assert settled_reviews({e.id: e for e in (gone, b, c)}) == [
        msgspec.structs.replace(b, review=False)
    ]
    edited = user_edit(
        b, "Ship on Fridays", 1, operator="u_ann", old_content="Ship Fridays", now=T0
    )
    assert not edited.entry.review and edited.entry.protected


# --- forgetting and manual revision ---------------------------------------------------------------


def test_forget_records_a_barrier_and_the_old_content():
    e = record("mem_1", BOT_POOL, "b_ada", "Ann lives in Paris", evidence=("chat_1/i-1",))
    out = forget(e, 1, operator="u_ann", old_content="Ann lives in Paris", now=T0 + 5)
    assert out.entry.status == WorkspaceStatus.FORGOTTEN and out.entry.revision == 2
    assert out.barrier == ForgetBarrier(
        pool=BOT_POOL,
        fingerprint=e.content_fp,
        evidence=("chat_1/i-1",),
        at=T0 + 5,
        entry="mem_1",
        reason="forgotten",
    )
    assert out.revision is not None
    assert (out.revision.before, out.revision.after, out.revision.operator) == (
        "Ann lives in Paris",
        None,
        "u_ann",
    )
    again = forget(out.entry, 2, operator="u_ann", old_content="", now=T0 + 6)
    assert again.entry is out.entry and again.barrier is None


def test_a_forgotten_fact_reworded_from_the_same_turn_is_refused():
    e = record("mem_1", BOT_POOL, "b_ada", "Ann lives in Paris", evidence=("chat_1/i-1",))
    barrier = forget(e, 1, operator="u_ann", old_content="Ann lives in Paris", now=T0).barrier
    assert barrier is not None
    gone = forget(e, 1, operator="u_ann", old_content="", now=T0).entry
    # An old extraction job over the same turn comes back with other words.
    reworded = fact(content="Ann's home city is Paris, France", evidence=("chat_1/i-1",))
    assert content_fingerprint(reworded.content) != e.content_fp
    d = propose([gone], reworded, [barrier])
    assert (d.outcome, d.code) == ("refused", "forgotten") and d.entry is None
    # The same words from another turn are caught by the fingerprint.
    same_words = fact(content="ann lives in paris.", evidence=("chat_5/i-1",))
    assert propose([gone], same_words, [barrier]).code == "forgotten"
    # Something else from another turn is fine, and a barrier holds only in its own pool.
    assert propose(
        [gone], fact(content="Ships on Fridays", evidence=("chat_5/i-1",)), [barrier]
    ).accepted
    elsewhere = fact(pool=PROJ_POOL, content="Ann lives in Paris", evidence=("chat_1/i-1",))
    assert propose([gone], elsewhere, [barrier]).accepted


def test_a_stale_revision_changes_nothing():
    e = record("mem_1", BOT_POOL, "b_ada", "Ann lives in Paris", revision=3)
    for call in (
        lambda: forget(e, 2, operator="u_ann", old_content="x", now=T0),
        lambda: user_edit(e, "Ann lives in Lyon", 2, operator="u_ann", old_content="x", now=T0),
    ):
        with pytest.raises(Conflict) as err:
            call()
        assert err.value.code == "stale_revision"
        assert err.value.details == {"currentRevision": 3}
    assert e.revision == 3 and e.status == WorkspaceStatus.ACTIVE and not e.protected


def test_a_manual_revision_protects_the_record_and_bars_the_old_wording():
    e = record(
        "mem_1", BOT_POOL, "b_ada", "Ann lives in Paris", evidence=("chat_1/i-1",), topics=("home",)
    )
    out = user_edit(
        e, "Ann lives in Lyon", 1, operator="u_ann", old_content="Ann lives in Paris", now=T0 + 7
    )
    assert out.entry.protected and out.entry.revision == 2 and out.entry.updated_at == T0 + 7
    assert out.entry.content_fp == content_fingerprint("Ann lives in Lyon")
    assert out.revision is not None
    assert (
        out.revision.before,
        out.revision.after,
        out.revision.change,
        out.revision.revision,
    ) == (
        "Ann lives in Paris",
        "Ann lives in Lyon",
        "edited",
        2,
    )
    assert out.barrier is not None and out.barrier.reason == "revised"
    assert out.barrier.fingerprint == e.content_fp and out.barrier.evidence == ("chat_1/i-1",)
    # The old job proposes the old fact again, reworded, and to replace the edited record.
    old_job = fact(content="Ann's home is Paris", evidence=("chat_1/i-1",), replaces="mem_1")
    assert propose([out.entry], old_job, [out.barrier]).code == "forgotten"
    assert (
        propose(
            [out.entry], fact(content="Ann lives in Paris", evidence=("chat_5/i-1",)), [out.barrier]
        ).code
        == "forgotten"
    )


def test_a_revision_of_tier_or_topics_only_leaves_no_barrier():
    e = record("mem_1", BOT_POOL, "b_ada", "Ann lives in Paris")
    out = user_edit(
        e, None, 1, operator="u_ann", old_content="Ann lives in Paris", now=T0, tier="profile"
    )
    assert out.entry.tier == Tier.PROFILE and out.entry.protected and out.entry.revision == 2
    assert out.barrier is None
    same = user_edit(
        e, "Ann lives in Paris", 1, operator="u_ann", old_content="Ann lives in Paris", now=T0
    )
    assert same.entry is e and same.revision is None


def test_a_forgotten_record_cannot_be_edited_and_bad_input_is_refused():
    gone = record("mem_1", BOT_POOL, "b_ada", "x", status=WorkspaceStatus.FORGOTTEN)
    with pytest.raises(Conflict):
        user_edit(gone, "y", 1, operator="u_ann", old_content="x", now=T0)
    e = record("mem_2", BOT_POOL, "b_ada", "x")
    with pytest.raises(InvalidInput):
        user_edit(e, "  ", 1, operator="u_ann", old_content="x", now=T0)
    with pytest.raises(InvalidInput):
        user_edit(e, None, 1, operator="u_ann", old_content="x", now=T0, topics=["chat:c_1"])


def test_a_record_a_person_writes_is_explicit_and_protected():
    out = user_create(
        entry_id="mem_7",
        pool=PROJ_POOL,
        contributor="b_ada",
        content="Release notes go in CHANGES.md",
        operator="u_ann",
        now=T0,
        topics=["release"],
    )
    assert out.entry.protected and out.entry.origin == Origin.EXPLICIT
    assert (out.entry.scope, out.entry.tier, out.entry.revision) == (Scope.PROJECT, Tier.PROFILE, 1)
    assert out.revision is not None and out.revision.change == "created"
    assert propose([out.entry], fact(pool=PROJ_POOL, replaces="mem_7")).code == "protected"
    with pytest.raises(InvalidInput):
        user_create(entry_id="m", pool="bogus", contributor="b", content="x", operator="u", now=0)


# --- one job, several proposals -------------------------------------------------------------------


def test_propose_all_checks_each_call_against_what_the_earlier_ones_left():
    theirs = record("mem_0", PROJ_POOL, "b_bob", "Ship on Thursdays", topics=("release",))
    decisions, records, texts = propose_all(
        {"mem_0": theirs},
        [
            fact(
                pool=PROJ_POOL,
                content="We ship on Fridays",
                evidence=("chat_5/i-1",),
                topics=("release",),
            ),
            fact(pool=PROJ_POOL, content="we ship on fridays!", evidence=("chat_5/i-1",)),
            fact(
                pool=PROJ_POOL,
                content="We ship on Friday mornings",
                evidence=("chat_5/i-1",),
                replaces="new_1",
                topics=("release",),
            ),
        ],
        [],
        T0,
        ids(),
        sources=SOURCES,
    )
    assert [d.outcome for d in decisions] == ["created", "duplicate", "updated"]
    assert (
        decisions[2].revision is not None and decisions[2].revision.before == "We ship on Fridays"
    )
    assert set(records) == {"mem_0", "new_1"} and records["mem_0"].review
    assert records["new_1"].revision == 2 and records["new_1"].review
    assert texts == {"new_1": "We ship on Friday mornings"}


# --- pools, access, views -------------------------------------------------------------------------


def test_pools_and_access():
    assert pool_of("bot", bot="b_1", account="u_1") == "bot:b_1"
    assert pool_of(Scope.USER, bot="b_1", account="u_1") == "user:u_1"
    assert pool_of("project", bot="b_1", account="u_1", project="p_1") == "project:p_1"
    with pytest.raises(InvalidInput):
        pool_of("project", bot="b_1", account="u_1")
    with pytest.raises(InvalidInput):
        scope_of("chat:c_1")
    assert pool_owner("project:p_1") == "p_1"
    rules = {"account": "u_1", "bots": {"b_1"}, "projects": {"p_1"}}
    assert may_access("bot:b_1", **rules) and not may_access("bot:b_2", **rules)
    assert may_access("user:u_1", **rules) and not may_access("user:u_2", **rules)
    assert may_access("project:p_1", **rules) and not may_access("project:p_2", **rules)


def test_view_and_prompt_form():
    e = record("mem_1", PROJ_POOL, "b_ada", "x", topics=("t",))
    body = msgspec.json.decode(msgspec.json.encode(view(e, "We ship on Fridays")))
    assert body["content"] == "We ship on Fridays" and body["updatedAt"] == T0
    assert "content_fp" not in body and body["scope"] == "project"
    assert source_marker(e) == "project:p_1 · b_ada"
    assert source_marker(record("mem_2", BOT_POOL, "b_ada", "x")) == "bot:b_ada"
    scoped = to_scoped(e, "We ship on Fridays")
    assert (scoped.scope, scoped.tier, scoped.source) == ("project", "log", "project:p_1 · b_ada")


# --- property: a bot's extractions never touch what is not its own --------------------------------

proposal_st = st.builds(
    Extraction,
    pool=st.sampled_from([BOT_POOL, PROJ_POOL, USER_POOL, "bot:b_bob"]),
    contributor=st.sampled_from(["b_ada", "b_bob"]),
    content=st.sampled_from(
        ["Ann lives in Paris", "We ship on Fridays", 'Ann said "I never drink coffee after 6pm"']
    ),
    evidence=st.lists(st.sampled_from(sorted(SOURCES)), max_size=2).map(tuple),
    topics=st.lists(st.sampled_from(["home", "release", "drinks"]), max_size=2, unique=True).map(
        tuple
    ),
    replaces=st.one_of(st.none(), st.sampled_from(["mem_a", "mem_b", "mem_c", "new_1", "new_2"])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(proposal_st, max_size=8))
def test_extractions_only_ever_change_the_contributors_own_unprotected_records(proposals):
    start = {
        "mem_a": record("mem_a", PROJ_POOL, "b_bob", "Ship Thursdays", topics=("release",)),
        "mem_b": record(
            "mem_b", PROJ_POOL, "b_ada", "Ann edited", topics=("home",), protected=True
        ),
        "mem_c": record("mem_c", BOT_POOL, "b_ada", "Old fact", evidence=("chat_1/i-3",)),
    }
    barrier = ForgetBarrier(pool=BOT_POOL, fingerprint="fp1:none", evidence=("chat_1/i-1",), at=T0)
    state = dict(start)
    new_id = ids()
    for p in proposals:
        d = propose_extraction(state, p, [barrier], T0 + 1, new_id, sources=SOURCES)
        if d.outcome == "refused":
            assert d.entry is None and d.flagged == ()
            continue
        for flagged in d.flagged:  # another's record: only the review flag may change
            old = state[flagged.id]
            assert msgspec.structs.replace(flagged, review=old.review) == old
        if d.outcome == "updated":
            old = state[d.entry.id]
            assert old.contributor == p.contributor and not old.protected
            assert d.entry.revision == old.revision + 1
        if d.accepted:
            assert d.entry is not None
            assert not (p.pool == BOT_POOL and "chat_1/i-1" in p.evidence)  # the barrier held
            state[d.entry.id] = d.entry
        for flagged in d.flagged:
            state[flagged.id] = flagged
    # The protected record never changed, whoever proposed what.
    assert msgspec.structs.replace(state["mem_b"], review=False) == start["mem_b"]
