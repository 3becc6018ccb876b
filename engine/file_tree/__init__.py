"""The account file tree of an account (FS-1..FS-3, docs/design.md §7): render and parse, pure.

`render(snapshot)` turns one account's `AccountSnapshot` into `{relative path: bytes}` under
`bot-workspace/<accountId>/`; `parse(files)` reads such files back into snapshots. Both are
deterministic (sorted keys and rows, `\\n` line ends, two-space JSON), so that export → import →
export gives the same bytes: `parse(render(s)) == canonical(s)`.

    account.json                                     identity records (see below)
    agents/<botId>/projects.json                     projects the bot takes part in (derived)
    agents/<botId>/memory/profile.md                 bot memory, `profile` tier
    agents/<botId>/memory/log/YYYY-MM.md             bot memory, `log` and `note` tiers
    user-memory/agents/<contributorBotId>/profile.md and …/log/YYYY-MM.md
    projects/<projectId>/project.md                  front matter (JSON values) + a heading
    projects/<projectId>/groups.json                 the linked channels, in link order
    projects/<projectId>/memory/agents/<contributorBotId>/profile.md and …/log/YYYY-MM.md
    <memory>/.dreaming/records.json                  every record's metadata (no content)
    <memory>/.dreaming/explicit/<id>.json            a person wrote it  (origin markers)
    <memory>/.dreaming/synthesized/<id>.json         the memory bot extracted it
    <memory>/.dreaming/tombstones/<id>.<rev>.json    old content a forget/revision left behind
    <memory>/.dreaming/forgotten-sources.json        the old evidence markers of those barriers
    <memory>/.dreaming/revisions/<id>.json           operator, time, before/after per revision
    <memory>/.dreaming/jobs/<jobId>.json             extraction jobs (bot memory only)
    <memory>/.dreaming/next-refresh-at               when open jobs wait since (ISO UTC) or none
    agents/<botId>/memory/.dreaming/read-positions.json  how far learning read each chat
    agents/<botId>/memory/.dreaming/memory-bot.json  pool version, memory-bot settings, change log
    other-agents/<botId>/memory/…                    learned entries of another account's bot
                                                     kept for this one (its owner may not see
                                                     them; `entry_keeper` says whose they are)
    chats/<chatId>/chat.json, items.md, items.json, turns.json   a chat (engine/file_tree/_chats.py)
    chats/<chatId>/confessions.json, enrichments.json            its turns' confessions, rewrites
    chats/<chatId>/chains.json, requests.json                    chains rooted in it, approvals
    .commands/<hash>.json                            idempotency receipts (requestId → answer)

`<memory>` is `agents/<botId>/memory`, `user-memory` or `projects/<projectId>/memory`.
`.transactions/` holds the writer's recovery log while files are being written and is empty
afterwards, so it has no entries here (storage/tree_files.py manages it).

Memory lines read `- (YYYY-MM-DD) content`: the record's last update in UTC. Active records only;
inside a file oldest first (update time, then id), matched to `records.json` by that order. The
content is escaped so one record stays one line: `\\` → `\\\\`, LF → `\\n`, CR → `\\r`, other
control and line/paragraph separator characters, and leading or trailing spaces and tabs, →
`\\uXXXX`. Anything else (CJK, emoji, tabs inside) is written as it is, in UTF-8. A forgotten
record has no line: its text is in the tombstone its forgetting left (or, if there is none, in
`records.json`'s `content`).

Content fingerprints in the files are unkeyed (`content_fingerprint(text)`): the stored ones are
keyed with a secret of the data directory's master key, which the export does not carry; an import
keys them again from the text. `account.json` is an addition to the memory files: the directory
records (the account, its orgs, the people it works with, its bots and channels) that the server
keeps in a database, so that an import rebuilds a data directory that works.

An account's tree holds what it owns: its bots (and their memory), its user memory, the projects
it owns (and their memory), its receipts, and its chats (those it is the person of: its direct
and review chats with any bot, the group chats it started, the agent chats serving them, with
their confessions, enrichments, the chains rooted in them and the requests made in them); so the
trees of several accounts never claim the same file or record. Parsing is strict about structure
(an unexpected or missing file, a line count or date that does not match `records.json`, a path
that is not a safe id: InvalidInput `invalid_tree` naming the file) and lenient about what people
do to Markdown: blank lines and `#` headings are skipped, and an edited line's text is taken as
the record's new content.
"""

from engine.file_tree._model import (
    FORMAT,
    ROOT,
    AccountSnapshot,
    BotProject,
    ChainRecord,
    ChatItem,
    ChatSnapshot,
    ChatTurn,
    CommandReceipt,
    LinkTexts,
    MemoryBotState,
    MemoryJob,
    MemoryRecord,
    PoolSnapshot,
    ReadPosition,
    RequestRecord,
    Tombstone,
    canonical,
    day,
    entry_keeper,
    escape,
    memory_line,
    memory_root,
    record_file,
    unescape,
)
from engine.file_tree._parse import parse
from engine.file_tree._render import render

__all__ = [
    "FORMAT",
    "ROOT",
    "AccountSnapshot",
    "BotProject",
    "ChainRecord",
    "ChatItem",
    "ChatSnapshot",
    "ChatTurn",
    "CommandReceipt",
    "LinkTexts",
    "MemoryBotState",
    "MemoryJob",
    "MemoryRecord",
    "PoolSnapshot",
    "ReadPosition",
    "RequestRecord",
    "Tombstone",
    "canonical",
    "day",
    "entry_keeper",
    "escape",
    "memory_line",
    "memory_root",
    "parse",
    "record_file",
    "render",
    "unescape",
]
