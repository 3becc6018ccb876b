"""The HTTP world: admin and user calls over httpx, an org with one bot owner per shard, bots
and group chats."""

from __future__ import annotations

import secrets
from typing import Any

from actors.runtime.placement import shard_of
from benchmarks.discussion._scripts import SHARDS


class Api:
    """Admin and user calls over httpx (setup and the low-rate scenarios)."""

    def __init__(self, url: str, admin_token: str) -> None:
        import httpx

        self.admin = admin_token
        self.http = httpx.Client(base_url=url, timeout=300)

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token or self.admin}"}
        resp = self.http.request(method, path, json=body, headers=headers)
        if not resp.is_success:
            raise RuntimeError(f"{method} {path}: {resp.status_code} {resp.text[:500]}")
        return resp.json()

    def post(self, path: str, body: Any, token: str | None = None) -> Any:
        return self.call("POST", path, body, token)

    def close(self) -> None:
        self.http.close()


def id_on(prefix: str, shard: int) -> str:
    """A fresh id whose account lands on `shard`."""
    while True:
        candidate = f"{prefix}_{secrets.token_hex(4)}"
        if shard_of(candidate, SHARDS) == shard:
            return candidate


class World:
    def __init__(self, api: Api) -> None:
        self.api = api
        self.org = api.post("/v1/admin/orgs", {"name": "discussion bench"})["id"]
        # One bot owner per shard; the first is also the person who talks to the bots.
        self.owners = [
            api.post(
                "/v1/admin/users",
                {"id": id_on(f"u_s{k}", k), "name": f"owner{k}", "orgs": [self.org]},
            )
            for k in range(SHARDS)
        ]
        self.person = self.owners[0]

    def bot(self, name: str, owner: int, model: str) -> str:
        body = {"name": name, "org": self.org, "owner": self.owners[owner]["id"], "model": model}
        return self.api.post("/v1/admin/bots", body)["id"]

    def group_chat(self, bots: list[str], channel_id: str | None = None) -> str:
        body: dict[str, Any] = {"org": self.org, "people": [self.person["id"]], "bots": bots}
        if channel_id:
            body["id"] = channel_id
        channel = self.api.post("/v1/admin/channels", body)["id"]
        return self.api.post("/v1/chats", {"channel": channel}, self.person["token"])["id"]
