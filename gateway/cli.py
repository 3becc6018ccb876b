"""`openbot`: the command line (DESIGN §10). `openbot COMMAND --help` describes each command.

openbot serve [--config FILE] [--data-dir DIR] [--host H] [--port P] [--shards N]
              [--ray-address ADDR] [--placement auto|spread|pinned|local] [--log-level L]
openbot admin org create --name N [--id ID] | org set ID KEY=VALUE…
openbot admin user create --name N --org ORG… [--id ID]
openbot admin bot create --name N --org ORG --owner USER [--id ID] [--model M] [--linked]
openbot admin bot update ID [--name N] [--model M] [--avatar URL]
openbot admin grant --bot B --user U --permission read|write
openbot admin channel create --org ORG --person U… --bot B… [--id ID]
openbot events [--url URL] [--token T] [--cursor C] [--count N]
openbot demo [--url URL [--admin-token T]] [--model NAME] [--config FILE]
openbot backup DIR (--url URL [--token T] | --data-dir DIR)
openbot export DIR [--url URL [--token T] | --data-dir DIR] [--account ID]
openbot import DIR [--data-dir DIR] [--shards N]

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

DEFAULT_URL = os.environ.get("OPENBOT_URL", "http://127.0.0.1:8765")


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
            token = _admin_token(args.admin_token, args.data_dir)
            result = asyncio.run(run_demo(args.url, token, model=args.model, timeout=args.timeout))
        else:
            print("openbot demo: starting an embedded server (local Ray, temporary data)…")
            with embedded_server(args.config) as (url, token):
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
            resp = client.post("/v1/admin/backup", json={"dir": str(Path(args.dir).resolve())})
        return _answer(resp)
    if not args.data_dir:
        raise SystemExit("openbot backup: give --url (running server) or --data-dir (stopped)")
    from storage.event_log import backup_offline

    files = backup_offline(Path(args.data_dir), Path(args.dir))
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
            return _answer(resp)
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


class _Help(argparse.RawDescriptionHelpFormatter):
    """Shows each option's default (unless its help already says it); keeps line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        quiet = (None, False, argparse.SUPPRESS, [])
        if "default" not in text and action.default not in quiet and action.option_strings:
            text += " (default: %(default)s)"
        return text


def _connection(p: argparse.ArgumentParser, *, leaf: bool, token: str) -> None:
    """--url, --token and --data-dir, on a command and on each of its subcommands, so they may
    come before or after the subcommand. On subcommands they default to SUPPRESS: a value given
    earlier is not overwritten by the subcommand's default."""
    unset = argparse.SUPPRESS if leaf else None
    p.add_argument(
        "--url",
        default=argparse.SUPPRESS if leaf else DEFAULT_URL,
        help=f"the server (default {DEFAULT_URL}; or OPENBOT_URL)",
    )
    p.add_argument("--token", default=unset, help=token)
    p.add_argument(
        "--data-dir",
        default=unset,
        help="read admin.token from this data directory (default ./data)",
    )


