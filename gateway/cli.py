"""`openbot`: the command line (DESIGN §10).

openbot serve [--config FILE] [--data-dir DIR] [--host H] [--port P] [--shards N]
              [--ray-address ADDR] [--placement auto|spread|pinned|local]
openbot admin org create --name N [--id ID] | org set ID KEY=VALUE…
openbot admin user create --name N --org ORG… [--id ID]
openbot admin bot create --name N --org ORG --owner USER [--id ID] [--linked]
openbot admin grant --bot B --user U --permission read|write
openbot admin channel create --org ORG --person U… --bot B… [--id ID]
openbot events [--url URL] [--token T] [--cursor C] [--count N]
openbot demo [--url URL [--admin-token T]] [--model NAME] [--config FILE]
openbot backup DIR (--url URL [--token T] | --data-dir DIR) [--with-key]
openbot export DIR [--url URL [--token T] | --data-dir DIR] [--account ID]
openbot import DIR [--data-dir DIR] [--shards N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

import msgspec

from engine.errors import OpenBotError


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
            token = _admin_token(args.admin_token, args.data_dir)
            asyncio.run(run_demo(args.url, token, model=args.model, timeout=args.timeout))
        else:
            print("openbot demo: starting an embedded server (local Ray, temporary data)…")
            with embedded_server(args.config) as (url, token):
                asyncio.run(run_demo(url, token, model=args.model, timeout=args.timeout))
    except DemoError as e:
        print(f"openbot demo: {e}", file=sys.stderr)
        return 1
    return 0


async def _events(args: argparse.Namespace) -> int:
    from gateway.client import EventClient, EventStreamClosed

    if not args.token:
        raise SystemExit("openbot events: give --token or set OPENBOT_TOKEN")
    seen = 0
    try:
        async with EventClient(args.url, args.token, cursor=args.cursor) as client:
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
        print(json.dumps(resp.json(), indent=2))
        return 0 if resp.is_success else 1
    if not args.data_dir:
        raise SystemExit("openbot backup: give --url (running server) or --data-dir (stopped)")
    from storage.event_log import backup_offline

    files = backup_offline(Path(args.data_dir), Path(args.dir), with_key=args.with_key)
    print(json.dumps({"dir": args.dir, "files": files}, indent=2))
    return 0


def _data_dir(given: str | None) -> Path:
    return Path(given or os.environ.get("OPENBOT_DATA_DIR") or "./data")


def _export(args: argparse.Namespace) -> int:
    """The seed-002 file tree (FS-1, FS-2) into DIR: from a running server's consistent
    snapshot (--url), else straight from a stopped server's data directory."""
    from storage.file_export import render_data_dir, write_tree

    if args.url:
        params = {"account": args.account} if args.account else None
        with _admin_client(args) as client:
            resp = client.get("/v1/admin/export", params=params, timeout=600)
        if not resp.is_success:
            print(json.dumps(resp.json(), indent=2), file=sys.stderr)
            return 1
        files = {p: t.encode() for p, t in resp.json()["files"].items()}
    else:
        files = render_data_dir(_data_dir(args.data_dir), args.account)
    write_tree(Path(args.dir), files)
    accounts = sorted({p.split("/")[1] for p in files})
    print(json.dumps({"dir": args.dir, "accounts": accounts, "files": len(files)}, indent=2))
    return 0


