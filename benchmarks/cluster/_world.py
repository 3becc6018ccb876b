"""The benchmark's world, made through the admin API: accounts with a bot each, and group chats."""

from __future__ import annotations

import secrets

GROUP_BOTS = 3


def _ok(resp) -> dict:
    if not resp.is_success:
        raise RuntimeError(
            f"{resp.request.method} {resp.request.url}: {resp.status_code} {resp.text}"
        )
    return resp.json()


def setup_world(url: str, admin_token: str, accounts: int, groups: int, shards: int) -> dict:
    """An org, `accounts` people each owning a bot (model "talk"), and `groups` group chats of
    3 bots of different accounts (the person of the group is the first bot's owner)."""
    import httpx

    from actors.runtime.placement import shard_of

    tag = secrets.token_hex(3)
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=60
    ) as admin:
        org = _ok(admin.post("/v1/admin/orgs", json={"name": f"cluster bench {tag}"}))["id"]
        people = []
        for i in range(accounts):
            user = _ok(admin.post("/v1/admin/users", json={"name": f"p{i}", "orgs": [org]}))
            bot = _ok(
                admin.post(
                    "/v1/admin/bots",
                    json={"name": f"B{i}{tag}", "org": org, "owner": user["id"], "model": "talk"},
                )
            )["id"]
            people.append(
                {
                    "user": user["id"],
                    "token": user["token"],
                    "bot": bot,
                    "shard": shard_of(user["id"], shards),
                }
            )
        chats = []
        for g in range(groups):
            members = [people[(g + j) % accounts] for j in range(GROUP_BOTS)]
            channel = _ok(
                admin.post(
                    "/v1/admin/channels",
                    json={
                        "org": org,
                        "people": [members[0]["user"]],
                        "bots": [m["bot"] for m in members],
                    },
                )
            )["id"]
            token = members[0]["token"]
            chat = _ok(
                admin.post(
                    "/v1/chats",
                    json={"channel": channel},
                    headers={"Authorization": f"Bearer {token}"},
                )
            )["id"]
            chats.append({"chat": chat, "token": token})
    return {"org": org, "accounts": people, "groups": chats}
