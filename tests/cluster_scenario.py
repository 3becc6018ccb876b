"""The node-failure scenario of tests/test_cluster.py, in a process of its own (Ray allows one
session per process, and the test session already runs its local one):

    python -m tests.cluster_scenario

A 2-node `ray.cluster_utils` cluster on loopback; the engine with 2 shards placed `spread` (one
per node); one gateway (uvicorn via LiveServer, in this process, on the head node); two accounts,
one on each shard, each owning a bot. Writers Remember through HTTP on both bots while each
account's event client (EventClient, reconnecting by itself) listens. Then the worker node, which
holds one of the shards, is removed (its processes killed, like a crash) and a node is added back;
the writers go on until the lost shard has answered again. Checks:

- both shards were on different nodes and both accounts were served by the one gateway;
- every acknowledged write (201) is in the bot's memory afterwards (no acknowledged write lost);
- each live client, a client resumed from the cursor it held just before the kill and a client
  resumed from the first cursor all see every entry's event exactly once, and none for entries
  that are not there.

Prints one JSON object (the figures and the failed checks) on its last line; exits 0 when every
check holds.
"""

from __future__ import annotations

import os

# Before Ray is imported: a loopback-only cluster with token auth (actors/runtime/ray_env.py).
for _name in ("RAY_ADDRESS", "OPENBOT_RAY_ADDRESS"):
    os.environ.pop(_name, None)

import asyncio  # noqa: E402
import concurrent.futures  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import queue  # noqa: E402
import secrets  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from pathlib import Path  # noqa: E402

import actors.runtime.engine  # noqa: E402, F401  (sets Ray's environment before anything imports ray)
from actors.runtime.placement import shard_of  # noqa: E402
from gateway.client import EventClient, EventFrame  # noqa: E402
from gateway.live_server import LiveServer  # noqa: E402

ADMIN = "cluster-admin-" + secrets.token_hex(8)
SHARDS = 2


class MainThread:
    """Runs calls on the main thread for the scenario's thread: adding a node to a
    cluster_utils cluster installs signal handlers, which only the main thread may do."""

    def __init__(self) -> None:
        self.calls: queue.Queue = queue.Queue()

    async def run(self, fn, *args, **kwargs):
        done: concurrent.futures.Future = concurrent.futures.Future()
        self.calls.put((fn, args, kwargs, done))
        return await asyncio.wrap_future(done)

    def serve_until(self, thread: threading.Thread) -> None:
        while thread.is_alive():
            try:
                fn, args, kwargs, done = self.calls.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                done.set_result(fn(*args, **kwargs))
            except BaseException as e:
                done.set_exception(e)


class Listener:
    """An EventClient consumed by a task: the frames it yielded, in order."""

    def __init__(self, url: str, token: str, cursor: str | None) -> None:
        self.client = EventClient(url, token, cursor=cursor, max_backoff=0.5)
        self.frames: list[EventFrame] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for frame in self.client:
            self.frames.append(frame)

    def entries(self) -> list[str]:
        return [f.data["entry"] for f in self.frames if f.type == "memory.changed" and f.data]

    async def until(self, wanted: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not wanted <= set(self.entries()) and time.monotonic() < deadline:
            if self.task.done():
                self.task.result()  # raises what ended it
                return
            await asyncio.sleep(0.05)  # frames arrive from another task: poll the list

    async def close(self) -> None:
        await self.client.close()
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


class Writer:
    """Remember, one after the other, on one bot; notes what was acknowledged."""

    def __init__(self, http, bot: str, token: str, name: str) -> None:
        self.http = http
        self.bot = bot
        self.headers = {"Authorization": f"Bearer {token}"}
        self.name = name
        self.acked: list[tuple[float, str]] = []  # (time, entry id)
        self.failed: list[tuple[float, str]] = []  # (time, what)
        self.stop = False
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        import httpx

        i = 0
        while not self.stop:
            i += 1
            body = {"command": {"_tag": "Remember", "content": f"{self.name} note {i}"}}
            try:
                r = await self.http.post(
                    f"/v1/bots/{self.bot}/memory", json=body, headers=self.headers, timeout=30
                )
            except httpx.HTTPError as e:
                self.failed.append((time.monotonic(), type(e).__name__))
                await asyncio.sleep(0.1)
                continue
            if r.status_code == 201:
                self.acked.append((time.monotonic(), r.json()["id"]))
            else:
                self.failed.append((time.monotonic(), f"{r.status_code} {r.text[:120]}"))
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.02)

    def acked_after(self, t: float) -> int:
        return sum(1 for at, _ in self.acked if at > t)


