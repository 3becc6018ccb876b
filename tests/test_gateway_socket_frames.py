"""Every websocket message is a text frame, so that a browser's `JSON.parse(ev.data)`
gets a string, never a Blob: `hello`, `reset` and events on /v1/events (the /v1/nodes frames
are checked in tests/test_nodes.py). A real websocket client returns `str` for text frames and
`bytes` for binary ones."""

from __future__ import annotations

import asyncio
import json

from websockets.asyncio.client import connect

from engine.events import Position, decode_cursor, encode_cursor


def test_hello_reset_and_event_frames_are_text(world):
    base = world.server.url.replace("http://", "ws://") + "/v1/events"
    headers = {"Authorization": f"Bearer {world.tokens['alice']}"}

    async def first(url: str, **kw):
        ws = await connect(url, **kw)
        raw = await asyncio.wait_for(ws.recv(), 15)
        assert isinstance(raw, str), type(raw)
        return ws, json.loads(raw)

    async def scenario():
        ws, hello = await first(base, additional_headers=headers)
        assert hello["type"] == "hello"
        url = f"/v1/bots/{world.bot}/memory"
        with world.client("alice") as alice:
            body = {"command": {"_tag": "Remember", "content": "framed"}}
            r = await asyncio.to_thread(alice.post, url, json=body)
            assert r.status_code == 201
        raw = await asyncio.wait_for(ws.recv(), 15)
        assert isinstance(raw, str) and json.loads(raw)["type"] == "memory.changed"
        await ws.close()

        foreign = encode_cursor([Position("0000", p.seq) for p in decode_cursor(hello["cursor"])])
        ws, reset = await first(f"{base}?cursor={foreign}", additional_headers=headers)
        assert reset["type"] == "reset"
        await ws.close()

        # A browser: no header, the token as the first message.
        ws = await connect(base)
        await ws.send(json.dumps({"type": "auth", "token": world.tokens["alice"]}))
        raw = await asyncio.wait_for(ws.recv(), 15)
        assert isinstance(raw, str) and json.loads(raw)["type"] == "hello"
        await ws.close()

    asyncio.run(scenario())
