"""`GET /v1/admin/export[?account=ID]`: the account file tree of a running server (FS-1, FS-2).

The tree is read from a consistent snapshot (`Engine.backup`, FS-4) taken into a scratch
directory beside the data directory (a cluster shares it; the shards write there), rendered off
the event loop, and removed. The answer is `{"files": {path: text}}` (every file is UTF-8);
`openbot export DIR --url …` writes it the way an offline export does.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response

from actors.ports import EnginePort
from engine.directory import check_id
from gateway.auth import Auth
from gateway.json_response import json
from storage.file_export import render_data_dir


class FileExportApi:
    def __init__(self, engine: EnginePort, auth: Auth) -> None:
        self.engine = engine
        self.auth = auth

    async def export(self, request: Request) -> Response:
        await self.auth.admin(request)
        account = request.query_params.get("account") or None
        if account is not None:
            check_id(account, "account")
        scratch = tempfile.mkdtemp(prefix=".export-", dir=self.engine.data_dir)
        try:
            snapshot = Path(scratch) / "snapshot"
            await self.engine.backup(snapshot, with_key=True)  # scratch, removed below
            files = await asyncio.to_thread(render_data_dir, snapshot, account)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return json({"files": {p: data.decode() for p, data in sorted(files.items())}})
