"""`GET /v1/admin/export[?account=ID]`: the account file tree of a running server (FS-1, FS-2);
`POST /v1/admin/import`: a tree merged into it (FS-3, storage/tree_merge.py).

The tree is read from a consistent snapshot (`Engine.backup`, FS-4) taken into a scratch
directory beside the data directory (a cluster shares it; the shards write there), rendered off
the event loop, and removed. The answer is `{"files": {path: text}}` (every file is UTF-8);
`openbot export DIR --url …` writes it the way an offline export does.

An import takes the same `{"files": {path: text}}` (`openbot import DIR --url …` sends it),
merges it into a scratch copy of such a snapshot exactly as an offline import would (`id_clash`
when an id is taken, an org joined only when `joinOrgs` names it, every text sealed again under
the server's keys) and has each shard store
the rows that added, the directory last. The answer is the import's summary with the new users'
tokens (`tokens`, user → token: shown once, never stored in the clear).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from starlette.requests import Request
from starlette.responses import Response

from actors.ports import EnginePort
from engine import file_tree as ft
from engine.directory import check_id
from gateway import wire
from gateway.auth import Auth
from gateway.json_response import json, read_body
from storage.file_export import render_data_dir
from storage.tree_merge import Merged, merge_rows


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

    async def import_tree(self, request: Request) -> Response:
        await self.auth.admin(request)
        body = wire.decode(await read_body(request), wire.TreeImport)
        files = {path: text.encode() for path, text in body.files.items()}
        snapshots = await asyncio.to_thread(ft.parse, files)  # invalid_tree before any copy
        merged = await self._merge(snapshots, body.joinOrgs)
        self.auth.directory_changed()
        r = merged.result
        answer = {
            "accounts": r.accounts,
            "records": r.records,
            "projects": r.projects,
            "skippedReceipts": r.skipped_receipts,
            "skippedEntries": r.skipped_entries,
            "skippedRequests": r.skipped_requests,
            "tokens": merged.tokens,
        }
        return json(answer, 201)

    async def _merge(self, snapshots: list[ft.AccountSnapshot], join_orgs: list[str]) -> Merged:
        scratch = tempfile.mkdtemp(prefix=".import-", dir=self.engine.data_dir)
        try:
            before, after = Path(scratch) / "before", Path(scratch) / "after"
            await self.engine.backup(before, with_key=True)  # scratch, removed below
            merged = await asyncio.to_thread(merge_rows, snapshots, before, after, join_orgs)
            shards = self.engine.shard_ports
            for index, (rows, removed) in sorted(merged.shards.items()):
                await shards[index].import_rows(rows, removed)
            await self.engine.directory_port.import_records(merged.directory)  # commit point
            return merged
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
