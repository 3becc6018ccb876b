"""The directory actor: orgs, users and tokens, bots and grants, channels, chats.

Built from its parts, each over the one set of records (records.py): the reads (reads.py), the
chats (chats.py) and the other writes (admin.py). Admin routes change it; every request reads
it (through the gateway's short cache) to learn who is asking and what they may use. A write
to a record gateways may hold is answered once every live gateway has applied it
(actors/access_watch.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from actors.directory.admin import DirectoryAdmin
from actors.directory.chats import ChatRegistry
from actors.directory.reads import DirectoryReads
from actors.directory.records import DirectoryRecords
from actors.facade import answered_by
from actors.ports import DirectoryPort


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class DirectoryService:
    def __init__(
        self,
        data_dir: str | Path,
        *,
        clock: Callable[[], int] = _now_ms,
        db_path: str | None = None,
    ) -> None:
        self.records = records = DirectoryRecords(data_dir, clock=clock, db_path=db_path)
        self.store = records.store
        self.reads = DirectoryReads(records)
        self.chat_registry = ChatRegistry(records)
        self.admin = DirectoryAdmin(records)

    async def backup(self, dest_dir: str) -> str:
        dest = Path(dest_dir) / "directory.duckdb"
        await self.store.db.snapshot(dest)
        return str(dest)

    async def ping(self) -> str:
        return "directory"


answered_by(
    DirectoryService,
    {
        "reads": "authenticate get_bot find_bot get_org get_chat chat_context get_user"
        " get_channel watch_access unwatch_access authenticate_at bot_at chat_context_at list_chats"
        " list_user_bots list_user_channels list_records",
        "chat_registry": "create_chat agent_chat register_chats delivery_chat review_chat"
        " group_chat set_chat_project:set_project",
        "admin": "create_org patch_org create_user create_bot patch_bot grant create_channel"
        " set_mode revoke_grant share_bot unshare_bot new_token update_rules create_member"
        " archive_bot pause_auto_record register_project project_owner workspace_people",
        "records": "import_records",
    },
    port=DirectoryPort,
)
