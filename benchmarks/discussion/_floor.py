"""The floor: the 8-bot, 12-round discussion on one ShardService in this process (no Ray, no
HTTP), each DuckDB transaction timed on the database thread; `--profile` adds cProfile's top."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.discussion._figures import dist, item_gaps
from benchmarks.discussion._scripts import BOTS, DISCUSS_TEXT, ROUNDS, STEPS


async def floor_async(data: Path, config: dict, runs: int, profile: bool) -> dict[str, Any]:
    from actors.contracts import TurnStart
    from actors.models.registry import ScriptedModel
    from actors.shard.service import ShardService
    from engine.directory import Bot, Channel, Chat, Org

    models = {"talk": ScriptedModel.from_file("talk", config["talk"]["script"])}
    svc = ShardService(data, 0, models=models)
    org = Org(id="o_floor", name="floor")
    bots = tuple(
        Bot(id=f"b_floor{k}", name=f"Floor{k}", org=org.id, owner="u_floor", model="talk")
        for k in range(BOTS)
    )
    channel = Channel(
        id="ch_floor", org=org.id, people=("u_floor",), bots=tuple(b.id for b in bots)
    )
    chat = Chat(
        id="chat_floor",
        kind="group",
        owner="u_floor",
        org=org.id,
        channel=channel.id,
        home=channel.id,
    )
    start = TurnStart(
        chat=chat,
        bot=None,
        org=org,
        operator="u_floor",
        text=DISCUSS_TEXT,
        channel=channel,
        members=bots,
        rounds=ROUNDS,
    )

    async def one() -> tuple[float, list[float]]:
        t0 = time.perf_counter()
        turn = await svc.start_turn(start)
        result = await svc.wait_turn(chat.id, turn.id)
        dt = (time.perf_counter() - t0) * 1000
        said = [i for i in result.items if i.kind == "bot"]
        if result.turn.status != "done" or len(said) != STEPS:
            raise RuntimeError(f"floor turn: {result.turn.status} {result.turn.error} {len(said)}")
        return dt, item_gaps([{"at": i.at} for i in result.items])

    # Time each transaction on the database thread (wall and that thread's CPU).
    commits = {"n": 0, "wall": 0.0, "cpu": 0.0, "rows": 0}
    inner = svc.committer._commit

    def timed_commit(batches, con):
        w, c = time.perf_counter(), time.thread_time()
        try:
            return inner(batches, con)
        finally:
            commits["n"] += 1
            commits["wall"] += time.perf_counter() - w
            commits["cpu"] += time.thread_time() - c
            commits["rows"] += sum(len(b) for b in batches)

    svc.committer._commit = timed_commit
    try:
        cold, _ = await one()
        commits.update(n=0, wall=0.0, cpu=0.0, rows=0)
        txn0, batches0 = svc.committer.transactions, svc.committer.batches
        cpu0 = time.process_time()
        prof = None
        if profile:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        turns, gaps = [], []
        for _ in range(runs):
            dt, g = await one()
            turns.append(dt)
            gaps.extend(g[1:])
        if prof is not None:
            prof.disable()
        cpu = time.process_time() - cpu0
        steps = runs * STEPS
        out = {
            "cold_turn_ms": round(cold, 2),
            "turn_ms": dist(turns),
            "step_ms": dist([t / STEPS for t in turns]),
            "item_gap_ms": dist(gaps),
            "txn_per_step": round((svc.committer.transactions - txn0) / steps, 2),
            "batches_per_step": round((svc.committer.batches - batches0) / steps, 2),
            "cpu_ms_per_step": {"driver": round(cpu * 1000 / steps, 3)},
            "commit": {
                "per_txn_wall_ms": round(commits["wall"] * 1000 / max(commits["n"], 1), 3),
                "per_txn_cpu_ms": round(commits["cpu"] * 1000 / max(commits["n"], 1), 3),
                "writes_per_txn": round(commits["rows"] / max(commits["n"], 1), 1),
                "wall_ms_per_step": round(commits["wall"] * 1000 / steps, 3),
                "cpu_ms_per_step": round(commits["cpu"] * 1000 / steps, 3),
            },
        }
        if prof is not None:
            out["profile_top"] = profile_top(prof)
        return out
    finally:
        await svc.close()


def profile_top(prof: Any, n: int = 25) -> list[str]:
    import io
    import pstats

    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.sort_stats("tottime").print_stats(n)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    return lines[-(n + 1) :]
