"""`openbot demo`: three scripted bots discuss in a group, then two of them collaborate, while the
terminal shows the live event stream (docs/design.md §10).

Everything goes through the public API, as any client would: the admin routes create an org, a
person and three bots in a group channel; the person opens the group chat, listens on
`/v1/events` and posts two turns:

1. a three-round discussion (`rounds: 3`): every bot speaks once per round;
2. "Ada, please ask Brook …" for Ada alone: Ada's model calls `workspace_send_to_agent`, Brook
   answers in its own agent chat, the answer comes back to the group as a `delivery` item and
   wakes Ada, who brings it to the group. `/api/app/workspace/collaboration` shows the chain.

Events carry ids only, so each `chat.item.created` line is completed with the item's text from
`GET /v1/chats/{id}/items`. The demo ends once the discussion and the chain are over.

`run_demo` joins a running server; `embedded_server` starts one for the demo (local Ray, a
temporary data directory, a loopback port, the config in examples/openbot.toml whose `demo-bots`
model answers from examples/demo-bots.toml) and removes it afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import socket
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gateway.client import EventClient, EventFrame

DEFAULT_MODEL = "demo-bots"
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "openbot.toml"
PERSON = "Pat"
BOTS = (
    ("Ada", "Product lead: keeps the group on the goal and closes the discussion."),
    ("Brook", "Quality engineer: turns ideas into test plans."),
    ("Cato", "Operations: thinks about rollout, load and rollback."),
)
ROUNDS = 3
DISCUSSION = "Let's discuss: how should we roll out the new search feature?"
ASKER, HELPER = "Ada", "Brook"
COLLABORATION = f"{ASKER}, please ask {HELPER} for a test plan and bring it back to the group."
CONNECT_TIMEOUT = 15.0


class DemoError(Exception):
    """The demo could not go on (refused request, lost event stream, timeout)."""


@dataclass
class DemoResult:
    org: str
    person: str
    bots: dict[str, str]  # name -> id
    channel: str
    chat: str
    discussion: dict  # the discussion turn: {turn, items}
    collaboration_turn: dict  # the turn that started the chain: {turn, items}
    collaboration: dict | None  # the chain as /api/app/workspace/collaboration shows it
    chat_items: list[dict]  # the group chat at the end
    lines: list[str] = field(default_factory=list)  # the event lines, as printed
    events: Counter = field(default_factory=Counter)  # frames seen, by type
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Every bot step of the discussion answered (`openbot demo` exits 1 otherwise)."""
        items = self.discussion["items"]
        return any(i["kind"] == "bot" for i in items) and not any(
            i["kind"] == "notification" for i in items
        )


def _check(resp: httpx.Response, what: str) -> dict:
    if not resp.is_success:
        try:
            err = resp.json()["error"]
            why = f"{err['code']}: {err['message']}"
        except (ValueError, KeyError, TypeError):
            why = resp.text[:200]
        raise DemoError(f"{what} failed (HTTP {resp.status_code}) {why}")
    return resp.json()


def _one_line(text: str) -> str:
    return " ".join(text.split())


