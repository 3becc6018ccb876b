"""Running the server: settings from flags, environment and config file, the admin token, Ray,
the actors and uvicorn."""

from __future__ import annotations

import gc
import logging
import os
import secrets
import tomllib
from dataclasses import dataclass
from pathlib import Path

from engine.errors import InvalidInput

ADMIN_TOKEN_FILE = "admin.token"
log = logging.getLogger("openbot")


@dataclass
class ServeSettings:
    data_dir: Path = Path("./data")
    host: str = "127.0.0.1"
    port: int = 8765
    shards: int = 2
    ray_address: str | None = None
    placement: str = "auto"  # actors/runtime.py: auto, spread, pinned or local
    group_commit: bool = True
    actor_prefix: str = "openbot"
    models: dict | None = None  # the config's [models.*] tables (DESIGN §6)
    search: dict | None = None  # the config's [search] table: embedding_model, min_score (SC-7)
    config_dir: str | None = None


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
    s.models = models
    s.search = search
    if search:
        from actors.embeddings import search_settings

        search_settings(search, models)  # a bad [search] fails here, before Ray starts
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


def serve(settings: ServeSettings) -> None:
    # actors first: it sets Ray's environment (loopback, token auth) before ray is imported.
    from actors.ray_env import TOKEN_FILE
    from actors.runtime import Engine, start_ray

    import ray  # isort: skip
    import uvicorn

    from gateway.app import create_app
    from storage.crypto import require_key_for_sealed_data

    data_dir = settings.data_dir.resolve()
    require_key_for_sealed_data(data_dir)  # before Ray starts: fail fast, make no new key
    token, token_path = admin_token(data_dir)
    start_ray(
        settings.ray_address,
        tmp_dir=os.environ.get("RAY_TMPDIR"),
        token_file=data_dir / TOKEN_FILE,  # the embedded Ray's; unused when joining
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
    )
    if settings.ray_address is not None:
        print(f"openbot: {describe_placement(engine)}", flush=True)
    app = create_app(engine, token)
    tune_gc()
    where = f"in {token_path}" if token_path else "from OPENBOT_ADMIN_TOKEN"
    print(
        f"openbot: serving http://{settings.host}:{settings.port} "
        f"(data {data_dir}; admin token {where})",
        flush=True,
    )
    try:
        # Protocol-level pings notice dead websocket peers (DESIGN §8 heartbeats).
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_level="warning",
            ws_ping_interval=15.0,
            ws_ping_timeout=15.0,
        )
    finally:
        # A gateway that joined a cluster leaves the shared actors to the other gateways.
        if settings.ray_address is None:
            engine.stop()
        ray.shutdown()
