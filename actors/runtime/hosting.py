"""The shard and directory services as Ray hosts them: each actor checks where it starts before
opening its DuckDB file (`guard_store`) and can say where it runs (`where`).

Imported only where actors are created (`Engine.start`) and in the actor processes: it pulls in
the services' whole implementation, which a gateway does not need.
"""

from __future__ import annotations

import fcntl
import gc
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import ray

from actors.contracts import (
    PACKED_WRITES,
    LaneAddress,
    PackedCall,
    PollCall,
    StepCall,
    StepOutcome,
    TurnCall,
    TurnResult,
)
from actors.directory import DirectoryService
from actors.runtime.lane import LaneServer, this_node
from actors.shard.service import ShardService
from engine.chat_records import Turn
from engine.errors import InvalidInput, StorageError

LOCK_WAIT = 60.0  # seconds a restarted store waits for a dying process to let go of its file


def _reconstructed() -> bool:
    # Ray's property reads its own deprecated `actor_id` and warns on every actor start; the
    # answer is right, the warning is Ray's to itself and would be the first line `serve` prints.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def _where() -> dict[str, Any]:
    ctx = ray.get_runtime_context()
    return {
        "node": ctx.get_node_id(),
        "ip": ray.util.get_node_ip_address(),
        "pid": os.getpid(),
        "restarted": _reconstructed(),
        "gc_frozen": gc.get_freeze_count(),  # objects start-up made, kept out of collections
    }


def tune_gc() -> None:
    """An actor process holds ~100k objects once started (Ray, DuckDB, numpy, the services);
    each full collection walked them all, seen taking 88 ms in a shard under load, and a
    collaboration hop or a turn that met one waited as long. Freeze what start-up made and
    collect the oldest generation less often (as `openbot serve` does for its gateway)."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(max(young, 5_000), middle, 100)


def guard_store(
    data_dir: Path, file: Path, *, restarted: bool, needs_key: bool, lock_wait: float = LOCK_WAIT
) -> None:
    """Checks before an actor opens its DuckDB file, so that a store never silently starts over
    on a node where its data are not: a restarted actor whose file is missing (its data directory
    is not reachable on this node), or a shard on a node without the master key (it would make a
    key of its own), fails to start with the reason instead. Waits while another process (the
    previous incarnation, still dying) holds the file's lock."""
    from storage.crypto import has_master_key, key_file

    where = ray.util.get_node_ip_address() if ray.is_initialized() else "this node"
    if restarted and not file.exists():
        raise StorageError(
            f"{file} is missing on {where}: this store was restarted on a node where its data "
            "directory is not reachable (put it on a volume that follows the actor, or use "
            "placement 'pinned'); refusing to start empty",
            code="data_dir_unreachable",
        )
    if needs_key and not has_master_key(data_dir):
        raise StorageError(
            f"no master key on {where} ({key_file(data_dir)} is missing and OPENBOT_MASTER_KEY "
            "is unset): share the data directory or give every node the key",
            code="data_dir_unreachable",
        )
    if not file.exists():
        return
    deadline = time.monotonic() + lock_wait
    while True:
        # DuckDB holds an fcntl write lock on the whole file while it has it open for writing.
        fd = os.open(file, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return  # closing the descriptor below drops the probe's lock
        except OSError:
            if time.monotonic() > deadline:
                raise StorageError(
                    f"{file} is still locked by another process after {lock_wait:.0f} s",
                    code="store_locked",
                ) from None
        finally:
            os.close(fd)
        time.sleep(0.2)


class PlacedShardService(ShardService):
    """The shard as Ray runs it: guarded start (see `guard_store`), `where`, and its lane."""

    def __init__(self, data_dir: str | Path, index: int, **kwargs: Any) -> None:
        file = Path(kwargs.get("db_path") or Path(data_dir) / f"shard-{index}.duckdb")
        guard_store(Path(data_dir), file, restarted=_reconstructed(), needs_key=True)
        super().__init__(data_dir, index, **kwargs)
        self._lane: LaneServer | None = None
        tune_gc()

    def where(self) -> dict[str, Any]:
        """The node and process this shard runs in (tests, benchmarks, the serve banner)."""
        return _where() | {"shard": self.index}

    async def lane_address(self) -> LaneAddress | None:
        """Where sibling shards on this node ask for steps (actors/runtime/lane.py); opened on
        the first ask, on this actor's event loop."""
        if self._lane is None:
            self._lane = LaneServer(this_node(), self)
            self.kernel.on_close.append(self._lane.close)
        return await self._lane.open()

    # What the lane asks (actors/runtime/lane.py `LaneHost`): the calls it carries.
    async def lane_step(self, call: StepCall) -> StepOutcome:
        return await self.run_step(call.step, call.mirror, call.learn_upto)

    async def lane_poll(self, call: PollCall) -> bytes:
        return await self.events_packed(call.since, call.limit, call.wait, call.follower)

    async def lane_turn(self, call: TurnCall) -> Turn | TurnResult:
        return await self.start_turn(call.start, call.wait)

    async def lane_packed(self, call: PackedCall) -> bytes:
        if call.method not in PACKED_WRITES:
            raise InvalidInput(f"{call.method!r} is not a lane's call", code="invalid_body")
        return await getattr(self, call.method)(call.call)


class PlacedDirectoryService(DirectoryService):
    def __init__(self, data_dir: str | Path, **kwargs: Any) -> None:
        file = Path(kwargs.get("db_path") or Path(data_dir) / "directory.duckdb")
        guard_store(Path(data_dir), file, restarted=_reconstructed(), needs_key=False)
        super().__init__(data_dir, **kwargs)
        tune_gc()

    def where(self) -> dict[str, Any]:
        return _where()


# No task events: Ray's GCS keeps up to 100,000 of them (what the dashboard shows), which grew
# its memory by ~25 MB a minute under load (benchmarks/soak.py); nothing here reads them.
DirectoryActor = ray.remote(num_cpus=0, max_restarts=-1, enable_task_events=False)(
    PlacedDirectoryService
)
ShardActor = ray.remote(num_cpus=0, max_restarts=-1, enable_task_events=False)(PlacedShardService)


class _QuietPlacementWarning(logging.Filter):
    """Ray warns that a restartable detached actor in a placement group dies with the group;
    that is the intent here (the group lives as long as the shards)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "restartable detached actor with a placement group" not in record.getMessage()


logging.getLogger("ray.actor").addFilter(_QuietPlacementWarning())