class LiveView:
    """Prints each event frame as one line, with the item's text fetched for chat items."""

    def __init__(
        self, http: httpx.AsyncClient, names: dict[str, str], out: Callable[[str], None]
    ) -> None:
        self.http = http
        self.names = names  # user and bot ids -> names
        self.out = out
        self.started = time.monotonic()
        self.items: dict[tuple[str, str], dict] = {}
        self.shown: set[tuple[str, str]] = set()
        self.lines: list[str] = []
        self.counts: Counter = Counter()
        self.changed = asyncio.Event()
        self.chat_labels: dict[str, str] = {}

    async def watch(self, events: EventClient) -> None:
        async for frame in events:
            await self.show(frame)

    async def item(self, chat: str, item: str) -> dict | None:
        key = (chat, item)
        if key not in self.items:
            resp = await self.http.get(f"/v1/chats/{chat}/items")
            if resp.is_success:
                for i in resp.json()["items"]:
                    self.items[(chat, i["id"])] = i
        return self.items.get(key)

    async def links(self, chain_id: str, status: str | None) -> str:
        """The chain's links (naming its agent chats), each link's status only while the chain is
        still in the event's `status`: the route shows it now, maybe past the event shown."""
        try:
            chains = await _chains(self.http)
        except DemoError:
            return "?"
        chain = next((c for c in chains if c["id"] == chain_id), None)
        if chain is None:
            return "?"
        shown = []
        current = chain["status"] == status
        for link in chain["links"]:
            if link.get("agentChat"):
                self.chat_labels[link["agentChat"]] = f"agent:{self.name(link['toBot'])}"
            state = f" {link['status']}" if current else ""
            shown.append(f"{self.name(link['fromBot'])} -> {self.name(link['toBot'])}{state}")
        return ", ".join(shown) or "no links"

    def name(self, who: str | None) -> str:
        return self.names.get(who or "", who or "?")

    async def show(self, frame: EventFrame) -> None:
        data = frame.data or {}
        self.counts[frame.type] += 1
        stamp = f"{time.monotonic() - self.started:6.2f}s"
        if frame.type == "chat.item.created":
            chat, item = data.get("chat", "?"), data.get("item", "?")
            found = await self.item(chat, item)
            if found is None:
                said = "(not readable)"
                who = "?"
            else:
                said = _one_line(found["text"])
                who = self.name(found["author"])
                sent = (found.get("communication") or {}).get("direction") == "sent"
                if sent:  # UI-1: the asker's own record of what it sent
                    who = f"{who} to {self.name(found['communication']['peer'])}"
                elif found["kind"] == "delivery":
                    who = f"from {who}"
            label = self.chat_labels.get(chat, chat)
            kind = data.get("kind", "?")
            line = f"{stamp}  {frame.type:<21} {label:<12} {item:<5} {kind:<12} {who}: {said}"
            self.shown.add((chat, item))
        elif frame.type == "collaboration.changed":
            chat = data.get("chat") or "?"
            label = self.chat_labels.get(chat, chat)
            links = await self.links(str(data.get("collaboration")), data.get("status"))
            line = (
                f"{stamp}  {frame.type:<21} {label:<12} {data.get('collaboration')} "
                f"{data.get('status')}: {links}"
            )
        elif frame.type == "reset":
            line = f"{stamp}  reset (the server could not resume; continuing from now)"
        else:
            detail = " ".join(f"{k}={v}" for k, v in data.items())
            line = f"{stamp}  {frame.type:<21} {detail}"
        self.lines.append(line)
        self.out(line)
        self.changed.set()

    async def wait(self, watcher: asyncio.Task, deadline: float, what: str) -> None:
        """Until the next event, half a second at most; fails once the stream is gone or time
        is up. Clear `changed` before looking at the state that the event would change."""
        _alive(watcher)
        left = deadline - time.monotonic()
        if left <= 0:
            raise DemoError(f"timed out waiting for {what}")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), min(0.5, left))

    async def until(self, done: Callable[[], bool], watcher: asyncio.Task, deadline: float) -> None:
        """Until every wanted event was shown."""
        while True:
            self.changed.clear()
            if done():
                return
            await self.wait(watcher, deadline, "the live events")


async def _setup(admin: httpx.AsyncClient, model: str) -> tuple[dict, str, dict[str, str], str]:
    tag = secrets.token_hex(3)
    org = _check(await admin.post("/v1/admin/orgs", json={"name": f"Demo {tag}"}), "create org")
    person = _check(
        await admin.post("/v1/admin/users", json={"name": PERSON, "orgs": [org["id"]]}),
        "create user",
    )
    bots: dict[str, str] = {}
    for name, about in BOTS:
        bot = _check(
            await admin.post(
                "/v1/admin/bots",
                json={
                    "name": name,
                    "org": org["id"],
                    "owner": person["id"],
                    "model": model,
                    "rules": {"name": name, "description": about},
                },
            ),
            f"create bot {name}",
        )
        bots[name] = bot["id"]
    channel = _check(
        await admin.post(
            "/v1/admin/channels",
            json={
                "org": org["id"],
                "name": "Search rollout",
                "people": [person["id"]],
                "bots": list(bots.values()),
            },
        ),
        "create channel",
    )
    return person, org["id"], bots, channel["id"]


async def _turn(http: httpx.AsyncClient, chat: str, body: dict) -> dict:
    resp = await http.post(f"/v1/chats/{chat}/turns", params={"wait": "true"}, json=body)
    return _check(resp, "turn")


async def _chains(http: httpx.AsyncClient, cursor: str = "") -> list[dict]:
    """Every chain the caller may see, page after page."""
    q = {"limit": "200", "cursor": cursor}
    page = _check(await http.get("/api/app/workspace/collaboration", params=q), "items")
    more = await _chains(http, page["nextCursor"]) if page.get("nextCursor") else []
    return page["items"] + more


async def _chain_of(http: httpx.AsyncClient, chat: str, turn: str) -> dict | None:
    chains = await _chains(http)
    found = [c for c in chains if c["rootChat"] == chat and c["topic"] == turn]
    return found[-1] if found else None