def _import(args: argparse.Namespace) -> int:
    from storage.file_export import import_tree

    result = import_tree(Path(args.dir), _data_dir(args.data_dir), shards=args.shards)
    print(msgspec.json.format(msgspec.json.encode(result), indent=2).decode())
    return 0


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
        }
        method, path = "POST", "/v1/admin/bots"
    elif args.what == "grant":
        method, path = "POST", "/v1/admin/grants"
        body = {"bot": args.bot, "user": args.user, "permission": args.permission}
    elif what == ("channel", "create"):
        method, path = "POST", "/v1/admin/channels"
        body = {"org": args.org, "people": args.person, "bots": args.bot, "id": args.id}
    else:
        raise SystemExit("openbot admin: unknown command")
    body = {k: v for k, v in body.items() if v is not None}
    with _admin_client(args) as client:
        resp = client.request(method, path, json=body)
    print(json.dumps(resp.json(), indent=2))
    return 0 if resp.is_success else 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="openbot", description="OpenBot Engine")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the server (embedded default: ./data, local Ray)")
    s.add_argument("--config")
    s.add_argument("--data-dir")
    s.add_argument("--host")
    s.add_argument("--port", type=int)
    s.add_argument("--shards", type=int)
    s.add_argument(
        "--ray-address", help="join this Ray cluster instead of starting one (or RAY_ADDRESS)"
    )
    s.add_argument(
        "--placement",
        choices=["auto", "spread", "pinned", "local"],
        help="where shards run on a cluster (default auto: spread when joining one)",
    )

    e = sub.add_parser("events", help="tail the event stream (JSON lines)")
    e.add_argument("--url", default=os.environ.get("OPENBOT_URL", "http://127.0.0.1:8765"))
    e.add_argument("--token", default=os.environ.get("OPENBOT_TOKEN"), help="a user token")
    e.add_argument("--cursor", help="resume after this cursor")
    e.add_argument("--count", type=int, help="stop after this many frames")

    d = sub.add_parser(
        "demo", help="three scripted bots discuss and collaborate; shows the live events"
    )
    d.add_argument("--url", help="join this running server (default: start an embedded one)")
    d.add_argument("--admin-token", "--token", dest="admin_token", help="with --url")
    d.add_argument("--data-dir", help="with --url: read admin.token from this data directory")
    d.add_argument("--model", default="demo-bots", help="the bots' model on the server")
    d.add_argument("--config", help="the embedded server's config (default: examples/openbot.toml)")
    d.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole demo")

    b = sub.add_parser("backup", help="consistent snapshot into DIR (a new data directory)")
    b.add_argument("dir")
    b.add_argument("--url", help="a running server (needs the admin token)")
    b.add_argument("--token")
    b.add_argument("--data-dir", help="a stopped server's data directory, copied directly")
    b.add_argument(
        "--with-key",
        action="store_true",
        help="copy the master key into DIR too (default: left out; restore with the key given)",
    )

    x = sub.add_parser("export", help="the seed-002 file tree of accounts into DIR (new/empty)")
    x.add_argument("dir")
    x.add_argument("--url", help="a running server (needs the admin token)")
    x.add_argument("--token")
    x.add_argument("--data-dir", help="a stopped server's data directory (default ./data)")
    x.add_argument("--account", help="only this account (user id); default every account")

    i = sub.add_parser("import", help="a new data directory from an exported file tree")
    i.add_argument("dir")
    i.add_argument("--data-dir", help="the new data directory (default ./data; must be empty)")
    i.add_argument(
        "--shards",
        type=int,
        default=int(os.environ.get("OPENBOT_SHARDS") or 2),
        help="the shard count `openbot serve` will use (default 2)",
    )

    a = sub.add_parser("admin", help="directory calls against a running server")
    a.add_argument("--url", default=os.environ.get("OPENBOT_URL", "http://127.0.0.1:8765"))
    a.add_argument("--token")
    a.add_argument("--data-dir")
    asub = a.add_subparsers(dest="what", required=True)
    org = asub.add_parser("org").add_subparsers(dest="action", required=True)
    oc = org.add_parser("create")
    oc.add_argument("--name", required=True)
    oc.add_argument("--id")
    os_ = org.add_parser("set")
    os_.add_argument("org_id")
    os_.add_argument("pairs", nargs="+", metavar="KEY=VALUE")
    user = asub.add_parser("user").add_subparsers(dest="action", required=True)
    uc = user.add_parser("create")
    uc.add_argument("--name", required=True)
    uc.add_argument("--org", action="append", required=True)
    uc.add_argument("--id")
    bot = asub.add_parser("bot").add_subparsers(dest="action", required=True)
    bc = bot.add_parser("create")
    bc.add_argument("--name", required=True)
    bc.add_argument("--org", required=True)
    bc.add_argument("--owner", required=True)
    bc.add_argument("--id")
    bc.add_argument("--linked", action="store_true", default=None)
    g = asub.add_parser("grant")
    g.add_argument("--bot", required=True)
    g.add_argument("--user", required=True)
    g.add_argument("--permission", choices=["read", "write"], required=True)
    ch = asub.add_parser("channel").add_subparsers(dest="action", required=True)
    cc = ch.add_parser("create")
    cc.add_argument("--org", required=True)
    cc.add_argument("--person", action="append", default=[])
    cc.add_argument("--bot", action="append", default=[])
    cc.add_argument("--id")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            if args.ray_address:  # before Ray is imported: see actors/ray_env.py
                os.environ["OPENBOT_RAY_ADDRESS"] = args.ray_address
            from gateway.server import load_settings, serve

            serve(
                load_settings(
                    config=args.config,
                    data_dir=args.data_dir,
                    host=args.host,
                    port=args.port,
                    shards=args.shards,
                    ray_address=args.ray_address,
                    placement=args.placement,
                )
            )
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
    except OpenBotError as e:
        print(f"openbot: {e.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