async def first_cursor(url: str, token: str) -> str:
    from websockets.asyncio.client import connect

    async with connect(
        url.replace("http", "ws", 1) + "/v1/events",
        additional_headers={"Authorization": f"Bearer {token}"},
    ) as ws:
        return json.loads(await ws.recv())["cursor"]


async def restarted_at(engine, shard: int, deadline: float) -> float:
    """When the shard first answered as a restarted actor (or the deadline, if it never did)."""
    from engine.errors import Unavailable

    while time.monotonic() < deadline:
        try:
            where = await asyncio.to_thread(engine.where, 5)
            if where["shards"][shard]["restarted"]:
                return time.monotonic()
        except Unavailable:
            pass
        await asyncio.sleep(0.1)  # Ray restarts the actor on its own schedule: poll it
    return deadline


def setup_accounts(admin) -> list[dict]:
    """An org and one account per shard (users are made until each shard has one), each with a
    bot it owns (a bot's memory lives on its owner's shard)."""
    org = admin.post("/v1/admin/orgs", json={"name": "cluster org"}).json()["id"]
    by_shard: dict[int, dict] = {}
    for _ in range(64):
        user = admin.post("/v1/admin/users", json={"name": "person", "orgs": [org]}).json()
        by_shard.setdefault(shard_of(user["id"], SHARDS), user)
        if len(by_shard) == SHARDS:
            break
    accounts = []
    for k in sorted(by_shard):
        user = by_shard[k]
        bot = admin.post(
            "/v1/admin/bots", json={"name": f"bot {k}", "org": org, "owner": user["id"]}
        ).json()["id"]
        accounts.append({"shard": k, "user": user["id"], "token": user["token"], "bot": bot})
    return accounts


async def scenario(
    cluster, engine, url: str, main: MainThread, out: dict, checks: list[str]
) -> None:
    import httpx

    def check(ok: bool, what: str) -> None:
        if not ok:
            checks.append(what)

    where = engine.where()
    head = cluster.head_node.node_id
    nodes = [s["node"] for s in where["shards"]]
    out["placement"] = {"mode": where["placement"], "shards_on_head": [n == head for n in nodes]}
    check(len(set(nodes)) == SHARDS, f"shards not spread over the nodes: {nodes}")
    victim = next((s["shard"] for s in where["shards"] if s["node"] != head), None)
    check(victim is not None, "no shard on the worker node")
    if victim is None:
        return
    worker = next(n for n in cluster.worker_nodes if n.node_id == nodes[victim])

    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"})
        accounts = await asyncio.to_thread(setup_accounts, admin)
        admin.close()
        check(len(accounts) == SHARDS, "could not make an account on each shard")
        cursors0 = [await first_cursor(url, a["token"]) for a in accounts]
        live = [Listener(url, a["token"], c) for a, c in zip(accounts, cursors0, strict=True)]
        writers = [Writer(http, a["bot"], a["token"], f"acct{a['shard']}") for a in accounts]
        hit = writers[victim]

        t_start = time.monotonic()
        while min(len(w.acked) for w in writers) < 15 and time.monotonic() - t_start < 20:
            await asyncio.sleep(0.05)  # writers run as tasks: poll their counts
        check(all(len(w.acked) >= 15 for w in writers), "writers did not get going")
        # What the victim's live client holds just before the crash: resumed from later.
        held = len(live[victim].frames)
        cursor_mid = live[victim].frames[-1].cursor if held else cursors0[victim]

        t_kill = time.monotonic()
        await main.run(cluster.remove_node, worker, False)  # no graceful shutdown
        killed_s = time.monotonic() - t_kill
        await live[victim].client.drop()  # and the victim's listener loses its connection
        await asyncio.sleep(1.0)
        await main.run(cluster.add_node, num_cpus=1, object_store_memory=80 << 20)
        back_s = time.monotonic() - t_kill
        # Back means restarted and answering: a dying process may still answer right after
        # the kill, so acknowledgements are counted from the restarted shard's first answer.
        t_up = await restarted_at(engine, victim, deadline=t_kill + 45)
        while hit.acked_after(t_up) < 15 and time.monotonic() - t_kill < 45:
            await asyncio.sleep(0.05)
        # Back: the first acknowledged write after the last refused one (writes the dying
        # process still answered right after the kill do not count).
        last_refused = max((at for at, _ in hit.failed if at > t_kill), default=t_kill)
        first_after = next((at for at, _ in hit.acked if at > last_refused), None)
        await asyncio.sleep(0.5)
        for w in writers:
            w.stop = True
        await asyncio.gather(*(w.task for w in writers))
        check(hit.acked_after(t_up) >= 15, "the lost shard did not come back within 45 s")

        after = engine.where()
        out["failover"] = {
            "remove_node_s": round(killed_s, 2),
            "node_added_back_at_s": round(back_s, 2),
            "recovered_after_s": round(first_after - t_kill, 2) if first_after else None,
            "victim_shard": victim,
            "victim_restarted": after["shards"][victim]["restarted"],
            "victim_now_on": (
                "head" if after["shards"][victim]["node"] == head else "the added node"
            ),
            "failed_writes_during_outage": len(hit.failed),
            "failed_writes_other_shard": len(writers[1 - victim].failed),
            "failures": sorted(
                {
                    f"{w.name}@{at - t_kill:+.1f}s {what[:90]}"
                    for w in writers
                    for at, what in w.failed
                }
            )[:12],
        }

        # No acknowledged write lost: every 201 is in the bot's memory.
        final: list[set[str]] = []
        for a, w in zip(accounts, writers, strict=True):
            r = await http.get(
                f"/v1/bots/{a['bot']}/memory", headers={"Authorization": f"Bearer {a['token']}"}
            )
            ids = {e["id"] for e in r.json()["entries"]}
            final.append(ids)
            acked = {i for _, i in w.acked}
            check(acked <= ids, f"shard {a['shard']}: acknowledged writes lost: {acked - ids}")
        out["writes"] = [
            {
                "shard": a["shard"],
                "acked": len(w.acked),
                "stored": len(ids),
                "failed": len(w.failed),
            }
            for a, w, ids in zip(accounts, writers, final, strict=True)
        ]

        # Every event once: the live clients, and clients resumed after the recovery.
        before_kill = set(live[victim].entries()[:held])
        resumed = [Listener(url, a["token"], c) for a, c in zip(accounts, cursors0, strict=True)]
        resumed_mid = Listener(url, accounts[victim]["token"], cursor_mid)
        wants = [("resumed_mid", resumed_mid, final[victim] - before_kill)]
        for a, lst, again, ids in zip(accounts, live, resumed, final, strict=True):
            wants += [(f"live[{a['shard']}]", lst, ids), (f"resumed[{a['shard']}]", again, ids)]
        await asyncio.gather(*(lst.until(ids, 20) for _, lst, ids in wants))
        await asyncio.sleep(0.5)  # anything extra would arrive now
        out["events"] = {}
        for name, lst, ids in wants:
            got = lst.entries()
            dupes = len(got) - len(set(got))
            missing = len(ids - set(got))
            extra = len(set(got) - ids)
            out["events"][name] = {"seen": len(got), "dup": dupes, "missing": missing}
            check(dupes == 0, f"{name}: {dupes} duplicated events")
            check(missing == 0, f"{name}: {missing} events missing")
            check(extra == 0, f"{name}: {extra} events for entries that are not stored")
        out["events"]["victim_reconnects"] = live[victim].client.reconnects
        for lst in [*live, *resumed, resumed_mid]:
            await lst.close()


