"""Collaboration chains (WS-4, CO-1): receipts, results, caps, suppression and stop."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import collaboration as co
from engine.collaboration import (
    MAX_DELIVERIES,
    MAX_DEPTH,
    Chain,
    attach_agent_chat,
    find_link,
    fingerprint,
    is_bare_ack,
    new_chain,
    normalize,
    on_result,
    on_send,
    open_links,
    reply_chat,
    stop,
)
from engine.errors import Conflict, InvalidInput, NotFound

ROOT = "b_root"


def chain(now: int = 100) -> Chain:
    return new_chain(
        chain_id="col_1",
        org="o_1",
        owner="u_1",
        root_chat="chat_root",
        topic="turn_1",
        project="p_1",
        root_bot=ROOT,
        now=now,
    )


_ids = itertools.count(1)
KEY = b"k" * 32  # the chain fingerprint key the actor layer passes


def send(c: Chain, to: str, message: str, *, parent=None, frm=ROOT, now=200, link_id=None):
    return on_send(
        c,
        link_id=link_id or f"dl_{next(_ids)}",
        parent=parent,
        from_bot=frm,
        to_bot=to,
        message=message,
        now=now,
        fp_key=KEY,
    )


# --- text --------------------------------------------------------------------------------------


def test_normalize_folds_case_width_and_whitespace():
    assert normalize("  Please\tREVIEW\n the  PR ") == "please review the pr"
    assert normalize("\uff21\uff22\uff23") == "abc"
    assert normalize("re\u200bview") == "review"
    assert normalize("v1.2") != normalize("v12")


def test_fingerprint_is_keyed_and_cannot_be_confirmed_by_plain_sha256():
    import hashlib

    plain = hashlib.sha256(b"hello world").hexdigest()[:32]
    one = fingerprint("Hello  World", KEY)
    assert one == fingerprint(" hello world ", KEY)  # normalized first
    assert len(one) == 32
    # A guess at the text is not confirmed by an unkeyed hash, and another key (another org)
    # gives another fingerprint.
    assert one != plain and one != hashlib.sha256(b"Hello  World").hexdigest()[:32]
    assert one != fingerprint("Hello World", b"j" * 32)
    # A link stored with the unkeyed digest becomes the same keyed fingerprint (no text needed).
    assert co.rekeyed(plain, KEY) == one


@pytest.mark.parametrize(
    "text",
    [
        "ok",
        "OK",
        "okay",
        "thanks",
        "Thank you!",
        "got it.",
        "收到",
        "好的",
        "谢谢",
        "明白",
        "嗯",
        "👍",
        "👍🏻",
        "👍️",
        "ok, thanks!",
        "Okay, thank you 🙂",
        "  ...ok...  ",
        "好的\uff0c谢谢\uff01",
        "好的谢谢",
        "嗯嗯",
        "收到👍",
        "Got it, thanks 🙏",
        "ok ok ok",
        "",
        "🎉🎉",
    ],
)
def test_bare_acknowledgements(text):
    assert is_bare_ack(text)


@pytest.mark.parametrize(
    "text",
    [
        "ok, please check the logs",
        "thanksgiving plan",
        "oks",
        "Thanks, the build is green",
        "收到\uff0c马上处理",
        "好好学习",
        "yes",
        "done",
        "42",
        "ok 2",
        "please review PR #12",
    ],
)
def test_not_acknowledgements(text):
    assert not is_bare_ack(text)


# --- chains and sends --------------------------------------------------------------------------


def test_new_chain_is_running_and_empty():
    c = chain(now=7)
    assert c.status == "running"
    assert c.deliveries == 0 and c.links == () and c.revision == 1
    assert c.created_at == c.updated_at == 7
    assert c.root_bot == ROOT and c.topic == "turn_1" and c.project == "p_1"


def test_send_from_root_is_delivered_at_depth_one():
    c0 = chain()
    c, d = send(c0, "b_peer", "Please summarise the report", link_id="dl_a", now=300)
    assert d.action == "deliver" and d.reason is None
    assert d.link == find_link(c, "dl_a")
    assert d.link.status == "sent" and d.link.depth == 1 and d.link.parent is None
    assert d.link.from_bot == ROOT and d.link.to_bot == "b_peer"
    assert d.link.fingerprint == fingerprint("please summarise the report", KEY)
    assert d.link.sent_at == 300
    assert c.deliveries == 1 and c.status == "running"
    assert c.revision == c0.revision + 1 and c.updated_at == 300
    assert open_links(c) == (d.link,)
    assert reply_chat(c, d.link) == "chat_root"


def test_self_send_is_invalid():
    with pytest.raises(InvalidInput) as e:
        send(chain(), ROOT, "talk to me")
    assert e.value.code == "self_send"


def test_non_string_message_is_invalid():
    with pytest.raises(InvalidInput) as e:
        send(chain(), "b_peer", None)
    assert e.value.code == "invalid_message"


def test_reusing_a_link_id_conflicts():
    c, _ = send(chain(), "b_peer", "one", link_id="dl_x")
    with pytest.raises(Conflict) as e:
        send(c, "b_other", "two", link_id="dl_x")
    assert e.value.code == "duplicate_link"


def test_parent_must_exist_and_belong_to_the_sender():
    c, _ = send(chain(), "b_peer", "do it", link_id="dl_p")
    with pytest.raises(InvalidInput) as e:
        send(c, "b_x", "go", parent="dl_missing", frm="b_peer")
    assert e.value.code == "not_your_link"
    with pytest.raises(InvalidInput) as e:
        send(c, "b_x", "go", parent="dl_p", frm="b_intruder")
    assert e.value.code == "not_your_link"
    # Only the root bot speaks from the root chat, so nobody can reset their depth to 1.
    with pytest.raises(InvalidInput) as e:
        send(c, "b_x", "go", parent=None, frm="b_peer")
    assert e.value.code == "not_your_link"


def test_parent_must_have_been_delivered():
    c, d = send(chain(), "b_peer", "ok")
    assert d.link.status == "suppressed"
    with pytest.raises(InvalidInput) as e:
        send(c, "b_x", "go", parent=d.link.id, frm="b_peer")
    assert e.value.code == "not_your_link"


def test_peer_sends_further_and_the_chain_gets_deeper():
    c, _ = send(chain(), "b_a", "research X", link_id="dl_1")
    c = attach_agent_chat(c, "dl_1", "chat_agent_a")
    c, d2 = send(c, "b_b", "find sources for X", parent="dl_1", frm="b_a", link_id="dl_2")
    assert d2.action == "deliver"
    assert d2.link.depth == 2 and d2.link.parent == "dl_1"
    assert c.deliveries == 2
    # The nested result goes back to where b_a was working, not to the root chat.
    assert reply_chat(c, d2.link) == "chat_agent_a"
    assert {link.id for link in open_links(c)} == {"dl_1", "dl_2"}


def test_bare_ack_send_is_suppressed_and_not_counted():
    c0, _ = send(chain(), "b_peer", "real work")
    c, d = send(c0, "b_peer", "Thanks! 👍", now=400)
    assert d.action == "suppress" and d.reason == "acknowledgement"
    assert d.link.status == "suppressed" and d.link.reason == "acknowledgement"
    assert c.deliveries == c0.deliveries
    assert c.revision == c0.revision + 1 and c.updated_at == 400
    assert find_link(c, d.link.id) == d.link
    assert d.link not in open_links(c)


def test_duplicate_send_is_suppressed():
    c, _ = send(chain(), "b_peer", "Check the deploy")
    c, d = send(c, "b_peer", "  check the   DEPLOY ")
    assert d.action == "suppress" and d.reason == "duplicate"
    assert d.link.status == "suppressed" and c.deliveries == 1


def test_same_text_to_another_bot_or_from_another_bot_is_not_a_duplicate():
    c, _ = send(chain(), "b_a", "check the deploy", link_id="dl_1")
    c, d = send(c, "b_b", "check the deploy")
    assert d.action == "deliver"
    c, d = send(c, "b_b", "check the deploy", parent="dl_1", frm="b_a")
    assert d.action == "deliver"
    assert c.deliveries == 3


def test_duplicate_after_the_first_was_answered_is_still_suppressed():
    c, _ = send(chain(), "b_a", "check the deploy", link_id="dl_1")
    c, _ = send(c, "b_a", "and the logs", link_id="dl_2")
    c, _ = on_result(c, link_id="dl_1", text="deploy is fine", now=300, fp_key=KEY)
    c, d = send(c, "b_a", "Check the deploy")
    assert d.action == "suppress" and d.reason == "duplicate"


def test_send_on_a_stopped_chain_is_refused_and_recorded():
    c, _ = send(chain(), "b_peer", "work")
    c = stop(c, by="u_1", now=500)
    before = c
    c, d = send(c, "b_peer", "more work", now=600)
    assert d.action == "refuse" and d.reason == "chain stopped"
    assert d.link.status == "refused" and d.link.reason == "chain stopped"
    assert c.deliveries == before.deliveries
    assert c.status == "stopped" and c.reason == "stopped by u_1"
    assert c.revision == before.revision + 1 and c.updated_at == 600


def test_send_on_a_done_chain_is_refused():
    c, _ = send(chain(), "b_peer", "work", link_id="dl_1")
    c, _ = on_result(c, link_id="dl_1", text="here it is", now=300, fp_key=KEY)
    assert c.status == "done"
    c, d = send(c, "b_peer", "more")
    assert d.action == "refuse" and d.reason == "chain done"
    assert c.status == "done"


def test_send_on_a_capped_chain_is_refused():
    c = chain()
    for i in range(MAX_DELIVERIES):
        c, _ = send(c, f"b_{i}", f"task {i}")
    c, d = send(c, "b_x", "one too many")
    assert c.status == "capped"
    c, d = send(c, "b_y", "after the cap")
    assert d.action == "refuse" and d.reason == "chain capped"


# --- caps --------------------------------------------------------------------------------------


def test_two_bots_delegating_to_each_other_stop_at_depth_eight():
    c, d = send(chain(), "b_b", "step 1")
    bots = itertools.cycle(["b_a", "b_b"])
    holder = "b_b"
    for step in range(2, MAX_DEPTH + 1):
        nxt = next(bots)
        c, d = send(c, nxt, f"step {step}", parent=d.link.id, frm=holder)
        assert d.action == "deliver" and d.link.depth == step
        holder = nxt
    c, d = send(c, "b_a" if holder == "b_b" else "b_b", "step 9", parent=d.link.id, frm=holder)
    assert d.action == "refuse" and d.reason == "depth limit of 8 reached"
    assert d.link.status == "refused" and d.link.depth == MAX_DEPTH + 1
    assert c.status == "capped" and c.reason == "depth limit of 8 reached"
    assert c.deliveries == MAX_DEPTH
    # The peers still at work keep their links open; their results come home without waking anyone.
    assert len(open_links(c)) == MAX_DEPTH


def test_ping_pong_with_the_same_words_is_caught_as_duplicate_before_the_cap():
    c, d = send(chain(), "b_b", "can you help?")
    c, d = send(c, ROOT, "can you help?", parent=d.link.id, frm="b_b")
    assert d.action == "deliver"
    c, d = send(c, "b_b", "can you help?", parent=d.link.id, frm=ROOT)
    assert d.action == "suppress" and d.reason == "duplicate"
    assert c.status == "running"


def test_ack_at_the_depth_limit_is_suppressed_not_capped():
    c, d = send(chain(), "b_1", "level 1")
    for level in range(2, MAX_DEPTH + 1):
        c, d = send(c, f"b_{level}", f"level {level}", parent=d.link.id, frm=f"b_{level - 1}")
    c, d2 = send(c, "b_x", "thanks!", parent=d.link.id, frm=f"b_{MAX_DEPTH}")
    assert d2.action == "suppress" and c.status == "running"


def test_broad_fan_out_stops_at_32_deliveries():
    c = chain()
    for i in range(MAX_DELIVERIES):
        c, d = send(c, f"b_{i}", f"part {i}")
        assert d.action == "deliver"
    assert c.deliveries == MAX_DELIVERIES and c.status == "running"
    c, d = send(c, "b_last", "part 32")
    assert d.action == "refuse" and d.reason == "32 deliveries reached"
    assert d.link.status == "refused"
    assert c.status == "capped" and c.reason == "32 deliveries reached"
    assert c.deliveries == MAX_DELIVERIES


def test_results_count_as_deliveries_and_can_hit_the_cap():
    c = chain()
    half = MAX_DELIVERIES // 2
    for i in range(half):
        c, _ = send(c, f"b_{i}", f"part {i}", link_id=f"dl_{i}")
    for i in range(half - 1):
        c, d = on_result(c, link_id=f"dl_{i}", text=f"answer {i}", now=300, fp_key=KEY)
        assert d.action == "deliver"
    assert c.deliveries == MAX_DELIVERIES - 1
    c, _ = send(c, "b_x", "one more", link_id="dl_x")
    assert c.deliveries == MAX_DELIVERIES
    c, d = on_result(c, link_id=f"dl_{half - 1}", text="last answer", now=400, fp_key=KEY)
    assert d.action == "late" and d.reason == "32 deliveries reached"
    assert d.link.status == "answered" and d.link.reason == "32 deliveries reached"
    assert c.status == "capped" and c.deliveries == MAX_DELIVERIES


# --- results -----------------------------------------------------------------------------------


def test_result_is_delivered_and_counted():
    c, _ = send(chain(), "b_a", "task a", link_id="dl_a")
    c, _ = send(c, "b_b", "task b", link_id="dl_b")
    before = c
    c, d = on_result(c, link_id="dl_a", text="Result A", now=700, fp_key=KEY)
    assert d.action == "deliver" and d.reason is None
    assert d.link.status == "answered" and d.link.answered_at == 700
    assert d.link.result_fingerprint == fingerprint("result a", KEY)
    assert c.deliveries == before.deliveries + 1
    assert c.status == "running"  # dl_b is still open
    assert c.revision == before.revision + 1 and c.updated_at == 700
    assert [link.id for link in open_links(c)] == ["dl_b"]


def test_chain_is_done_when_every_link_is_answered():
    c, _ = send(chain(), "b_a", "task a", link_id="dl_a")
    c, _ = send(c, "b_b", "task b", link_id="dl_b")
    c, _ = send(c, "b_b", "ok")  # suppressed: nothing to wait for
    c, _ = on_result(c, link_id="dl_a", text="A", now=300, fp_key=KEY)
    c, d = on_result(c, link_id="dl_b", text="thanks", now=301, fp_key=KEY)
    assert d.action == "suppress"
    assert c.status == "done" and open_links(c) == ()


def test_nested_results_finish_the_chain_only_at_the_top():
    c, _ = send(chain(), "b_a", "research", link_id="dl_1")
    c, _ = send(c, "b_b", "sources please", parent="dl_1", frm="b_a", link_id="dl_2")
    c, d = on_result(c, link_id="dl_2", text="three sources", now=300, fp_key=KEY)
    assert d.action == "deliver" and d.link.to_bot == "b_b" and d.link.from_bot == "b_a"
    assert c.status == "running"
    c, d = on_result(c, link_id="dl_1", text="the research", now=301, fp_key=KEY)
    assert d.action == "deliver" and c.status == "done"
    assert c.deliveries == 4


def test_second_result_for_a_link_is_idempotent():
    c, _ = send(chain(), "b_a", "task", link_id="dl_a")
    c, _ = send(c, "b_b", "task b", link_id="dl_b")
    c, first = on_result(c, link_id="dl_a", text="answer", now=300, fp_key=KEY)
    again, d = on_result(c, link_id="dl_a", text="another answer", now=400, fp_key=KEY)
    assert d.action == "suppress" and d.reason == "already answered"
    assert again is c and d.link == first.link


def test_bare_ack_result_is_suppressed_but_answers_the_link():
    c, _ = send(chain(), "b_a", "task", link_id="dl_a")
    c, _ = send(c, "b_b", "task b", link_id="dl_b")
    before = c
    c, d = on_result(c, link_id="dl_a", text="好的\uff0c收到\uff01", now=300, fp_key=KEY)
    assert d.action == "suppress" and d.reason == "acknowledgement"
    assert d.link.status == "answered" and d.link.reason == "acknowledgement"
    assert c.deliveries == before.deliveries and c.revision == before.revision + 1


def test_result_for_an_unknown_link_is_not_found():
    with pytest.raises(NotFound) as e:
        on_result(chain(), link_id="dl_nope", text="x", now=1, fp_key=KEY)
    assert e.value.code == "link_not_found"


def test_result_for_a_suppressed_or_refused_link_conflicts():
    c, d = send(chain(), "b_a", "ok")
    with pytest.raises(Conflict) as e:
        on_result(c, link_id=d.link.id, text="x", now=1, fp_key=KEY)
    assert e.value.code == "link_not_sent"
    c = stop(c, by="u_1", now=2)
    c, d = send(c, "b_a", "more")
    with pytest.raises(Conflict):
        on_result(c, link_id=d.link.id, text="x", now=3, fp_key=KEY)


def test_late_result_after_stop_is_recorded_and_wakes_nobody():
    c, _ = send(chain(), "b_a", "task", link_id="dl_a")
    c = stop(c, by="u_1", now=300)
    before = c
    c, d = on_result(c, link_id="dl_a", text="here you go", now=400, fp_key=KEY)
    assert d.action == "late" and d.reason == "chain stopped"
    assert d.link.status == "answered" and d.link.answered_at == 400
    assert d.link.result_fingerprint == fingerprint("here you go", KEY)
    assert c.status == "stopped" and c.deliveries == before.deliveries
    assert c.revision == before.revision + 1


def test_result_on_a_capped_chain_is_late():
    c, d = send(chain(), "b_1", "level 1", link_id="dl_top")
    for level in range(2, MAX_DEPTH + 2):
        c, d = send(c, f"b_{level}", f"level {level}", parent=d.link.id, frm=f"b_{level - 1}")
    assert c.status == "capped"
    c, d = on_result(c, link_id="dl_top", text="partial answer", now=900, fp_key=KEY)
    assert d.action == "late" and d.reason == "chain capped"
    assert c.status == "capped" and c.reason == "depth limit of 8 reached"


# --- stop, agent chats, lookups ----------------------------------------------------------------


def test_stop_ends_a_running_chain_once():
    c, _ = send(chain(), "b_a", "task")
    s = stop(c, by="u_9", now=500)
    assert s.status == "stopped" and s.reason == "stopped by u_9"
    assert s.revision == c.revision + 1 and s.updated_at == 500
    assert open_links(s) == open_links(c)  # the caller may cancel these
    assert stop(s, by="u_1", now=600) is s


def test_stop_leaves_a_finished_chain_alone():
    c, _ = send(chain(), "b_a", "task", link_id="dl_a")
    c, _ = on_result(c, link_id="dl_a", text="answer", now=300, fp_key=KEY)
    assert stop(c, by="u_1", now=400) is c


def test_attach_agent_chat():
    c0, _ = send(chain(), "b_a", "task", link_id="dl_a")
    c = attach_agent_chat(c0, "dl_a", "chat_agent_1")
    assert find_link(c, "dl_a").agent_chat == "chat_agent_1"
    assert c.revision == c0.revision + 1 and c.updated_at == c0.updated_at
    assert attach_agent_chat(c, "dl_a", "chat_agent_1") is c
    c2 = attach_agent_chat(c0, "dl_a", "chat_agent_1", now=999)
    assert c2.updated_at == 999
    with pytest.raises(Conflict) as e:
        attach_agent_chat(c, "dl_a", "chat_agent_2")
    assert e.value.code == "agent_chat_attached"
    with pytest.raises(NotFound):
        attach_agent_chat(c, "dl_missing", "chat_agent_1")
    with pytest.raises(InvalidInput):
        attach_agent_chat(c, "dl_a", "")


def test_attach_agent_chat_to_an_undelivered_link_conflicts():
    c, d = send(chain(), "b_a", "ok")
    with pytest.raises(Conflict):
        attach_agent_chat(c, d.link.id, "chat_agent_1")


def test_find_link_unknown():
    with pytest.raises(NotFound) as e:
        find_link(chain(), "dl_x")
    assert e.value.code == "link_not_found"


def test_chain_round_trips_through_msgspec():
    c, _ = send(chain(), "b_a", "task", link_id="dl_a")
    c = attach_agent_chat(c, "dl_a", "chat_agent")
    c, _ = on_result(c, link_id="dl_a", text="done it", now=300, fp_key=KEY)
    back = msgspec.json.decode(msgspec.json.encode(c), type=Chain)
    assert back == c
    assert msgspec.json.decode(msgspec.json.encode(c))["status"] == "done"


# --- properties --------------------------------------------------------------------------------

BOTS = (ROOT, "b_a", "b_b", "b_c")
MESSAGES = ("do X", "do Y", "ok", "thanks!", "好的", "do X ", "report back", "")


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_caps_hold_and_stop_is_final_whatever_happens(data):
    c = chain(now=0)
    delivered_sends = delivered_results = 0
    stopped = False
    n = data.draw(st.integers(min_value=1, max_value=120))
    for step in range(n):
        now = step + 1
        # Stops are rare so that most runs get far enough to meet the caps.
        kind = data.draw(st.sampled_from(("send",) * 6 + ("result",) * 3 + ("stop",)))
        before = c
        if kind == "send":
            holders = [link for link in c.links if link.status in ("sent", "answered")]
            parent = data.draw(st.sampled_from([None, *holders]))
            frm = ROOT if parent is None else parent.to_bot
            to = data.draw(st.sampled_from([b for b in BOTS if b != frm]))
            msg = data.draw(st.sampled_from(MESSAGES)) + data.draw(
                st.sampled_from(("", " again", " later"))
            )
            c, d = on_send(
                c,
                link_id=f"dl_{step}",
                parent=None if parent is None else parent.id,
                from_bot=frm,
                to_bot=to,
                message=msg,
                now=now,
                fp_key=KEY,
            )
            assert d.action in ("deliver", "suppress", "refuse")
            assert d.link == find_link(c, f"dl_{step}")
            delivered_sends += d.action == "deliver"
        elif kind == "result":
            candidates = [link for link in c.links if link.status in ("sent", "answered")]
            if not candidates:
                continue
            link = data.draw(st.sampled_from(candidates))
            c, d = on_result(
                c, link_id=link.id, text=data.draw(st.sampled_from(MESSAGES)), now=now, fp_key=KEY
            )
            assert d.action in ("deliver", "suppress", "late")
            assert find_link(c, link.id).status == "answered"
            delivered_results += d.action == "deliver"
        else:
            c = stop(c, by="u_1", now=now)
            stopped = True
            assert c.status != "running"
            d = None

        if stopped:
            assert d is None or d.action != "deliver"
            assert c.status in ("stopped", "done", "capped")
        if before.status != "running":
            assert c.status == before.status and c.reason == before.reason
            assert c.deliveries == before.deliveries
        assert c.deliveries <= MAX_DELIVERIES
        assert c.deliveries == delivered_sends + delivered_results
        assert all(
            link.depth <= MAX_DEPTH for link in c.links if link.status in ("sent", "answered")
        )
        assert c.revision >= before.revision
        if c is not before:
            assert c.revision == before.revision + 1
        if c.status == "done":
            assert open_links(c) == ()
        if c.status in ("stopped", "capped"):
            assert c.reason


def test_module_exports_the_caps():
    assert co.MAX_DEPTH == 8 and co.MAX_DELIVERIES == 32
