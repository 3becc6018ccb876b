"""An event's frame as the contract spells it (gateway/subscriber.py `event_json`): every event
type byte for byte as `to_wire` would make it, and payloads the shortcut cannot take."""

from __future__ import annotations

import msgspec

from engine.events import Audience, Event


def _wire_frame(event: Event, cursor: str) -> bytes:
    """An event's frame as the contract spells it: the payload through `to_wire` (camelCase
    keys, data maps' keys kept), its tag as the frame's type."""
    from engine.casing import to_wire
    from gateway.subscriber import Frame

    data = to_wire(event.data)
    data.pop("type", None)
    frame = Frame(type=event.data.__struct_config__.tag, cursor=cursor, at=event.at, data=data)
    return msgspec.json.encode(frame)


def test_every_event_type_is_framed_as_the_contract_spells_it():
    """Each payload type's frame, byte for byte, with every field given and with the optional
    ones left null (strings that JSON escapes too)."""
    from engine.events import Payload
    from gateway.subscriber import event_json, event_text

    for kind in Payload.__args__:  # type: ignore[attr-defined]
        fields = msgspec.inspect.type_info(kind).fields
        full = {
            f.name: 7 if isinstance(f.type, msgspec.inspect.IntType) else 'a "b"\u00e9\u2028'
            for f in fields
        }
        bare = {f.name: full[f.name] for f in fields if f.required}
        for given in (full, bare):
            event = Event(seq=3, at=1234, data=kind(**given), audience=Audience(org="o1"))
            assert event_json(event, "c1") == _wire_frame(event, "c1"), kind
            assert event_text(event, "c1") == _wire_frame(event, "c1").decode()


class _Nested(msgspec.Struct, frozen=True, kw_only=True, tag="test.nested"):
    pool: str
    detail: dict


class _Snake(msgspec.Struct, frozen=True, kw_only=True, tag="test.snake"):
    entry_id: str


def test_a_payload_with_nested_values_or_snake_case_names_is_camel_cased():
    """The shortcut (a payload's own JSON as the frame's data) is taken only where it spells
    the same: nested keys and snake_case field names go through `to_wire`."""
    from gateway.subscriber import event_json

    for data in (_Nested(pool="p", detail={"made_by": {"user_id": "u1"}}), _Snake(entry_id="m1")):
        event = Event(seq=1, at=5, data=data, audience=Audience())  # type: ignore[arg-type]
        assert event_json(event, "c") == _wire_frame(event, "c")
    event = Event(seq=1, at=5, data=_Nested(pool="p", detail={"made_by": 1}), audience=Audience())  # type: ignore[arg-type]
    assert msgspec.json.decode(event_json(event, "c"))["data"] == {
        "pool": "p",
        "detail": {"madeBy": 1},
    }
