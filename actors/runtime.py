"""The one place that starts or joins Ray and creates the engine's actors.

On one machine Ray is started small and quiet and bound to loopback (see STACK-NOTES): no
dashboard, auth off for the embedded instance, logs under the data directory, every actor with
`num_cpus=0` so that actors never wait for a CPU. With an address, it joins an existing cluster.

All other code talks to actors through `Engine`, which names them and routes accounts to shards.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import ray

from actors.directory import DirectoryService
from actors.peers import remote
from actors.placement import shard_of
from actors.shard import ShardService
from engine.errors import InvalidInput

NAMESPACE = "openbot"
DirectoryActor = ray.remote(num_cpus=0, max_restarts=-1)(DirectoryService)
ShardActor = ray.remote(num_cpus=0, max_restarts=-1)(ShardService)


def start_ray(address: str | None = None, *, tmp_dir: str | None = None) -> None:
    """Start a local Ray (address None) or join `address`; a no-op if already connected."""
    if ray.is_initialized():
        return
    if address is None:
        tmp = tmp_dir or os.environ.get("RAY_TMPDIR") or tempfile.mkdtemp(prefix="openbot-ray-")
        # Ray's socket paths must stay short (AF_UNIX limit); keep the temp dir near the root.
        os.environ.setdefault("RAY_TMPDIR", tmp)
        ray.init(
            namespace=NAMESPACE,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _temp_dir=tmp,
            object_store_memory=128 * 1024 * 1024,
            log_to_driver=False,
            logging_level="WARNING",
            configure_logging=True,
        )
    else:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level="WARNING")


class Engine:
    """Handles to the directory and shard actors, created or found by name."""

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

    def shard_index(self, account_id: str) -> int:
        return shard_of(account_id, len(self.shards))

    def shard_for(self, account_id: str) -> Any:
        return self.shards[self.shard_index(account_id)]

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
    ) -> Engine:
        data_dir = str(Path(data_dir).resolve())
        Path(data_dir).mkdir(parents=True, exist_ok=True)
        from storage.crypto import load_master_key

        load_master_key(Path(data_dir))  # created once here, before actors race for it
        directory = DirectoryActor.options(name=f"{prefix}-directory", get_if_exists=True).remote(
            data_dir
        )
        handles = [
            ShardActor.options(name=f"{prefix}-shard-{k}", get_if_exists=True).remote(
                data_dir,
                k,
                group_commit=group_commit,
                event_retain=event_retain,
                models_config=models_config or {},
                config_dir=config_dir,
                prefix=prefix,
                shard_count=shards,
            )
            for k in range(shards)
        ]
        ray.get([directory.ping.remote(), *[h.ping.remote() for h in handles]])
        return cls(directory, handles, Path(data_dir), prefix)

    async def backup(self, dest_dir: str | Path) -> list[str]:
        """A consistent snapshot of every store into `dest_dir` (which must not exist yet),
        plus the master key file, so that the copy is a data directory `openbot serve` can run
        on. Events get a new epoch there. Each store is copied in one transaction of its own."""
        import shutil

        from storage.crypto import KEY_FILE

        dest = Path(dest_dir).resolve()
        try:
            dest.mkdir(parents=True)
        except FileExistsError as e:
            raise InvalidInput(f"{dest} already exists", code="backup_exists") from e
        files = [await call(self.directory.backup, str(dest))]
        files += [await call(s.backup, str(dest)) for s in self.shards]
        key = Path(self.data_dir or ".") / KEY_FILE
        if self.data_dir is not None and key.exists():
            shutil.copy2(key, dest / KEY_FILE)
            files.append(str(dest / KEY_FILE))
        return files

    def stop(self) -> None:
        """Close the stores cleanly and end the actors."""
        try:
            ray.get([h.close.remote() for h in self.shards], timeout=30)
        finally:
            for h in [*self.shards, self.directory]:
                ray.kill(h, no_restart=True)


async def call(method: Any, *args: Any, **kwargs: Any) -> Any:
    """Await an actor method; the engine's own errors come back as themselves, Ray's failures
    as `Unavailable`. Every gateway call to an actor goes through here."""
    return await remote(method, *args, **kwargs)
