"""CPU per HTTP request in the gateway's own code, without Ray or sockets: uvicorn's HTTP
protocol (httptools, as the gateway serves it: gateway/http_protocol.py) over a transport that
keeps what is written, handing `GET /healthz` to the gateway's app with its whole middleware
stack (request log, errors, token check, body limits, router), one request after another.

    .venv/bin/python -m benchmarks.gateway_cpu [--requests 5000] [--rounds 3] [--profile]
        [--read | --write [--connections 8] | --fake-write [--only NAME]
         | --events [--users 50] [--clients-per-user 20] [--batch 16]
         | --published [--connections 8] [--users 50] [--clients-per-user 20]]

Prints the CPU microseconds per request of each round. On a busy machine count instructions
instead: run it under `valgrind --tool=callgrind` with `--rounds 1` at two `--requests` and
divide the difference of the totals by the difference of the counts. /healthz answers with no
actor call, so this is the floor every route of the gateway pays.

`--read`: also `GET /v1/bots/:botId/memory` as `benchmarks.memory_ops` reads it (a reader's page
of a 10,000-entry pool, 1% visible, served from the gateway's cache after the first read),
alternating with /healthz under the same token, on a real engine (Ray, two shards, in a temp
dir); and the same read by a second app on the same engine without the shortcut for cached
pages (gateway/cached_reads.py), down the whole middleware stack and router. The requests run on
the server's own event loop, so the figure is that thread's CPU: the Ray driver's threads and
the load generator are left out (neither works for a cached read).

`--write`: `POST /v1/bots/:botId/memory` (Remember) and `POST /api/app/workspace/memories` (a
bot's memory, by its owner), each body fresh, over `--connections` connections at once so that
the shard calls coalesce, alternating with /healthz on the same real engine, with the event
pump running (the writes' replies bring their events). Prints the server thread's CPU per
request and the whole process's (Ray's threads too).

`--fake-write`: both writes against a directory and a shard in this process that answer at
once (no Ray): the gateway's own work per write, countable under callgrind like /healthz
(`--only` names one of the requests).

`--events`: the hub's work per published event, without a server: `--requests` events (a
Remember's `memory.changed` each, for one user of `--users`, round robin) handed to the hub's
pump by a shard in this process, in batches of `--batch` (as write replies bring them), to
`--clients-per-user` subscribers of each user whose sockets take every frame at once. Per event:
the audience, the frame's encoding, and the writes of its deliveries (the writes themselves
counted as a bare `transport.write` would be: a call that keeps the length). Countable under
callgrind as the requests are.

`--published`: the gateway's whole work per published event, without Ray or sockets: POST
Remember over `--connections` connections at once, each by one of `--users` users in turn,
through the shard proxy's own coalescer and event follower (actors/runtime/shard_proxy.py) to a
stand-in actor in this process that answers each coalesced call after two turns of the loop
(so that requests queue for the next call, as while one is in flight), its reply bringing one
`memory.changed` per Remember for its writer, as the shard's followed reply does; the hub's pump
takes them from the follower and writes each to the writer's `--clients-per-user` subscribers
(sockets as in `--events`). Per request: the POST, its share of the coalesced call and of the
follower's merge, and its event's fan-out (the stand-in's own packing, a few msgspec calls per
call, is counted too). Countable under callgrind as the requests are.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import time
import types
from collections.abc import Callable
from itertools import count
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from gateway.app import create_app
from gateway.http_protocol import KeepAliveHttpProtocol
from gateway.server import proxy_options, tune_gc

REQUEST = b"GET /healthz HTTP/1.1\r\nhost: bench\r\n\r\n"


class Kept(asyncio.Transport):
    """A transport that keeps the sizes of what is written and the statuses answered (no
    socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.closed = False
        self.statuses: dict[int, int] = {}

    def write(self, data: Any) -> None:
        self.written += len(data)
        if data[:9] == b"HTTP/1.1 ":
            status = int(data[9:12])
            self.statuses[status] = self.statuses.get(status, 0) + 1

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(
            name, default
        )

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class Answered(KeepAliveHttpProtocol):
    """The gateway's HTTP protocol, telling when it has answered a request."""

    answered: asyncio.Future[None] | None = None

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.answered is not None and not self.answered.done():
            self.answered.set_result(None)


Request = bytes | Callable[[int], bytes]  # the same bytes each time, or the nth request's


async def serve(
    app: Any,
    requests: int,
    prof: cProfile.Profile | None,
    request: Request = REQUEST,
    clock: Any = time.process_time,
    warmup: int = 0,
    connections: int = 1,
    expect: int | None = None,
) -> tuple[float, float]:
    """CPU seconds (`clock`, and the whole process's) per request for `requests` requests over
    `connections` connections (each sends its next request once its last one is answered),
    after `warmup` ones each; every answer's status is `expect` when given."""
    config = Config(app, lifespan="off", log_level="warning", access_log=False, **proxy_options())
    config.load()
    made = count()
    share = [requests // connections + (k < requests % connections) for k in range(connections)]

    def nth() -> bytes:
        return request(next(made)) if callable(request) else request

    # Made before the clock starts: they are the load generator's work.
    bodies = [[nth() for _ in range(n)] for n in share]

    async def one(protocol: Answered, sent: list[bytes]) -> None:
        for data in sent:
            protocol.answered = asyncio.get_running_loop().create_future()
            protocol.data_received(data)
            await protocol.answered  # (no polling: a wait that spins would be counted)

    opened = []
    for _ in range(connections):
        protocol = Answered(config=config, server_state=ServerState(), app_state={})
        transport = Kept()
        protocol.connection_made(transport)
        opened.append((protocol, transport))
    await asyncio.gather(*(one(p, [nth() for _ in range(warmup)]) for p, _ in opened))
    cpu0, all0 = clock(), time.process_time()
    if prof is not None:
        prof.enable()
    runs = [one(p, sent) for (p, _), sent in zip(opened, bodies, strict=True)]
    await asyncio.gather(*runs)
    if prof is not None:
        prof.disable()
    cpu, whole = clock() - cpu0, time.process_time() - all0
    for protocol, transport in opened:
        protocol.connection_lost(None)
        wrong = {k: v for k, v in transport.statuses.items() if expect is not None and k != expect}
        if wrong:
            raise RuntimeError(f"answered {wrong}, expected {expect}")
    return cpu / requests, whole / requests


def _print_profile(run: Any, top: int) -> None:
    """Run `run(profiler)`'s coroutine profiled and print its `top` functions by own time."""
    prof = cProfile.Profile()
    asyncio.run(run(prof))
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    print(out.getvalue())


def engine_rounds(args: argparse.Namespace) -> None:
    """`--read` and `--write`: requests against /healthz, alternating, on the server's loop
    thread, over a real engine."""
    import secrets
    import shutil
    import tempfile
    from pathlib import Path

    from actors.runtime.engine import Engine, start_ray
    from benchmarks._load import remember_body, workspace_memory_body
    from benchmarks.memory_ops import Admin, seed_pool
    from gateway.live_server import LiveServer

    ray_tmp = tempfile.mkdtemp(prefix="obg", dir="/tmp")  # short: Ray's socket paths
    start_ray(tmp_dir=ray_tmp)
    data = tempfile.mkdtemp(prefix="obg-data-")
    engine = Engine.start(Path(data), shards=2, group_commit=True, prefix="gwcpu")
    token = "bench-admin-" + secrets.token_hex(8)
    app = create_app(engine, token)
    server = LiveServer(app, lifespan="auto")
    admin = Admin(server.port, token)
    try:
        org = admin.post("/v1/admin/orgs", {"name": "bench org"})["id"]
        owner = admin.post("/v1/admin/users", {"name": "owner", "orgs": [org]})
        reader = admin.post("/v1/admin/users", {"name": "reader", "orgs": [org]})
        bot = admin.post("/v1/admin/bots", {"name": "bench bot", "org": org, "owner": owner["id"]})
        grant = {"bot": bot["id"], "user": reader["id"], "permission": "read"}
        admin.post("/v1/admin/grants", grant)
        pool = f"bot:{bot['id']}"
        entries = 10_000 if args.read else 100
        seed_pool(engine.shard_for(owner["id"]), pool, org, reader["id"], entries, 100)
        auth = f"authorization: Bearer {reader['token']}\r\n"
        read = f"GET /v1/bots/{bot['id']}/memory HTTP/1.1\r\nhost: b\r\n{auth}\r\n"
        health = f"GET /healthz HTTP/1.1\r\nhost: b\r\n{auth}\r\n".encode()
        # name → (app, request, expected status, connections)
        requests: dict[str, tuple[Any, Request, int, int]] = {}
        if args.read:
            whole = create_app(engine, token, cached_reads=False)
            requests["GET memory"] = (app, read.encode(), 200, 1)
            requests["GET memory, whole stack"] = (whole, read.encode(), 200, 1)
        if args.write:
            nonce = secrets.token_hex(4)
            head = "host: b\r\ncontent-type: application/json\r\n"

            def post(path: str, who: dict, body: bytes) -> bytes:
                return (
                    f"POST {path} HTTP/1.1\r\n{head}authorization: Bearer {who['token']}\r\n"
                    f"content-length: {len(body)}\r\n\r\n"
                ).encode() + body

            memory = f"/v1/bots/{bot['id']}/memory"
            space = "/api/app/workspace/memories"
            k = args.connections

            def remember(n: int) -> bytes:
                return post(memory, reader, remember_body(0, n))

            def workspace(n: int) -> bytes:
                return post(space, owner, workspace_memory_body(bot["id"], nonce, 0, n))

            requests["POST Remember"] = (app, remember, 201, k)
            requests["POST workspace memory"] = (app, workspace, 201, k)
            # The event pump runs, as on a serving gateway (a read starts it): the writes'
            # replies bring their events, which it takes.
            admin.get_as(reader["token"], memory)
        requests["GET /healthz"] = (app, health, 200, 1)
        tune_gc()
        assert server.loop is not None
        loop = server.loop
        for _ in range(args.rounds):
            for name, (served, request, status, k) in requests.items():
                run = serve(served, args.requests, None, request, time.thread_time, 20, k, status)
                per, whole = asyncio.run_coroutine_threadsafe(run, loop).result()
                load = os.getloadavg()[0]
                print(f"{name}: {per * 1e6:.1f} us of the server thread's CPU per request, "
                      f"{whole * 1e6:.1f} us of the process's (load {load:.1f})",
                      flush=True)  # fmt: skip
        if args.profile:
            for name, (served, request, status, k) in requests.items():
                prof = cProfile.Profile(time.thread_time)  # (not the waits for the GIL)
                run = serve(served, args.requests, prof, request, time.thread_time, 20, k, status)
                asyncio.run_coroutine_threadsafe(run, loop).result()
                out = io.StringIO()
                pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(args.top)
                print(f"--- {name}\n{out.getvalue()}", flush=True)
    finally:
        admin.close()
        server.stop()
        engine.stop()
        import ray

        ray.shutdown()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(data, ignore_errors=True)


class QuietAccessWatch:
    """A directory's access watch with nothing to report: it answers once, then waits out
    each poll (no change), so a gateway trusts its caches as when serving."""

    watched = False

    async def watch_access(self, watcher: str, applied: int, wait: float) -> tuple[int, Any]:
        if self.watched:
            await asyncio.sleep(wait)
        self.watched = True
        return 1, []

    async def unwatch_access(self, watcher: str) -> None:
        pass


class _Directory(QuietAccessWatch):
    """Who the token names and the bot, as the directory answers them."""

    def __init__(self, principal: Any, bot: Any) -> None:
        self.principal = principal
        self.bot = bot

    async def authenticate_at(self, key: str) -> tuple[int, Any]:
        return 1, self.principal

    async def bot_at(self, bot_id: str) -> tuple[int, Any]:
        return 1, self.bot


class _Shard:
    """A shard that answers every Remember and workspace memory with the same created entry
    (no Ray, no storage)."""

    created = b'{"id":"m1","content":"bench","tags":["bench"]}'

    async def remember_packed(self, call: bytes) -> bytes:
        return self.created

    async def workspace_create_memory_json(self, access: Any, body: Any) -> bytes:
        return self.created


def fake_write_rounds(args: argparse.Namespace) -> None:
    """`--fake-write`: POST Remember and a workspace memory against /healthz on a directory and
    a shard in this process that answer at once, no Ray: the gateway's own work per write,
    without the actor call, the coalescing and the events; counted by callgrind as /healthz
    is (`--only` picks one; `--profile` profiles the first)."""
    from engine.directory import Bot, Principal, User

    user = User(id="u1", name="user", orgs=("o1",))
    bot = Bot(id="b1", name="bot", org="o1", owner="u1")
    shard = _Shard()
    engine = types.SimpleNamespace(
        shard_ports=[shard],
        node_hub=None,
        directory_port=_Directory(Principal(user=user, bots=frozenset({"b1"})), bot),
        shard_port=lambda account: shard,
        shard_index=lambda account: 0,
    )
    app = create_app(engine, "bench-admin-token")  # type: ignore[arg-type]
    tune_gc()  # as `openbot serve` collects garbage
    body = (
        b'{"command":{"_tag":"Remember","content":"the customer prefers short answers",'
        b'"tags":["bench"]}}'
    )

    def post(path: bytes, body: bytes) -> bytes:
        return (
            b"POST %s HTTP/1.1\r\nhost: b\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer user-token\r\ncontent-length: %d\r\n\r\n" % (path, len(body))
        ) + body

    memory = (
        b'{"requestId":"r1","scope":"bot","bot":"b1",'
        b'"content":"the customer prefers short answers"}'
    )
    requests = {
        "POST Remember (no actor)": (post(b"/v1/bots/b1/memory", body), 201),
        "POST workspace memory (no actor)": (post(b"/api/app/workspace/memories", memory), 201),
        "GET /healthz": (REQUEST, 200),
    }
    if args.only:
        requests = {k: v for k, v in requests.items() if args.only in k}
    for _ in range(args.rounds):
        for name, (request, status) in requests.items():
            run = serve(app, args.requests, None, request, warmup=20, expect=status)
            per, _ = asyncio.run(run)
            print(f"{name}: {per * 1e6:.1f} us of CPU per request", flush=True)
    if args.profile:
        request = next(iter(requests.values()))[0]
        _print_profile(
            lambda prof: serve(app, args.requests, prof, request, warmup=20, expect=201), args.top
        )


class _Socket:
    """A connection's frame writer that takes every frame at once (no socket)."""

    __slots__ = ("written",)

    def __init__(self) -> None:
        self.written = 0

    def write(self, frame: bytes) -> bool:
        self.written += len(frame)
        return True


class _CountingSocket(_Socket):
    """A `_Socket` that also counts the event frames it takes (a write may carry several)."""

    __slots__ = ("frames",)

    def __init__(self) -> None:
        super().__init__()
        self.frames = 0

    def write(self, frame: bytes) -> bool:
        self.written += len(frame)
        self.frames += frame.count(b'"type":"memory.changed"')
        return True


async def _subscribed(hub: Any, users: list[str], per_user: int, make: Any) -> list[Any]:
    """`per_user` subscribers of each user on `hub`, each writing to a `make()` socket and caught
    up; their sockets."""
    from engine.events import Listener
    from gateway.subscriber import Outlet

    async def unused(message: dict) -> None:
        raise AssertionError("every frame goes to the socket as bytes")

    sockets = []
    for user in users:
        listener = Listener(user=user, orgs=frozenset({"o1"}), bots=frozenset({"b1"}))
        for _ in range(per_user):
            socket = make()
            sub, _ = await hub.subscribe(listener, None, Outlet(unused, writer=socket))  # type: ignore[arg-type]
            await hub.catch_up(sub)
            sockets.append(socket)
    return sockets


def _publishing_shard() -> Any:
    """`_PublishingShard` (made here: the shard proxy is imported only for `--published`)."""
    import msgspec

    from actors.contracts import COALESCED, FOLLOWING_CALL, EventBatch, Followed, RememberCall
    from actors.runtime.shard_proxy import RayShard
    from engine.events import Audience, Event, MemoryChanged, ShardHead

    packer = msgspec.msgpack.Encoder()
    calls = msgspec.msgpack.Decoder(RememberCall)

    class _PublishingShard(RayShard):
        """The shard proxy over a stand-in actor: each coalesced Remember call is answered after
        two turns of the loop with its entries and, as a followed reply does, the events
        published after the caller's `seen` (one `memory.changed` per Remember, heard by its
        writer). Polls wait (every event comes with a reply)."""

        def __init__(self) -> None:
            super().__init__("bench", "bench", handle=object())
            self.log: list[Any] = []
            self.sizes: list[int] = []

        async def event_head(self) -> Any:
            return ShardHead(epoch="e0", oldest=1, head=len(self.log))

        async def _packed(self, method: str, call: bytes) -> bytes:
            if method != "remember_many_followed":
                raise AssertionError(f"{method}: every write follows the shard's events here")
            asked = FOLLOWING_CALL.decode(call)
            requests = COALESCED.decode(asked.call)
            self.sizes.append(len(requests))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            for request in requests:
                seq = len(self.log) + 1
                user = calls.decode(request).reader.user
                data = MemoryChanged(
                    pool="bot:b1", bot="b1", entry=f"m{seq}", version=seq, change="created"
                )
                audience = Audience(org="o1", users=(user,))
                self.log.append(
                    Event(seq=seq, at=1_700_000_000_000 + seq, data=data, audience=audience)
                )
            head = ShardHead(epoch="e0", oldest=1, head=len(self.log))
            handed = self.log[asked.seen : asked.seen + 1000]  # (seq n is the nth event)
            reply = Followed(
                replies=msgspec.Raw(packer.encode([_Shard.created] * len(requests))),
                events=EventBatch(head=head, events=handed),
                upto=handed[-1].seq if handed else head.head,
            )
            return packer.encode(reply)

        async def _poll(self, since: int, limit: int, wait: float, follower: str) -> Any:
            await asyncio.sleep(3600)  # (cancelled when the follower restarts or stops)
            raise AssertionError("a poll answered")

    return _PublishingShard()


async def _published(args: argparse.Namespace, prof: cProfile.Profile | None) -> float:
    """CPU seconds per POST Remember through the coalescer, the follower and the hub (see
    `--published`)."""
    from engine.directory import Bot, Principal, User
    from storage.directory_store import hash_token

    users = [f"u{k}" for k in range(args.users)]
    bot = Bot(id="b1", name="bot", org="o1", owner=users[0], grants={u: "read" for u in users[1:]})  # type: ignore[misc]
    principals = {
        hash_token(f"token-{u}"): Principal(
            user=User(id=u, name=u, orgs=("o1",)), bots=frozenset({"b1"})
        )
        for u in users
    }

    class Directory(_Directory):
        async def authenticate_at(self, key: str) -> tuple[int, Any]:
            return 1, principals.get(key)

    shard = _publishing_shard()
    engine = types.SimpleNamespace(
        shard_ports=[shard],
        node_hub=None,
        directory_port=Directory(None, bot),
        shard_port=lambda account: shard,
        shard_index=lambda account: 0,
    )
    app = create_app(engine, "bench-admin-token")  # type: ignore[arg-type]
    hub = app.state.hub
    sockets = await _subscribed(hub, users, args.clients_per_user, _CountingSocket)
    body = (
        b'{"command":{"_tag":"Remember","content":"the customer prefers short answers",'
        b'"tags":["bench"]}}'
    )
    share = max(1, args.requests // args.connections)

    def remember(n: int) -> bytes:
        # Requests in the order they go (the ith of each connection in turn), users in turn.
        user = users[(n % share * args.connections + n // share) % len(users)]
        return (
            b"POST /v1/bots/b1/memory HTTP/1.1\r\nhost: b\r\ncontent-type: application/json\r\n"
            b"authorization: Bearer token-%s\r\ncontent-length: %d\r\n\r\n"
            % (user.encode(), len(body))
        ) + body

    per, _ = await serve(
        app, args.requests, prof, remember, warmup=20, connections=args.connections, expect=201
    )
    for _ in range(100):  # the last reply's events: handed out a few turns later
        if hub.heads[0].head == len(shard.log):
            break
        await asyncio.sleep(0)
    await hub.stop()
    if sum(s.frames for s in sockets) != len(shard.log) * args.clients_per_user:
        raise RuntimeError("an event did not reach all its clients")
    print(
        f"(coalesced calls: {len(shard.sizes)}, {len(shard.log) / len(shard.sizes):.1f} "
        f"Remembers each)",
        flush=True,
    )
    return per


def published_rounds(args: argparse.Namespace) -> None:
    """`--published`: the gateway's CPU per published event (`--profile`: one more round)."""
    tune_gc()
    for _ in range(args.rounds):
        per = asyncio.run(_published(args, None))
        print(
            f"POST Remember, its event to {args.clients_per_user} clients: "
            f"{per * 1e6:.1f} us of CPU per request",
            flush=True,
        )
    if args.profile:
        _print_profile(lambda prof: _published(args, prof), args.top)


class _EventLog:
    """One shard's event log for the hub's pump: the batches, then nothing (the pump waits)."""

    def __init__(self, batches: list[list[Any]]) -> None:
        self.batches = batches
        self.go = asyncio.Event()
        self.done: asyncio.Future[None] | None = None

    async def event_head(self) -> Any:
        from engine.events import ShardHead

        return ShardHead(epoch="e0", oldest=1, head=0)

    async def events_after(self, seq: int, limit: int, wait: float) -> tuple[Any, list[Any]]:
        from engine.events import ShardHead

        await self.go.wait()
        if not self.batches:
            assert self.done is not None
            self.done.set_result(None)
            await asyncio.sleep(3600)
        batch = self.batches.pop(0)
        return ShardHead(epoch="e0", oldest=1, head=batch[-1].seq), batch


async def _hub_events(args: argparse.Namespace, prof: cProfile.Profile | None) -> float:
    """CPU seconds per event for `--requests` events through a hub's pump (see `--events`)."""
    from engine.events import Audience, Event, MemoryChanged
    from gateway.fanout import Hub

    users = [f"u{k}" for k in range(args.users)]
    events = [
        Event(
            seq=n,
            at=1_700_000_000_000 + n,
            data=MemoryChanged(pool="bot:b1", entry=f"m{n}", version=1, change="created"),
            audience=Audience(org="o1", users=(users[n % len(users)],)),
        )
        for n in range(1, args.requests + 1)
    ]
    batches = [events[k : k + args.batch] for k in range(0, len(events), args.batch)]
    log = _EventLog(batches)
    log.done = asyncio.get_running_loop().create_future()
    hub = Hub(types.SimpleNamespace(shard_ports=[log]))  # type: ignore[arg-type]
    sockets = await _subscribed(hub, users, args.clients_per_user, _Socket)
    cpu0 = time.process_time()
    if prof is not None:
        prof.enable()
    log.go.set()
    await log.done
    if prof is not None:
        prof.disable()
    cpu = time.process_time() - cpu0
    await hub.stop()
    if any(s.written == 0 for s in sockets):
        raise RuntimeError("a client got no frame")
    return cpu / args.requests


def event_rounds(args: argparse.Namespace) -> None:
    """`--events`: the hub's CPU per event (`--profile`: one more round, profiled)."""
    tune_gc()
    for _ in range(args.rounds):
        per = asyncio.run(_hub_events(args, None))
        print(f"event to {args.clients_per_user} clients: {per * 1e6:.1f} us of CPU per event")
    if args.profile:
        _print_profile(lambda prof: _hub_events(args, prof), args.top)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--top", type=int, default=30, help="functions --profile lists")
    p.add_argument("--read", action="store_true", help="GET memory against /healthz (Ray)")
    p.add_argument("--write", action="store_true", help="POST Remember, workspace memory (Ray)")
    p.add_argument(
        "--connections", type=int, default=8, help="--write: connections writing at once"
    )
    p.add_argument("--only", help="--fake-write: only the requests whose name has this")
    p.add_argument("--fake-write", action="store_true", help="POST Remember, no actor (no Ray)")
    p.add_argument("--events", action="store_true", help="the hub's work per event (no server)")
    p.add_argument(
        "--published", action="store_true", help="POST Remember to its event's fan-out (no Ray)"
    )
    p.add_argument("--users", type=int, default=50, help="--events: users")
    p.add_argument("--clients-per-user", type=int, default=20, help="--events: clients per user")
    p.add_argument("--batch", type=int, default=16, help="--events: events per pump batch")
    args = p.parse_args()
    if args.events:
        event_rounds(args)
        return
    if args.published:
        published_rounds(args)
        return
    if args.fake_write:
        fake_write_rounds(args)
        return
    if args.read or args.write:
        engine_rounds(args)
        return
    engine = types.SimpleNamespace(shard_ports=[], node_hub=None)  # /healthz calls no actor
    app = create_app(engine, "bench-admin-token")  # type: ignore[arg-type]
    tune_gc()
    for _ in range(args.rounds):
        per, _ = asyncio.run(serve(app, args.requests, None))
        print(f"GET /healthz: {per * 1e6:.1f} us of CPU per request", flush=True)
    if args.profile:
        _print_profile(lambda prof: serve(app, args.requests, prof), args.top)


if __name__ == "__main__":
    main()
