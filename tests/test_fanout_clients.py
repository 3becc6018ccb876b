"""The fan-out benchmark's client side: the fixed-rate frame source and its two frame shapes
(benchmarks/fanout_clients.py), and the raw client subscribed to OpenBot's own stream
(benchmarks/_fanout_load.py, `--openbot-client raw`)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from benchmarks._fanout_load import WebsocketsClient
from benchmarks.fanout_clients import SHAPES, frames_of, main
from gateway.client import EventFrame

_dec = msgspec.json.Decoder(EventFrame)


def _payload(frame: bytes) -> bytes:
    assert frame[0] == 0x81  # one unfragmented text frame, as both servers send
    n = frame[1]
    if n == 126:
        assert int.from_bytes(frame[2:4], "big") == len(frame) - 4
        return frame[4:]
    assert n == len(frame) - 2
    return frame[2:]


def test_both_shapes_are_alike_text_frames_that_event_client_decodes():
    sizes = {}
    for shape in SHAPES:
        hello, frames, ids = frames_of(shape, 3)
        assert _dec.decode(_payload(hello)).type == "hello"
        decoded = [_dec.decode(_payload(f)) for f in frames]
        assert [f.type for f in decoded] == ["memory.changed"] * 3
        assert [f.data["entry"] for f in decoded] == ids
        assert len({f.cursor for f in decoded}) == 3
        sizes[shape] = len(frames[0])
    # The comparison is of clients only if the frames they parse are the same size.
    assert abs(sizes["openbot"] - sizes["reference"]) <= 0.1 * sizes["reference"]


@pytest.mark.subprocess  # the source and each client process
def test_every_client_kind_gets_every_frame_of_the_source(capsys):
    assert main(["--clients", "20", "--group", "10", "--frames", "5", "--repeat", "1"]) == 0
    runs = [line for line in capsys.readouterr().out.splitlines() if "frames (" in line]
    assert len(runs) == 4  # two client kinds x two shapes
    assert all(" 100 frames (" in line and ", 0 missing)" in line for line in runs), runs


def test_the_raw_client_follows_openbots_stream_by_token(world):
    class Signalled(WebsocketsClient):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.arrived = asyncio.Event()

        def got(self, entry: str, t: int, at: int) -> None:
            super().got(entry, t, at)
            self.arrived.set()

    async def scenario():
        client = Signalled(0, 0, world.server.url, world.tokens["alice"])
        await asyncio.wait_for(client.start(), 10)  # the gateway's hello: subscribed
        with world.client("alice") as alice:
            r = await asyncio.to_thread(
                alice.post,
                f"/v1/bots/{world.bot}/memory",
                json={"command": {"_tag": "Remember", "content": "raw client"}},
            )
        assert r.status_code == 201, r.text
        await asyncio.wait_for(client.arrived.wait(), 10)
        await client.close()
        return r.json()["id"], client

    entry, client = asyncio.run(scenario())
    assert [e for e, _, _ in client.received] == [entry]
    assert client.connects == 1 and client.errors == []