def _chain_finished(chain: dict, items: list[dict]) -> bool:
    """Over when it no longer runs and every result it delivered to the group chat is there,
    with the answer of the bot it woke after it. (A chain is "done" as soon as its last result
    is recorded, a moment before that result reaches the chat.)"""
    if chain["status"] == "running":
        return False
    delivered = [
        link
        for link in chain["links"]
        if link["parent"] is None and link["status"] == "answered" and link.get("reason") is None
    ]
    if not delivered:
        return True  # no result woke anybody (suppressed, late after a cap or a stop)
    mine = [i for i in items if i.get("turn") == chain["topic"]]
    arrived = [k for k, i in enumerate(mine) if _received(i)]
    if len(arrived) < len(delivered):
        return False
    return any(
        i["kind"] in ("bot", "notification") and i["author"] == chain["rootBot"]
        for i in mine[arrived[-1] + 1 :]
    )


def _received(item: dict) -> bool:
    """A delivery that came back to this chat (not the record of one it sent, UI-1)."""
    c = item.get("communication") or {}
    return item["kind"] == "delivery" and c.get("direction") != "sent"


async def run_demo(
    url: str,
    admin_token: str,
    *,
    model: str = DEFAULT_MODEL,
    out: Callable[[str], None] = print,
    timeout: float = 120.0,
) -> DemoResult:
    """Run the demo against the server at `url`; every line goes to `out`."""
    began = time.monotonic()
    deadline = began + timeout
    admin_auth = {"Authorization": f"Bearer {admin_token}"}
    async with httpx.AsyncClient(base_url=url, headers=admin_auth, timeout=timeout) as admin:
        person, org, bots, channel = await _setup(admin, model)
    names = {person["id"]: PERSON} | {bot_id: name for name, bot_id in bots.items()}
    auth = {"Authorization": f"Bearer {person['token']}"}
    async with httpx.AsyncClient(base_url=url, headers=auth, timeout=timeout) as http:
        chat = _check(await http.post("/v1/chats", json={"channel": channel}), "open group chat")
        chat_id = chat["id"]
        live = LiveView(http, names, out)
        live.chat_labels[chat_id] = "group"
        out(f"openbot demo on {url}")
        out(f"  org {org}, person {PERSON} ({person['id']})")
        out("  bots " + ", ".join(f"{n} ({b})" for n, b in bots.items()) + f", model {model!r}")
        out(f"  group chat {chat_id} (shown as 'group'); agent chats are where a bot works")
        out("  on what another bot sent it")
        async with EventClient(url, person["token"]) as events:
            watcher = asyncio.create_task(live.watch(events))
            try:
                await _connected(events, watcher)
                out("")
                out(f"{PERSON}: {DISCUSSION}  [{ROUNDS} rounds]")
                discussion = await _turn(http, chat_id, {"text": DISCUSSION, "rounds": ROUNDS})
                await live.until(_shown(live, chat_id, discussion), watcher, deadline)

                out("")
                out(f"{PERSON}: {COLLABORATION}  [to {ASKER} only]")
                kick = await _turn(
                    http, chat_id, {"text": COLLABORATION, "mentions": [bots[ASKER]]}
                )
                await live.until(_shown(live, chat_id, kick), watcher, deadline)
                # The chain (if the bot sent anything) is stored before the turn's wait ends.
                chain, items = await _follow_chain(
                    http, live, chat_id, kick["turn"]["id"], watcher, deadline
                )
            finally:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await watcher
    result = DemoResult(
        org=org,
        person=person["id"],
        bots=bots,
        channel=channel,
        chat=chat_id,
        discussion=discussion,
        collaboration_turn=kick,
        collaboration=chain,
        chat_items=items,
        lines=live.lines,
        events=live.counts,
        seconds=time.monotonic() - began,
    )
    for line in summary(result, names):
        out(line)
    return result


async def _follow_chain(
    http: httpx.AsyncClient,
    live: LiveView,
    chat: str,
    turn: str,
    watcher: asyncio.Task,
    deadline: float,
) -> tuple[dict | None, list[dict]]:
    """Wait until the chain started by `turn` is over and all its items were shown."""
    while True:
        live.changed.clear()
        chain = await _chain_of(http, chat, turn)
        items = _check(await http.get(f"/v1/chats/{chat}/items"), "items")["items"]
        if chain is None or _chain_finished(chain, items):
            break
        await live.wait(watcher, deadline, "the collaboration chain")
    if chain is None:
        return None, items
    wanted = {(chat, i["id"]) for i in items}
    for link in chain["links"]:
        if link.get("agentChat"):
            wanted.update((link["agentChat"], i) for i in await _item_ids(http, link["agentChat"]))
    await live.until(lambda: wanted <= live.shown, watcher, deadline)
    return chain, items


def _shown(live: LiveView, chat: str, turn: dict) -> Callable[[], bool]:
    wanted = {(chat, i["id"]) for i in turn["items"]}
    return lambda: wanted <= live.shown