def _parser(sub, name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=description or help, formatter_class=_Help)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="openbot",
        description="OpenBot Engine: run the server and talk to a running one.",
        formatter_class=_Help,
    )
    sub = p.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="`openbot COMMAND --help` for more"
    )

    s = _parser(sub, "serve", "run the server (embedded default: ./data, local Ray)")
    s.add_argument(
        "--config", help="a TOML config ([server], [models.*], [search]; or OPENBOT_CONFIG)"
    )
    s.add_argument("--data-dir", help="where the data live (default ./data; or OPENBOT_DATA_DIR)")
    s.add_argument("--host", help="the address to listen on (default 127.0.0.1; or OPENBOT_HOST)")
    s.add_argument("--port", type=int, help="the port to listen on (default 8765; or OPENBOT_PORT)")
    s.add_argument("--shards", type=int, help="shard actors (default 2; or OPENBOT_SHARDS)")
    s.add_argument(
        "--ray-address", help="join this Ray cluster instead of starting one (or RAY_ADDRESS)"
    )
    s.add_argument(
        "--placement",
        choices=["auto", "spread", "pinned", "local"],
        help="where shards run on a cluster (default auto: spread when joining one)",
    )
    s.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=os.environ.get("OPENBOT_LOG_LEVEL", "info"),
        help="log level; info logs one access line per request (or OPENBOT_LOG_LEVEL)",
    )

    e = _parser(sub, "events", "tail the event stream (JSON lines; status lines on stderr)")
    e.add_argument("--url", default=DEFAULT_URL, help="the server (or OPENBOT_URL)")
    e.add_argument(
        "--token", default=os.environ.get("OPENBOT_TOKEN"), help="a user token (or OPENBOT_TOKEN)"
    )
    e.add_argument("--cursor", help="resume after this cursor")
    e.add_argument("--count", type=int, help="stop after this many frames (default: never)")

    d = _parser(sub, "demo", "three scripted bots discuss and collaborate; shows the live events")
    d.add_argument("--url", help="join this running server (default: start an embedded one)")
    d.add_argument("--admin-token", "--token", dest="admin_token", help="with --url")
    d.add_argument("--data-dir", help="with --url: read admin.token from this data directory")
    d.add_argument("--model", default="demo-bots", help="the bots' model on the server")
    d.add_argument("--config", help="the embedded server's config (default: examples/openbot.toml)")
    d.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole demo")

    b = _parser(sub, "backup", "consistent snapshot into DIR (a new data directory)")
    b.add_argument("dir", help="the new directory (must not exist)")
    b.add_argument("--url", help="a running server (needs the admin token)")
    b.add_argument("--token", help="the admin token (or OPENBOT_ADMIN_TOKEN)")
    b.add_argument("--data-dir", help="a stopped server's data directory, copied directly")

    x = _parser(sub, "export", "the seed-002 file tree of accounts into DIR (new/empty)")
    x.add_argument("dir", help="the directory to write (new or empty)")
    x.add_argument("--url", help="a running server (needs the admin token)")
    x.add_argument("--token", help="the admin token (or OPENBOT_ADMIN_TOKEN)")
    x.add_argument("--data-dir", help="a stopped server's data directory (default ./data)")
    x.add_argument("--account", help="only this account (user id); default every account")

    i = _parser(sub, "import", "a new data directory from an exported file tree")
    i.add_argument("dir", help="the exported tree")
    i.add_argument("--data-dir", help="the new data directory (default ./data; must be empty)")
    i.add_argument(
        "--shards",
        type=int,
        default=int(os.environ.get("OPENBOT_SHARDS") or 2),
        help="the shard count `openbot serve` will use",
    )

    admin_token = "the admin token (or OPENBOT_ADMIN_TOKEN, or DATA_DIR/admin.token)"
    a = _parser(sub, "admin", "directory calls against a running server (admin token)")
    _connection(a, leaf=False, token=admin_token)
    asub = a.add_subparsers(dest="what", required=True, metavar="WHAT", help="what to change")

    def leaf(parent, name: str, help: str) -> argparse.ArgumentParser:
        q = _parser(parent, name, help)
        _connection(q, leaf=True, token=admin_token)
        return q

    org = _parser(asub, "org", "orgs").add_subparsers(
        dest="action", required=True, help="what to do"
    )
    oc = leaf(org, "create", "create an org")
    oc.add_argument("--name", required=True, help="its display name")
    oc.add_argument("--id", help="its id (default: a new o_… id)")
    os_ = leaf(org, "set", "change an org's settings")
    os_.add_argument("org_id", help="the org")
    os_.add_argument(
        "pairs",
        nargs="+",
        metavar="KEY=VALUE",
        help="settings: botMemory, botMemoryModel (a configured model), autoRecord; JSON values",
    )
    user = _parser(asub, "user", "users").add_subparsers(
        dest="action", required=True, help="what to do"
    )
    uc = leaf(user, "create", "create a user and print its token")
    uc.add_argument("--name", required=True, help="the person's name")
    uc.add_argument("--org", action="append", required=True, help="an org (repeat for more)")
    uc.add_argument("--id", help="its id (default: a new u_… id)")
    bot = _parser(asub, "bot", "bots").add_subparsers(
        dest="action", required=True, help="what to do"
    )
    bc = leaf(bot, "create", "create a bot")
    bc.add_argument("--name", required=True, help="the bot's name")
    bc.add_argument("--org", required=True, help="its org")
    bc.add_argument("--owner", required=True, help="the user who owns it")
    bc.add_argument("--id", help="its id (default: a new b_… id)")
    bc.add_argument("--model", help="a model named in the server's config (default: none)")
    bc.add_argument("--avatar", help="an image URL clients show")
    bc.add_argument("--linked", action="store_true", default=None, help="a linked bot")
    bu = leaf(bot, "update", "change a bot's name, model or avatar")
    bu.add_argument("bot_id", help="the bot")
    bu.add_argument("--name", help="a new name")
    bu.add_argument("--model", help="a model named in the server's config ('' for none)")
    bu.add_argument("--avatar", help="an image URL ('' for none)")
    g = leaf(asub, "grant", "let a user read or write a bot's memory")
    g.add_argument("--bot", required=True, help="the bot")
    g.add_argument("--user", required=True, help="the user")
    g.add_argument(
        "--permission", choices=["read", "write"], required=True, help="what they may do"
    )
    ch = _parser(asub, "channel", "channels (groups)").add_subparsers(
        dest="action", required=True, help="what to do"
    )
    cc = leaf(ch, "create", "create a channel group")
    cc.add_argument("--org", required=True, help="its org")
    cc.add_argument("--person", action="append", default=[], help="a member (repeat for more)")
    cc.add_argument("--bot", action="append", default=[], help="a bot (repeat; at most 8)")
    cc.add_argument("--id", help="its id (default: a new c_… id)")
    cc.add_argument("--name", help="its name")
    cc.add_argument(
        "--mode",
        choices=["discussion", "delivery"],
        help="delivery needs --leader (default discussion)",
    )
    cc.add_argument("--leader", help="the leading bot of a delivery group")
    return p


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
        if args.ray_address:  # before Ray is imported: see actors/ray_env.py
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
