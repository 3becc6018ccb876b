"""Running the server: settings from flags, environment and config file, the admin token, Ray,
the actors and uvicorn."""

from __future__ import annotations

import fcntl
import gc
import logging
import os
import secrets
import shutil
import socket
import tomllib
from dataclasses import dataclass
from pathlib import Path

from engine.errors import InvalidInput, Unavailable
from gateway.http_protocol import KeepAliveHttpProtocol
from gateway.nodes import MAX_FRAME as NODE_MAX_FRAME
from gateway.socket_frames import FramingProtocol

ADMIN_TOKEN_FILE = "admin.token"
log = logging.getLogger("openbot")

# How uvicorn serves websockets (here, in the benchmarks and in the tests' live servers).
# Protocol-level pings notice dead peers (docs/design.md §8 heartbeats). websockets' sans-I/O
# protocol writes a frame without a task or a wait while the socket takes it (the fan-out relies on
# that, gateway/subscriber.py), and ours also takes ready-made event frames. No permessage-deflate:
# event frames are small, and compressing each one for each client costs more CPU than framing
# it, plus a zlib state per connection (docs/benchmarks.md, "Design measurements").
UVICORN_WS = {
    "ws": FramingProtocol,  # websockets-sansio offering ready-made event frames (socket_frames.py)
    "ws_ping_interval": 15.0,
    "ws_ping_timeout": 15.0,
    "ws_per_message_deflate": False,
    # The largest frame any socket of this API takes (a node's answer): uvicorn buffers a message
    # up to this size before a route can refuse it, so its own default (16 MiB) is not kept.
    "ws_max_size": NODE_MAX_FRAME,
}


# How uvicorn serves HTTP: its httptools protocol with one keep-alive timer per connection
# instead of one per request (gateway/http_protocol.py).
UVICORN_HTTP = {"http": KeepAliveHttpProtocol}


def proxy_options() -> dict[str, bool]:
    """uvicorn's forwarded-headers layer (a request's client address and scheme taken from a
    proxy's X-Forwarded-For and X-Forwarded-Proto) only where the operator names the proxies
    to trust, in uvicorn's own FORWARDED_ALLOW_IPS. The gateway reads neither the client nor
    the scheme (only a redirect's absolute Location shows the scheme), and the layer is a pass
    over the headers and one more frame on every request."""
    return {} if os.environ.get("FORWARDED_ALLOW_IPS") else {"proxy_headers": False}


@dataclass
class ServeSettings:
    data_dir: Path = Path("./data")
    host: str = "127.0.0.1"
    port: int = 8765
    shards: int = 2
    ray_address: str | None = None
    placement: str = "auto"  # actors/runtime/engine.py: auto, spread, pinned or local
    group_commit: bool = True
    actor_prefix: str = "openbot"
    models: dict | None = None  # the config's [models.*] tables (docs/design.md §6)
    search: dict | None = None  # the config's [search] table: embedding_model, min_score (SC-7)
    config_dir: str | None = None
    cache_records: int | None = None  # records each shard keeps loaded (actors/shard/residency.py)


def load_settings(
    *,
    config: str | None = None,
    data_dir: str | None = None,
    host: str | None = None,
    port: int | None = None,
    shards: int | None = None,
    ray_address: str | None = None,
    placement: str | None = None,
) -> ServeSettings:
    """Flags win over environment, which wins over the config file's [server] table."""
    file: dict = {}
    models: dict = {}
    search: dict = {}
    path = config or os.environ.get("OPENBOT_CONFIG")
    if path:
        try:
            with open(path, "rb") as f:
                whole = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise InvalidInput(f"cannot read config {path}: {e}") from e
        file = whole.get("server", {})
        models = whole.get("models", {})
        search = whole.get("search", {})
    else:
        # No config: the built-in `local` model, so a first bot can chat without a model server.
        models = {"local": {"kind": "local"}}
    env = os.environ
    s = ServeSettings()
    s.data_dir = Path(data_dir or env.get("OPENBOT_DATA_DIR") or file.get("data_dir") or s.data_dir)
    s.host = host or env.get("OPENBOT_HOST") or file.get("host") or s.host
    s.port = int(port or env.get("OPENBOT_PORT") or file.get("port") or s.port)
    s.shards = int(shards or env.get("OPENBOT_SHARDS") or file.get("shards") or s.shards)
    s.ray_address = (
        ray_address
        or env.get("OPENBOT_RAY_ADDRESS")
        or env.get("RAY_ADDRESS")  # Ray's own variable, as `ray` tools read it
        or file.get("ray_address")
    )
    s.placement = placement or env.get("OPENBOT_PLACEMENT") or file.get("placement") or s.placement
    s.group_commit = bool(file.get("group_commit", True))
    s.actor_prefix = env.get("OPENBOT_ACTOR_PREFIX") or file.get("actor_prefix") or s.actor_prefix
    cache = env.get("OPENBOT_CACHE_RECORDS") or file.get("cache_records")
    s.cache_records = int(cache) if cache else None
    s.models = models
    s.search = search
    if search:
        from actors.runtime.engine import check_search_config

        check_search_config(search, models)  # a bad [search] fails here, before Ray starts
    s.config_dir = str(Path(path).resolve().parent) if path else None
    return s


