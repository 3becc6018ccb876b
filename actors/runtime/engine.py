"""The one place that starts or joins Ray and creates the engine's actors.

On one machine Ray is started small and quiet, bound to loopback and with Ray's token auth on
(actors/runtime/ray_env.py, docs/design.md §14): no dashboard, the token in the data directory,
every actor with `num_cpus=0` so that actors never wait for a CPU. With an address, it joins an
existing cluster.

All other code talks to actors through `Engine`, which names them and routes accounts to shards.
A gateway holds it as an `EnginePort` (actors/ports.py): typed ports to the directory, the
shards and the node hub, never an actor handle.

On a cluster (README "Running on a cluster") the actors are detached, so that they outlive the
gateway that happened to create them, and the shards are placed with Ray's scheduling options:
`spread` (the default on a cluster) reserves one small bundle per shard in a SPREAD placement
group, so Ray puts them one per node and, when a node dies, re-creates the lost bundles on the
nodes that are left (the shard follows if its data directory is reachable there: a shared or
re-attachable volume); `pinned` asks for a custom resource named like the actor
(`openbot-shard-0`, ..., `openbot-directory`), so a store only ever runs on a node started with
it (node-local disks: after a node failure the shard waits for that node to come back). Under
`spread` the directory runs on the head node (Ray's `node:__internal_head__` resource): the one
node whose loss stops the cluster anyway, since the GCS runs there. A restarted shard refuses to
start where its DuckDB file is missing rather than serve an empty shard.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

from actors.runtime.directory_proxy import RayDirectory
from actors.runtime.lane import LanedRayShard
from actors.runtime.node_hub_proxy import RayNodeHub
from actors.runtime.placement import shard_of
from actors.runtime.ray_env import TOKEN_FILE, loopback_only, use_token_file
from actors.runtime.shard_proxy import RayShard
from engine.errors import InvalidInput, Unavailable

NAMESPACE = "openbot"
PLACEMENTS = ("auto", "spread", "pinned", "local")
# What a shard reserves in the placement group: bundles cannot be empty, and this is small enough
# never to matter (the actors themselves take num_cpus=0).
SHARD_BUNDLE = {"CPU": 0.01}
HEAD_RESOURCE = "node:__internal_head__"  # every Ray head node offers 1 of it
_joined = False  # this process joined an existing cluster (start_ray with an address)


def resolve_placement(placement: str) -> str:
    """`auto`: `spread` when this process joined a cluster or Ray has more than one node, else
    `local` (Ray's default scheduling, as on a laptop)."""
    if placement not in PLACEMENTS:
        raise InvalidInput(f"placement must be one of {', '.join(PLACEMENTS)}", code="placement")
    if placement != "auto":
        return placement
    multi = sum(1 for n in ray.nodes() if n.get("Alive")) > 1
    return "spread" if _joined or multi else "local"


def actor_options(placement: str, name: str, group: Any = None, bundle: int = 0) -> dict:
    """Ray scheduling options for the actor `name` (a shard or the directory) under a placement
    mode; `group` is the shards' placement group (spread)."""
    if placement == "pinned":
        return {"resources": {name: 0.001}}
    if placement == "head":
        return {"resources": {HEAD_RESOURCE: 0.001}}
    if placement == "spread" and group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=bundle
            )
        }
    return {}


def _actor_exists(name: str) -> bool:
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def _shard_group(prefix: str, shards: int, lifetime: str | None, timeout: float) -> Any:
    """The shards' SPREAD placement group, found by name or created, and ready."""
    from ray.util import get_placement_group, placement_group

    name = f"{prefix}-shards"
    try:
        group = get_placement_group(name)
    except ValueError:
        bundles = [dict(SHARD_BUNDLE) for _ in range(shards)]
        group = placement_group(bundles, strategy="SPREAD", name=name, lifetime=lifetime)
    try:
        ray.get(group.ready(), timeout=timeout)
    except ray.exceptions.GetTimeoutError as e:
        raise Unavailable(
            f"cannot place {shards} shard bundles of {SHARD_BUNDLE} in {timeout:.0f} s: "
            "the cluster has no node with that much free CPU",
            code="placement",
        ) from e
    return group


