"""State that must not grow with history, measured in this process (no Ray, no HTTP).

    .venv/bin/python -m benchmarks.bounded_state [--quick] [--rounds N] [--only chains|access]

Chains: a shard's file holds `--ended` (10,000) ended collaboration chains, or 10; each round opens
the shard again in a fresh Python process and reports the time until its start recovery ran (the
chains a restart must read) and the process's RSS after it, side by side, medians over `--rounds`;
beside them the same start followed by reading, unsealing and keeping every chain (what a start that
loads them all pays). The chains are written through the shard's own chain records (rows and sealed
texts as a real chain stores them), in a few large transactions.

Access: a directory with `--bots` (50,000) bots of `--people` people, and a caching gateway's auth
(gateway/auth.py) over it, warmed by every person's token and a bot of each; then a member is
created (a bot making a bot) and `--requests` (1,000) requests are authenticated, each with its bot
looked up. Reports the directory calls those requests made (bounded: the new member's owner and the
new bot), the same after a change that names nothing (every gateway drops its whole cache), the
calls for that many requests with one unknown token (misses are remembered), and the directory's
time per authentication with its index beside a scan of every bot and channel.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ORG = "o_bench"


# --- chains -------------------------------------------------------------------------------------


async def _write_chains(path: Path, count: int) -> None:
    from actors.directory import DirectoryService
    from actors.shard.batch import Batch
    from actors.shard.service import ShardService
    from engine import collaboration as rules
    from engine.directory import Bot, Chat, Org
    from storage.crypto import chain_fp_key

    directory = DirectoryService(path)
    svc = ShardService(path, 0, models={})
    svc.peers.connect(directory=directory)
    try:
        org = Org(id=ORG, name="bench")
        asker = Bot(id="b_asker", name="Asker", org=org.id, owner="u_ann")
        chat = Chat(id="chat_bench", kind="direct", owner="u_ann", org=org.id, bot=asker.id)
        records = svc.chains.records
        await records.start()
        fp_key = chain_fp_key(svc.kernel.master, org.id)
        done = 0
        while done < count:
            batch = Batch()
            for i in range(done, min(count, done + 500)):
                chain = records.begin(chat, f"turn_{i:06d}", asker.id)
                link = f"dlv_{i:06d}"
                now = svc.kernel.clock()
                chain, _ = rules.on_send(
                    chain,
                    link_id=link,
                    parent=None,
                    from_bot=asker.id,
                    to_bot="b_peer",
                    message=f"please look at item {i}",
                    now=now,
                    fp_key=fp_key,
                )
                chain, _ = rules.on_result(
                    chain, link_id=link, text=f"answer {i}", now=now, fp_key=fp_key
                )
                records.texts[chain.id] = {
                    link: {"request": f"please look at item {i}", "result": f"answer {i}"}
                }
                await records.stage(chain, batch, announce=False)  # (chain rows only)
            await svc.kernel.commit(batch)
            done = min(count, done + 500)
    finally:
        await svc.close()
        directory.store.db.close()


def _restart_child(path: str, every: bool) -> None:
    """In a fresh process: open the shard, run its start recovery (with `every`, then read
    every chain row, decoded and unsealed, and keep them: what a start that loads every chain
    costs); print time and RSS."""

    async def main() -> dict:
        from actors.chats import chain_rows
        from actors.directory import DirectoryService
        from actors.shard.service import ShardService

        directory = DirectoryService(path)
        began = time.perf_counter()
        svc = ShardService(path, 0, models={})
        svc.peers.connect(directory=directory)
        await svc.kernel.started()
        kept = []
        if every:
            records = svc.chains.records
            rows = await svc.kernel.db.run(
                lambda con: con.execute("SELECT doc, texts FROM chains").fetchall()
            )
            for doc, sealed in rows:
                row = chain_rows._decode(doc, sealed)
                kept.append((row.chain, await records._texts_of(row)))
        elapsed = time.perf_counter() - began
        stats = await svc.stats()
        stats["chains_in_memory"] += len(kept)
        await svc.close()
        directory.store.db.close()
        return {"restart_s": elapsed, "chains_in_memory": stats["chains_in_memory"]}

    out = asyncio.run(main())
    out["rss_mib"] = _rss_mib()
    print(json.dumps(out))


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def chains(ended: int, rounds: int) -> dict:
    results = {}
    with tempfile.TemporaryDirectory(prefix="obbs") as tmp:
        for count in (10, ended):
            path = Path(tmp) / f"c{count}"
            path.mkdir()
            began = time.perf_counter()
            asyncio.run(_write_chains(path, count))
            wrote = time.perf_counter() - began
            results[count] = {"written_s": round(wrote, 2)}
            for mode in ("restart", "restart_reading_every_chain"):
                runs = []
                for _ in range(rounds):
                    me = [sys.executable, "-m", "benchmarks.bounded_state"]
                    flag = "--every-chain-child" if mode != "restart" else "--restart-child"
                    child = subprocess.run(
                        [*me, flag, str(path)], capture_output=True, text=True, check=True
                    )
                    runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
                results[count][mode] = {
                    "s_median": round(statistics.median(r["restart_s"] for r in runs), 3),
                    "rss_mib_median": round(statistics.median(r["rss_mib"] for r in runs), 1),
                    "chains_in_memory": runs[-1]["chains_in_memory"],
                    "rounds": [(round(r["restart_s"], 3), round(r["rss_mib"], 1)) for r in runs],
                }
    return results


# --- access -------------------------------------------------------------------------------------


class _CountingPort:
    def __init__(self, directory) -> None:
        self.directory = directory
        self.calls: collections.Counter[str] = collections.Counter()

    async def authenticate_at(self, token_hash: str):
        self.calls["authenticate_at"] += 1
        return await self.directory.authenticate_at(token_hash)

    async def bot_at(self, bot_id: str):
        self.calls["bot_at"] += 1
        return await self.directory.bot_at(bot_id)

    async def watch_access(self, watcher: str, since: int, wait: float):
        return await self.directory.watch_access(watcher, since, wait)


async def _settled(directory) -> None:
    for _ in range(400):
        if directory.records.access.watchers():
            break
        await asyncio.sleep(0.005)
    await directory.records.access.settled(directory.records.access.revision)


async def _access(path: Path, bots: int, people: int, requests: int) -> dict:
    from actors.directory import DirectoryService
    from engine.directory import Bot, Principal, may_use
    from engine.errors import Unauthenticated
    from gateway.auth import Auth
    from storage.directory_store import hash_token

    directory = DirectoryService(path)
    await directory.create_org("bench", ORG)
    tokens = []
    for p in range(people):
        _, token = await directory.create_user(f"p{p}", [ORG], f"u_{p:05d}")
        tokens.append(token)
    lead = await directory.create_bot(name="Lead", org=ORG, owner="u_00000")
    made = [
        Bot(id=f"b_{i:06d}", name=f"bot {i}", org=ORG, owner=f"u_{i % people:05d}")
        for i in range(bots)
    ]
    for k in range(0, bots, 5000):
        await directory.store.put_many("bots", made[k : k + 5000])
    directory.store.db.close()

    began = time.perf_counter()
    directory = DirectoryService(path)  # loads every record and builds the index
    opened = time.perf_counter() - began
    try:
        port = _CountingPort(directory)
        auth = Auth(SimpleNamespace(directory_port=port, shard_ports=[]), "admin", 60.0)  # type: ignore[arg-type]
        for _ in range(2000):  # until its watch answered once (a new directory: at revision 0)
            with contextlib.suppress(Unauthenticated):
                await auth.principal_for("obt_starts_the_watch")
            if auth._caching():
                break
            await asyncio.sleep(0.01)

        async def requests_round() -> dict:
            port.calls.clear()
            for r in range(requests):
                principal = await auth.principal_for(tokens[r % people])
                await auth.bot(f"b_{(r % people):06d}")
                assert principal.user is not None
            return dict(port.calls)

        warm = await requests_round()
        await directory.create_member(lead.id, "Helper", None, None)
        await _settled(directory)
        after_member = await requests_round()
        auth.drop(None)  # a change that names nothing: every entry goes
        after_global_drop = await requests_round()
        port.calls.clear()
        for _ in range(requests):
            with contextlib.suppress(Unauthenticated):
                await auth.principal_for("obt_nobody_has_this_token")
        unknown = dict(port.calls)

        def scan(token_hash: str) -> Principal | None:
            user_id = directory.records.tokens.get(token_hash)
            if user_id is None:
                return None
            user = directory.records.users[user_id]
            channels = frozenset(
                c.id for c in directory.records.channels.values() if user_id in c.people
            )
            usable = frozenset(b.id for b in directory.records.bots.values() if may_use(b, user))
            return Principal(user=user, channels=channels, bots=usable)

        hashes = [hash_token(t) for t in tokens]
        indexed, scanned = [], []
        for h in hashes[: min(200, people)]:
            t0 = time.perf_counter()
            got = await directory.authenticate(h)
            indexed.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            want = scan(h)
            scanned.append(time.perf_counter() - t0)
            assert got == want
        return {
            "directory_open_s": round(opened, 2),
            "calls_warm_round": warm,
            "calls_after_member_creation": after_member,
            "calls_after_a_global_drop": after_global_drop,
            "calls_for_unknown_token": unknown,
            "authenticate_indexed_us_median": round(statistics.median(indexed) * 1e6, 1),
            "authenticate_scan_us_median": round(statistics.median(scanned) * 1e6, 1),
        }
    finally:
        directory.store.db.close()


def access(bots: int, people: int, requests: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="obbs") as tmp:
        return asyncio.run(_access(Path(tmp), bots, people, requests))


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="1,000 chains, 5,000 bots, one round")
    p.add_argument("--rounds", type=int, default=None, help="restarts per case (default 5)")
    p.add_argument("--ended", type=int, default=None, help="ended chains (default 10,000)")
    p.add_argument("--bots", type=int, default=None, help="bots (default 50,000)")
    p.add_argument("--people", type=int, default=100)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--only", choices=["chains", "access"])
    p.add_argument("--restart-child", help=argparse.SUPPRESS)
    p.add_argument("--every-chain-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.restart_child or args.every_chain_child:
        _restart_child(args.restart_child or args.every_chain_child, bool(args.every_chain_child))
        return 0
    rounds = args.rounds or (1 if args.quick else 5)
    ended = args.ended or (1000 if args.quick else 10_000)
    bots = args.bots or (5000 if args.quick else 50_000)
    report: dict = {"load_at_start": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count()}
    if args.only in (None, "chains"):
        report["chains"] = chains(ended, rounds)
    if args.only in (None, "access"):
        report["access"] = access(bots, args.people, args.requests)
    report["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
