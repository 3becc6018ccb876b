"""`openbot`: the command line (docs/design.md §10). `openbot COMMAND --help` describes each
command.

openbot serve [--config FILE] [--data-dir DIR] [--host H] [--port P] [--shards N]
              [--ray-address ADDR] [--placement auto|spread|pinned|local] [--log-level L]
openbot admin org create --name N [--id ID] | org set ID KEY=VALUE…
openbot admin user create --name N --org ORG… [--id ID]
openbot admin bot create --name N --org ORG --owner USER [--id ID] [--model M] [--linked]
openbot admin bot update ID [--name N] [--model M] [--avatar URL]
openbot admin grant --bot B --user U --permission read|write
openbot admin channel create --org ORG --person U… --bot B… [--id ID]
openbot events [--url URL] [--token T] [--cursor C] [--count N]
openbot demo [--url URL [--admin-token T] | --port P] [--model NAME] [--config FILE]
openbot backup DIR (--url URL [--token T] | --data-dir DIR) [--with-key]
openbot export DIR [--url URL [--token T] | --data-dir DIR] [--account ID]
openbot import DIR [--data-dir DIR] [--shards N] [--join-org ORG…]
openbot import DIR --url URL [--token T] [--tokens-dir D] [--join-org ORG…]

`--url`, `--token` and `--data-dir` of `admin` may come before or after its subcommand. Failures
print one line on stderr and exit non-zero: 1 for a failed call or command, 2 for bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import msgspec

from engine.errors import InvalidInput, OpenBotError
from gateway.cli_parser import DEFAULT_URL, build_parser


class CliError(Exception):
    """A failure worth one line on stderr (exit 1), never a traceback."""


def _admin_token(given: str | None, data_dir: str | None) -> str:
    """The flag, else `OPENBOT_ADMIN_TOKEN`, else the token file in the data directory."""
    from gateway.server import ADMIN_TOKEN_FILE

    token = given or os.environ.get("OPENBOT_ADMIN_TOKEN")
    if not token:
        path = Path(data_dir or os.environ.get("OPENBOT_DATA_DIR") or "./data") / ADMIN_TOKEN_FILE
        if not path.exists():
            raise SystemExit(
                f"openbot: no admin token (set OPENBOT_ADMIN_TOKEN or --token; {path} is absent)"
            )
        token = path.read_text().strip()
    return token


def _admin_client(args: argparse.Namespace):
    import httpx

    token = _admin_token(args.token, args.data_dir)
    return httpx.Client(base_url=args.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def _demo(args: argparse.Namespace) -> int:
    from gateway.demo import DemoError, embedded_server, run_demo

    try:
        if args.url:
            if args.port:
                raise CliError("openbot demo: --port is for the embedded server; not with --url")
            token = _admin_token(args.admin_token, args.data_dir)
            result = asyncio.run(run_demo(args.url, token, model=args.model, timeout=args.timeout))
        else:
            print("openbot demo: starting an embedded server (local Ray, temporary data)…")
            with embedded_server(args.config, port=args.port or 0) as (url, token):
                result = asyncio.run(run_demo(url, token, model=args.model, timeout=args.timeout))
    except DemoError as e:
        print(f"openbot demo: {e}", file=sys.stderr)
        return 1
    if not result.ok:
        print("openbot demo: some bot steps failed (see above)", file=sys.stderr)
        return 1
    return 0


async def _events(args: argparse.Namespace) -> int:
    from gateway.client import EventClient, EventStreamClosed

    if not args.token:
        raise SystemExit("openbot events: give --token or set OPENBOT_TOKEN")
    seen = 0
    try:

        def status(text: str) -> None:
            print(f"openbot events: {text}", file=sys.stderr, flush=True)

        async with EventClient(
            args.url, args.token, cursor=args.cursor, on_status=status
        ) as client:
            async for frame in client:
                print(msgspec.json.encode(frame).decode(), flush=True)
                seen += 1
                if args.count is not None and seen >= args.count:
                    return 0
    except EventStreamClosed as e:
        print(f"openbot events: {e}", file=sys.stderr)
        return 1
    return 0


def _backup(args: argparse.Namespace) -> int:
    if args.url:
        with _admin_client(args) as client:
            body = {"dir": str(Path(args.dir).resolve()), "withKey": args.with_key}
            resp = client.post("/v1/admin/backup", json=body)
        return _answer(resp)
    if not args.data_dir:
        raise SystemExit("openbot backup: give --url (running server) or --data-dir (stopped)")
    from storage.event_log import backup_offline

    files = backup_offline(Path(args.data_dir), Path(args.dir), with_key=args.with_key)
    print(json.dumps({"dir": args.dir, "files": files}, indent=2))
    return 0


def _data_dir(given: str | None) -> Path:
    return Path(given or os.environ.get("OPENBOT_DATA_DIR") or "./data")


def _export(args: argparse.Namespace) -> int:
    """The account file tree (FS-1, FS-2) into DIR: from a running server's consistent
    snapshot (--url), else straight from a stopped server's data directory."""
    from storage.file_export import render_data_dir
    from storage.tree_files import write_tree

    if args.url:
        params = {"account": args.account} if args.account else None
        with _admin_client(args) as client:
            resp = client.get("/v1/admin/export", params=params, timeout=600)
        if not resp.is_success:
            return _answer(resp)
        files = {p: t.encode() for p, t in resp.json()["files"].items()}
    else:
        files = render_data_dir(_data_dir(args.data_dir), args.account)
    write_tree(Path(args.dir), files)
    accounts = sorted({p.split("/")[1] for p in files})
    print(json.dumps({"dir": args.dir, "accounts": accounts, "files": len(files)}, indent=2))
    return 0