def main() -> int:
    import ray

    from actors.runtime.engine import Engine, start_local_cluster, start_ray, wait_for_cluster
    from gateway.app import create_app

    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="obk", dir="/tmp")  # short: Ray's socket paths
    out: dict = {}
    checks: list[str] = []
    cluster = engine = server = None
    try:
        cluster = start_local_cluster(2, tmp_dir=tmp)
        start_ray(cluster.address)
        wait_for_cluster(2)
        out["cluster_up_s"] = round(time.monotonic() - t0, 1)
        engine = Engine.start(Path(tmp) / "data", shards=SHARDS, prefix="clu")
        server = LiveServer(create_app(engine, ADMIN, cache_ttl=0.0, listener_refresh=0.5))
        out["engine_up_s"] = round(time.monotonic() - t0, 1)
        main_thread = MainThread()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(scenario(cluster, engine, server.url, main_thread, out, checks))
            except BaseException as e:
                failure.append(e)

        thread = threading.Thread(target=run, name="scenario")
        thread.start()
        main_thread.serve_until(thread)
        thread.join()
        if failure:
            raise failure[0]
    except Exception as e:
        where = traceback.extract_tb(e.__traceback__)[-4:]
        at = " <- ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(where))
        checks.append(f"scenario failed: {type(e).__name__}: {e} (at {at})")
    finally:
        if server is not None:
            server.stop()
        if engine is not None:
            try:
                engine.stop()
            except Exception as e:
                checks.append(f"stop failed: {type(e).__name__}: {e}")
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    out["total_s"] = round(time.monotonic() - t0, 1)
    out["failed_checks"] = checks
    print(json.dumps(out), flush=True)
    return 1 if checks else 0


if __name__ == "__main__":
    sys.exit(main())
