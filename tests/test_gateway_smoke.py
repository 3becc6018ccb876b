from __future__ import annotations


def test_remember_then_read(world):
    with world.client("alice") as alice:
        r = alice.post(
            f"/v1/bots/{world.bot}/memory",
            json={"command": {"_tag": "Remember", "content": "likes tea", "tags": ["drinks"]}},
        )
        assert r.status_code == 201, r.text
        got = alice.get(f"/v1/bots/{world.bot}/memory").json()
        assert [e["content"] for e in got["entries"]] == ["likes tea"]
        assert got["version"] == 1