def check_shard_files(data_dir: Path, shards: int) -> None:
    """Accounts map to shards by crc32 mod the shard count, so a data directory keeps the count
    it was made with: shard files beyond `shards` mean it was made with more."""
    extra = sorted(
        p.name
        for p in data_dir.glob("shard-*.duckdb")
        if p.stem.removeprefix("shard-").isdigit() and int(p.stem.removeprefix("shard-")) >= shards
    )
    if extra:
        raise InvalidInput(
            f"{data_dir} holds {', '.join(extra)}: it was made with more than {shards} shards "
            "(the shard count is fixed for a data directory)",
            code="shard_count",
        )


def _require_loopback_env() -> None:
    """The embedded Ray binds to loopback only if `actors.runtime.ray_env` ran before `ray` was
    imported; otherwise Ray swaps 127.0.0.1 for the host's address and listens on every
    interface. Refuse rather than start an exposed instance. Checked from what `ray_env` recorded
    of the environment Ray was imported with (`loopback_only`), not from Ray's private constants:
    those move between Ray releases."""
    if not loopback_only():
        raise Unavailable(
            "ray was imported before actors.runtime.ray_env: the embedded Ray would listen beyond "
            "loopback (import actors first)",
            code="ray_env",
        )


def start_ray(
    address: str | None = None,
    *,
    tmp_dir: str | None = None,
    runtime_env: dict | None = None,
    token_file: str | Path | None = None,
    log_to_driver: bool = False,
) -> None:
    """Start a local Ray (address None) or join `address`; a no-op if already connected.
    `runtime_env` (joining only) applies to every actor this process creates. The local Ray
    listens on 127.0.0.1 only and requires the token in `token_file` (default: one made in its
    temp dir), see actors/runtime/ray_env.py; joining uses the cluster's own settings.
    `log_to_driver` (`openbot serve`) shows the actors' log lines (failed turns, steps, jobs) in
    this process's output."""
    global _joined
    if ray.is_initialized():
        return
    if address is None:
        _require_loopback_env()
        tmp = tmp_dir or os.environ.get("RAY_TMPDIR") or tempfile.mkdtemp(prefix="openbot-ray-")
        # Ray's socket paths must stay short (AF_UNIX limit); keep the temp dir near the root.
        os.environ.setdefault("RAY_TMPDIR", tmp)
        Path(tmp).mkdir(parents=True, exist_ok=True)
        use_token_file(token_file or Path(tmp) / TOKEN_FILE)
        ray.init(
            namespace=NAMESPACE,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=tmp,
            object_store_memory=128 * 1024 * 1024,
            log_to_driver=log_to_driver,
            logging_level="WARNING",
            configure_logging=True,
        )
    else:
        ray.init(
            address=address,
            namespace=NAMESPACE,
            log_to_driver=log_to_driver,
            logging_level="WARNING",
            runtime_env=runtime_env,
        )
        _joined = True


def check_search_config(search: dict, models: dict) -> None:
    """The `[search]` table checked against the declared models, before any actor starts (a bad
    one fails `openbot serve` at once rather than every shard at start-up)."""
    from actors.models.embeddings import search_settings

    search_settings(search, models)


def ray_started() -> bool:
    """Whether this process is connected to Ray (then `start_ray` is a no-op)."""
    return ray.is_initialized()


def stop_ray() -> None:
    """Leave Ray (ending the local Ray this process started); a no-op when not connected."""
    if ray.is_initialized():
        ray.shutdown()


def start_local_cluster(
    nodes: int,
    *,
    tmp_dir: str,
    cpus_per_node: float = 1,
    object_store_mb: int = 80,
    node_resources: list[dict[str, float]] | None = None,
    fast_failure_detection: bool = True,
) -> Any:
    """A simulated multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`), bound to
    loopback, for tests and benchmarks; `start_ray(cluster.address)` then joins it. The nodes
    share this machine's cores, memory and filesystem. With `fast_failure_detection` the head
    declares a silent node dead after ~1.5 s instead of Ray's default ~30 s (health checks every
    0.5 s, 3 misses): the same knobs a real cluster has (RAY_health_check_* on the head)."""
    from ray.cluster_utils import Cluster

    _require_loopback_env()
    # Ray writes the cluster's address under $RAY_TMPDIR/ray; keep it out of the shared /tmp/ray.
    os.environ["RAY_TMPDIR"] = tmp_dir
    Path(tmp_dir, "ray").mkdir(parents=True, exist_ok=True)
    # Token auth as for the embedded instance; `start_ray(cluster.address)` in this process
    # (and any process given this RAY_AUTH_TOKEN_PATH) joins with it.
    use_token_file(Path(tmp_dir) / TOKEN_FILE)
    extra = node_resources or [{} for _ in range(nodes)]
    common = {
        "num_cpus": cpus_per_node,
        "object_store_memory": object_store_mb * 1024 * 1024,
        "node_ip_address": "127.0.0.1",
    }
    head = common | {"include_dashboard": False, "temp_dir": tmp_dir, "resources": extra[0]}
    if fast_failure_detection:
        head["_system_config"] = {
            "health_check_initial_delay_ms": 0,
            "health_check_period_ms": 500,
            "health_check_timeout_ms": 500,
            "health_check_failure_threshold": 3,
        }
    cluster = Cluster(initialize_head=True, head_node_args=head)
    for k in range(1, nodes):
        cluster.add_node(**common, resources=extra[k])
    cluster.wait_for_nodes()
    return cluster