def _import(args: argparse.Namespace) -> int:
    """A tree into a stopped server's data directory, or merged into a running one (--url)."""
    from storage.data_dir_io import write_new_tokens
    from storage.file_import import import_tree
    from storage.tree_files import read_tree

    if args.url:
        if args.data_dir:
            raise CliError("openbot import: --url or --data-dir, not both")
        try:
            files = {p: data.decode() for p, data in sorted(read_tree(Path(args.dir)).items())}
        except UnicodeDecodeError as e:
            raise InvalidInput(f"{args.dir}: a file of the tree is not UTF-8 ({e.reason})") from e
        with _admin_client(args) as client:
            body = {"files": files, "joinOrgs": list(args.join_org or ())}
            resp = client.post("/v1/admin/import", json=body, timeout=600)
        if not resp.is_success:
            return _answer(resp)
        answer = resp.json()
        # A new file of this import's own: a token exists in the clear only there, once.
        path = write_new_tokens(Path(args.tokens_dir), answer.pop("tokens", {}))
        print(json.dumps({**answer, "tokensFile": str(path)}, indent=2))
        _tokens_note(str(path))
        return 0
    result = import_tree(
        Path(args.dir), _data_dir(args.data_dir), shards=args.shards, join_orgs=args.join_org
    )
    print(msgspec.json.format(msgspec.json.encode(result), indent=2).decode())
    _tokens_note(str(result.tokens_file))
    return 0


def _tokens_note(path: str) -> None:
    print(
        f"openbot import: the new users' tokens are in {path} (0600, this "
        "import's only); hand them out, then delete the file",
        file=sys.stderr,
    )


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _admin(args: argparse.Namespace) -> int:
    what = (args.what, getattr(args, "action", None))
    if what == ("org", "create"):
        method, path, body = "POST", "/v1/admin/orgs", {"name": args.name, "id": args.id}
    elif what == ("org", "set"):
        settings = {}
        for pair in args.pairs:
            key, _, value = pair.partition("=")
            settings[key] = _parse_value(value)
        method, path, body = "PATCH", f"/v1/admin/orgs/{args.org_id}", {"settings": settings}
    elif what == ("user", "create"):
        method, path, body = (
            "POST",
            "/v1/admin/users",
            {"name": args.name, "orgs": args.org, "id": args.id},
        )
    elif what == ("bot", "create"):
        body = {
            "name": args.name,
            "org": args.org,
            "owner": args.owner,
            "id": args.id,
            "linked": args.linked,
            "model": args.model,
            "avatar": args.avatar,
        }
        method, path = "POST", "/v1/admin/bots"
    elif what == ("bot", "update"):
        body = {"name": args.name}
        for field in ("model", "avatar"):  # '' clears it
            value = getattr(args, field)
            if value is not None:
                body[field] = value or None
        body = {k: v for k, v in body.items() if k != "name" or v is not None}
        if not body:
            raise CliError("openbot admin bot update: give --name, --model or --avatar")
        method, path = "PATCH", f"/v1/admin/bots/{args.bot_id}"
        with _admin_client(args) as client:
            return _answer(client.request(method, path, json=body))
    elif args.what == "grant":
        method, path = "POST", "/v1/admin/grants"
        body = {"bot": args.bot, "user": args.user, "permission": args.permission}
    elif what == ("channel", "create"):
        method, path = "POST", "/v1/admin/channels"
        body = {"org": args.org, "people": args.person, "bots": args.bot, "id": args.id}
        body |= {"name": args.name, "mode": args.mode, "leader": args.leader}
    else:
        raise SystemExit("openbot admin: unknown command")
    body = {k: v for k, v in body.items() if v is not None}
    with _admin_client(args) as client:
        resp = client.request(method, path, json=body)
    return _answer(resp)


def _answer(resp) -> int:
    """A success's JSON on stdout (exit 0); an error as one line on stderr (exit 1)."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if resp.is_success and body is not None:
        print(json.dumps(body, indent=2))
        return 0
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        why = f"{error.get('message')} ({error.get('code')})"
    else:
        why = (resp.text or "").strip().splitlines()[0][:200] if resp.text else "no body"
    print(
        f"openbot: {resp.request.method} {resp.request.url.path}: HTTP {resp.status_code}: {why}",
        file=sys.stderr,
    )
    return 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import httpx

    try:
        return _run(args)
    except httpx.TransportError as e:
        url = getattr(args, "url", None) or DEFAULT_URL
        why = str(e) or type(e).__name__
        print(f"openbot: cannot reach {url} ({why}); is `openbot serve` running there?",
              file=sys.stderr)  # fmt: skip
        return 1
    except CliError as e:
        print(str(e), file=sys.stderr)
        return 1
    except InvalidInput as e:
        print(f"openbot: {e.message}", file=sys.stderr)
        return 2
    except OpenBotError as e:
        print(f"openbot: {e.message}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"openbot: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace) -> int:
    if args.command == "serve":
        if args.ray_address:  # before Ray is imported: see actors/runtime/ray_env.py
            os.environ["OPENBOT_RAY_ADDRESS"] = args.ray_address
        from gateway.server import load_settings, serve

        settings = load_settings(
            config=args.config,
            data_dir=args.data_dir,
            host=args.host,
            port=args.port,
            shards=args.shards,
            ray_address=args.ray_address,
            placement=args.placement,
        )
        serve(settings, log_level=args.log_level)
        return 0
    if args.command == "backup":
        return _backup(args)
    if args.command == "export":
        return _export(args)
    if args.command == "import":
        return _import(args)
    if args.command == "events":
        return asyncio.run(_events(args))
    if args.command == "demo":
        return _demo(args)
    return _admin(args)


if __name__ == "__main__":
    sys.exit(main())