async def _item_ids(http: httpx.AsyncClient, chat: str) -> list[str]:
    resp = await http.get(f"/v1/chats/{chat}/items")
    return [i["id"] for i in resp.json()["items"]] if resp.is_success else []


def _alive(watcher: asyncio.Task) -> bool:
    if watcher.done():
        exc = None if watcher.cancelled() else watcher.exception()
        raise DemoError(f"the event stream ended: {exc or 'closed'}")
    return True


async def _connected(events: EventClient, watcher: asyncio.Task) -> None:
    """The client has its first (hello) frame: from here on no event is missed."""
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while events.cursor is None:
        _alive(watcher)
        if time.monotonic() > deadline:
            raise DemoError("could not connect to /v1/events")
        await asyncio.sleep(0.02)


def summary(result: DemoResult, names: dict[str, str]) -> list[str]:
    def name(who: str | None) -> str:
        return names.get(who or "", who or "?")

    turn = result.discussion["turn"]
    said = [i for i in result.discussion["items"] if i["kind"] == "bot"]
    failed = [i for i in result.discussion["items"] if i["kind"] == "notification"]
    speakers = ", ".join(dict.fromkeys(name(i["author"]) for i in said)) or "nobody"
    lines = ["", "Summary"]
    lines.append(
        f"  discussion: {len(said)} replies in {turn.get('rounds', '?')} rounds from {speakers} "
        f"(turn {turn['status']}" + (f", {len(failed)} failed steps" if failed else "") + ")"
    )
    chain = result.collaboration
    if chain is None:
        lines.append(
            f"  collaboration: none started ({name(result.bots.get(ASKER))} did not call "
            "workspace_send_to_agent)"
        )
    else:
        lines.append(
            f"  collaboration {chain['id']}: {chain['status']}, {chain['deliveries']} deliveries"
        )
        for link in chain["links"]:
            lines.append(
                f"    {name(link['fromBot'])} -> {name(link['toBot'])} ({link['status']}): "
                f"{_one_line(link.get('request') or '')!r}"
            )
            if link.get("result"):
                lines.append(f"      answer: {_one_line(link['result'])!r}")
        mine = [
            i
            for i in result.chat_items
            if i.get("turn") == chain["topic"] and i["kind"] in ("bot", "delivery")
        ]
        if mine and mine[-1]["kind"] == "bot":
            lines.append(f"    {name(mine[-1]['author'])} in the group: {mine[-1]['text']!r}")
    if failed or not said:
        lines.append(
            "  some steps failed: is the model configured on this server? (openbot demo --model)"
        )
    counts = ", ".join(f"{k} {v}" for k, v in sorted(result.events.items()))
    lines.append(f"  events: {sum(result.events.values())} ({counts})")
    lines.append(f"  took {result.seconds:.1f} s")
    return lines


@contextlib.contextmanager
def embedded_server(
    config: str | Path | None = None, *, port: int = 0
) -> Iterator[tuple[str, str]]:
    """A server for the demo (local Ray, temporary data, `port` or a free one, the models of
    `config`); yields its URL and admin token, and stops and removes everything afterwards."""
    import actors.runtime.engine  # noqa: F401  (Ray's environment before ray is imported)

    path = Path(config) if config else DEFAULT_CONFIG
    if not path.exists():
        raise DemoError(f"no config at {path}: give --config (with a scripted model) or --url")
    if port:  # a taken port fails at once, before Ray starts
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as e:
                raise DemoError(f"port {port} on 127.0.0.1 is not free ({e.strerror})") from e
    from actors.runtime.engine import Engine, ray_started, start_ray, stop_ray
    from gateway.app import create_app
    from gateway.live_server import LiveServer
    from gateway.server import load_settings

    settings = load_settings(config=str(path))
    data = tempfile.mkdtemp(prefix="openbot-demo-")
    # Ray's unix socket paths must stay short: its temp dir stays near the root.
    ray_tmp = tempfile.mkdtemp(prefix="obd", dir="/tmp")
    engine = live = None
    started_ray = not ray_started()
    try:
        start_ray(None, tmp_dir=ray_tmp)
        engine = Engine.start(
            data,
            shards=settings.shards,
            prefix="demo-" + secrets.token_hex(4),
            models_config=settings.models,
            config_dir=settings.config_dir,
        )
        token = "oba_" + secrets.token_urlsafe(32)
        live = LiveServer(create_app(engine, token), port=port)
        yield live.url, token
    finally:
        if live is not None:
            live.stop()
        if engine is not None:
            engine.stop()
        if started_ray:
            stop_ray()
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(ray_tmp, ignore_errors=True)