def wait_for_cluster(nodes: int, timeout: float = 60.0) -> None:
    """Until `nodes` nodes are alive and the scheduler sees all their CPUs free: a node that
    has just joined is alive before its resources reach the scheduler, and a placement group
    made in between would leave it out."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        cpus = sum(n.get("Resources", {}).get("CPU", 0.0) for n in alive)
        free = ray.available_resources().get("CPU", 0.0)
        if len(alive) >= nodes and free >= cpus - 1e-6:
            return
        if time.monotonic() > deadline:
            raise Unavailable(
                f"{len(alive)} of {nodes} nodes alive, {free} of {cpus} CPUs seen after "
                f"{timeout:.0f} s",
                code="cluster_not_ready",
            )
        time.sleep(0.1)


class Engine:
    """The directory and shard actors, created or found by name: their handles (`directory`,
    `shards`: tests, benchmarks, this module) and the typed ports over them that a gateway
    holds (`EnginePort`: `directory_port`, `shard_ports`, `shard_port(account)`, `node_hub`).
    """

    def __init__(
        self,
        directory: Any,
        shards: list[Any],
        data_dir: Path | None = None,
        prefix: str = "openbot",
    ) -> None:
        self.directory = directory
        self.shards = shards
        self.data_dir = data_dir
        self.prefix = prefix  # names the actors found by name (the node hub, peers)
        self.directory_port = RayDirectory(f"{prefix}-directory", NAMESPACE, directory)
        self.shard_ports = [
            # A gateway's turn starts and event polls over the shard's lane where it can
            # (actors/runtime/lane.py); everything else over Ray.
            LanedRayShard(f"{prefix}-shard-{k}", NAMESPACE, handle)
            for k, handle in enumerate(shards)
        ]
        self.node_hub = RayNodeHub(prefix, NAMESPACE)

    def shard_index(self, account_id: str) -> int:
        return shard_of(account_id, len(self.shards))

    def shard_for(self, account_id: str) -> Any:
        """The shard actor's handle (tests, benchmarks); a gateway uses `shard_port`."""
        return self.shards[self.shard_index(account_id)]

    def shard_port(self, account_id: str) -> RayShard:
        return self.shard_ports[self.shard_index(account_id)]

    @classmethod
    def start(
        cls,
        data_dir: str | Path,
        *,
        shards: int = 2,
        group_commit: bool = True,
        prefix: str = "openbot",
        event_retain: int = 100_000,
        models_config: dict | None = None,
        config_dir: str | None = None,
        search_config: dict | None = None,  # the config's [search] table (SC-7)
        placement: str = "auto",
        detached: bool | None = None,
        placement_timeout: float = 60.0,
        cache_records: int | None = None,  # records each shard keeps loaded (residency)
    ) -> Engine:
        """Create the actors, or find them by name when another gateway already did.

        `placement` (see the module's docstring): `auto`, `spread`, `pinned` or `local`.
        `detached` (default: when this process joined a cluster) lets the actors outlive this
        process; then only `stop` ends them."""
        if shards < 1:
            raise InvalidInput("shards must be at least 1", code="shard_count")
        data_dir = str(Path(data_dir).resolve())
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        check_shard_files(Path(data_dir), shards)
        from storage.crypto import load_master_key, require_key_for_sealed_data

        require_key_for_sealed_data(Path(data_dir))
        load_master_key(Path(data_dir))  # created once here, before actors race for it
        mode = resolve_placement(placement)
        lifetime = "detached" if (_joined if detached is None else detached) else None
        names = [f"{prefix}-shard-{k}" for k in range(shards)]
        group = None
        if mode == "spread" and not all(_actor_exists(n) for n in names):
            group = _shard_group(prefix, shards, lifetime, placement_timeout)
        if mode == "pinned":
            offered = ray.cluster_resources()
            missing = [n for n in [f"{prefix}-directory", *names] if n not in offered]
            if missing and not all(_actor_exists(n) for n in missing):
                raise Unavailable(
                    f"placement 'pinned' needs nodes started with the resources {missing} "
                    "(ray start --resources='{\"" + missing[0] + "\": 1}')",
                    code="placement",
                )
        # Here, not at the top: the actors' implementation (storage, numpy, every feature) is
        # for the processes that host them, not for every gateway that imports the engine.
        from actors.runtime.hosting import DirectoryActor, ShardActor

        directory_name = f"{prefix}-directory"
        directory = DirectoryActor.options(
            name=directory_name,
            get_if_exists=True,
            lifetime=lifetime,
            # On the head under `spread`: its failure is the cluster's anyway (the GCS is there).
            **actor_options(
                {"pinned": "pinned", "spread": "head"}.get(mode, "local"), directory_name
            ),
        ).remote(data_dir)
        handles = [
            ShardActor.options(
                name=names[k],
                get_if_exists=True,
                lifetime=lifetime,
                **actor_options(mode, names[k], group, k % max(1, _bundles(group))),
            ).remote(
                data_dir,
                k,
                group_commit=group_commit,
                event_retain=event_retain,
                models_config=models_config or {},
                config_dir=config_dir,
                search=search_config or {},
                prefix=prefix,
                shard_count=shards,
                cache_records=cache_records,
            )
            for k in range(shards)
        ]
        ray.get([directory.ping.remote(), *[h.ping.remote() for h in handles]])
        engine = cls(directory, handles, Path(data_dir), prefix)
        engine.placement = mode
        engine.placement_group = group
        engine.models = frozenset(models_config or {})
        return engine

    placement: str = "local"
    placement_group: Any = None
    models: frozenset[str] | None = None  # the configured model names; None: not known here

    def where(self, timeout: float = 30.0) -> dict[str, Any]:
        """Where the actors run: {"directory": {...}, "shards": [{shard, node, ip, pid, ...}]}.
        `Unavailable` while an actor is down or restarting."""
        refs = [self.directory.where.remote(), *[s.where.remote() for s in self.shards]]
        try:
            directory, *shards = ray.get(refs, timeout=timeout)
        except (
            ray.exceptions.RayActorError,
            ray.exceptions.ActorUnavailableError,
            ray.exceptions.GetTimeoutError,
        ) as e:
            raise Unavailable(
                "an actor is down or restarting; try again", code="engine_unavailable"
            ) from e
        return {"placement": self.placement, "directory": directory, "shards": shards}

    async def backup(self, dest_dir: str | Path, *, with_key: bool = False) -> list[str]:
        """A consistent snapshot of every store into `dest_dir` (which must not exist yet), a
        data directory `openbot serve` can run on given the master key. The key is left out
        unless `with_key` (a copy of the data is then not a copy of the key). Events
        get a new epoch there. Each store is copied in one transaction of its own. The folder
        is 0700 and its files 0600, whatever the umask."""
        from storage.crypto import KEY_FILE, write_key_copy
        from storage.database import new_private_dir

        try:
            dest = new_private_dir(Path(dest_dir).resolve())
        except FileExistsError as e:
            raise InvalidInput(f"{dest_dir} already exists", code="backup_exists") from e
        except (OSError, ValueError) as e:  # ValueError: a NUL in the path
            raise InvalidInput(f"cannot create {dest_dir!r}: {e}", code="backup_dir") from e
        files = [await self.directory_port.backup(str(dest))]
        files += [await s.backup(str(dest)) for s in self.shard_ports]
        if with_key and self.data_dir is not None:
            files.append(str(write_key_copy(self.data_dir, dest / KEY_FILE)))
        return files

    def stop(self) -> None:
        """Close the stores cleanly and end the actors."""
        try:
            ray.get([h.close.remote() for h in self.shards], timeout=30)
        finally:
            for h in [*self.shards, self.directory]:
                ray.kill(h, no_restart=True)
            if self.placement == "spread":  # the group lives as long as the shards
                from ray.util import get_placement_group, remove_placement_group

                group = self.placement_group
                if group is None:
                    try:
                        group = get_placement_group(f"{self.prefix}-shards")
                    except ValueError:
                        group = None
                if group is not None:
                    remove_placement_group(group)


def _bundles(group: Any) -> int:
    return len(group.bundle_specs) if group is not None else 1