def admin_token(data_dir: Path) -> tuple[str, Path | None]:
    """`OPENBOT_ADMIN_TOKEN`, else the token in the data directory (created 0600 once)."""
    env = os.environ.get("OPENBOT_ADMIN_TOKEN")
    if env:
        return env, None
    path = data_dir / ADMIN_TOKEN_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as f:
                f.write("oba_" + secrets.token_urlsafe(32))
    return path.read_text().strip(), path


def tune_gc() -> None:
    """A gateway holds many long-lived objects per websocket client; CPython's full collections
    walk all of them and stalled the event loop for half a second with 1,000 clients (fanout
    benchmark). Freeze what start-up made and collect the oldest generation less often."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(max(young, 5_000), middle, 100)


def describe_placement(engine) -> str:
    """One line: where the directory and each shard run (node address and id)."""
    try:
        where = engine.where(timeout=10)
    except Exception as e:  # only a banner: never stop serving for it
        return f"placement unknown ({type(e).__name__})"
    nodes = {s["node"] for s in where["shards"]} | {where["directory"]["node"]}

    def at(w: dict) -> str:
        return f"{w['ip']}/{w['node'][:8]}"

    shards = ", ".join(f"{s['shard']}@{at(s)}" for s in where["shards"])
    return (
        f"cluster placement {where['placement']}: directory@{at(where['directory'])}; "
        f"shards {shards} ({len(nodes)} nodes)"
    )


LOCK_FILE = "serve.lock"
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def setup_logging(level: str) -> None:
    """The `openbot.*` loggers (access lines at info, failures at warning) to stderr."""
    logger = logging.getLogger("openbot")
    if not any(h.get_name() == "openbot" for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        handler.set_name("openbot")  # ours: a second call adds no second handler
        logger.addHandler(handler)
    logger.setLevel(level.upper())
    logger.propagate = False


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, before anything else is made: a busy port fails here."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise Unavailable(
            f"cannot listen on {host}:{port}: {e.strerror or e}", code="listen_failed"
        ) from e
    sock.set_inheritable(False)
    return sock


class DataDirLock:
    """One `openbot serve` per data directory (a second would wait on DuckDB's file locks, then
    fail): an exclusive lock on DATA_DIR/serve.lock, held while serving. What a failed start made
    in the directory (tokens, keys, the directory itself) is removed again by `undo`."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.before = set(os.listdir(data_dir)) if data_dir.exists() else None
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / LOCK_FILE
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            holder = os.read(self.fd, 32).decode(errors="replace").strip() or "?"
            os.close(self.fd)
            self.undo()
            raise Unavailable(
                f"data directory {data_dir} is in use by another openbot serve (pid {holder})",
                code="data_dir_in_use",
            ) from e
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def undo(self) -> None:
        """Remove what this start added to the data directory."""
        if self.before is None:
            shutil.rmtree(self.data_dir, ignore_errors=True)
            return
        for name in set(os.listdir(self.data_dir)) - self.before:
            target = self.data_dir / name
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)


def serve(settings: ServeSettings, *, log_level: str = "info") -> None:
    setup_logging(log_level)
    data_dir = settings.data_dir.resolve()
    sock = listen(settings.host, settings.port)
    # Gateways joining a cluster share its actors and their data directory on purpose.
    lock = DataDirLock(data_dir) if settings.ray_address is None else None
    engine = None
    # After the checks above, which must answer at once. actors first: it sets Ray's
    # environment (loopback, token auth) before ray is imported.
    import uvicorn

    from actors.runtime.engine import Engine, start_ray, stop_ray
    from actors.runtime.ray_env import TOKEN_FILE
    from gateway.app import create_app
    from storage.crypto import require_key_for_sealed_data

    try:
        require_key_for_sealed_data(data_dir)  # before Ray starts: fail fast, make no new key
        token, token_path = admin_token(data_dir)
        start_ray(
            settings.ray_address,
            tmp_dir=os.environ.get("RAY_TMPDIR"),
            token_file=data_dir / TOKEN_FILE,  # the embedded Ray's; unused when joining
            log_to_driver=True,
        )
        engine = Engine.start(
            data_dir,
            shards=settings.shards,
            group_commit=settings.group_commit,
            prefix=settings.actor_prefix,
            models_config=settings.models,
            config_dir=settings.config_dir,
            search_config=settings.search,
            placement=settings.placement,
            cache_records=settings.cache_records,
        )
        if settings.ray_address is not None:
            print(f"openbot: {describe_placement(engine)}", flush=True)
        app = create_app(engine, token)
    except BaseException:
        sock.close()
        if engine is not None and settings.ray_address is None:
            engine.stop()
        stop_ray()
        if lock is not None:
            lock.undo()
        raise
    tune_gc()
    where = f"in {token_path}" if token_path else "from OPENBOT_ADMIN_TOKEN"
    print(
        f"openbot: serving http://{settings.host}:{settings.port} "
        f"(data {data_dir}; admin token {where}; log level {log_level})",
        flush=True,
    )
    try:
        # The access log is gateway/metrics.py's (route templates and request ids), not
        # uvicorn's.
        options = UVICORN_HTTP | UVICORN_WS | proxy_options()
        config = uvicorn.Config(app, log_level=log_level, access_log=False, **options)
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        # A gateway that joined a cluster leaves the shared actors to the other gateways.
        if settings.ray_address is None:
            engine.stop()
        stop_ray()
