"""The argument parser of `openbot` (gateway/cli.py runs the commands): every command and option
with a description, and its default where it has one."""

from __future__ import annotations

import argparse
import os

DEFAULT_URL = os.environ.get("OPENBOT_URL", "http://127.0.0.1:8765")


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
        type=str.lower,
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
    d.add_argument(
        "--port", type=int, help="the embedded server's port on 127.0.0.1 (default: a free one)"
    )
    d.add_argument("--timeout", type=float, default=120.0, help="seconds for the whole demo")

    b = _parser(sub, "backup", "consistent snapshot into DIR (a new data directory)")
    b.add_argument("dir", help="the new directory (must not exist)")
    b.add_argument("--url", help="a running server (needs the admin token)")
    b.add_argument("--token", help="the admin token (or OPENBOT_ADMIN_TOKEN)")
    b.add_argument("--data-dir", help="a stopped server's data directory, copied directly")
    b.add_argument(
        "--with-key",
        action="store_true",
        help="copy the master key into DIR too (default: left out; restore with the key given)",
    )

    x = _parser(sub, "export", "accounts' memory, projects and chats as files in DIR (new/empty)")
    x.add_argument("dir", help="the directory to write (new or empty)")
    x.add_argument("--url", help="a running server (needs the admin token)")
    x.add_argument("--token", help="the admin token (or OPENBOT_ADMIN_TOKEN)")
    x.add_argument("--data-dir", help="a stopped server's data directory (default ./data)")
    x.add_argument("--account", help="only this account (user id); default every account")

    i = _parser(
        sub, "import", "an exported file tree into a data directory, or into a running server"
    )
    i.add_argument("dir", help="the exported tree")
    i.add_argument(
        "--url",
        help="merge into this running server (POST /v1/admin/import; needs the admin token)",
    )
    i.add_argument("--token", help="the admin token with --url (or OPENBOT_ADMIN_TOKEN)")
    i.add_argument(
        "--tokens-dir",
        default=".",
        help="with --url: where the new file (0600) of the new users' tokens is made",
    )
    i.add_argument("--data-dir", help="the new data directory (default ./data; must be empty)")
    i.add_argument(
        "--shards",
        type=int,
        default=int(os.environ.get("OPENBOT_SHARDS") or 2),
        help="the shard count `openbot serve` will use",
    )
    i.add_argument(
        "--join-org",
        action="append",
        default=[],
        metavar="ORG",
        help="merging into a data directory that holds this org already: join it (repeat for "
        "more; default: an org id taken there refuses the import with id_clash)",
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
