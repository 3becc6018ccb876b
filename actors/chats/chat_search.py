"""Searching chat histories on the shard that stores them (`GET /v1/chats/{chat}/items?q=`,
`GET /v1/search?q=`, the bots' `workspace_chat_search`), ranked like every memory search.

Each chat's items are indexed in memory under the chat's own term key (`ShardKernel.analyzer`
of `chat:<id>`: the keyed hashes of the per-pool term keys, never a word), built on a chat's
first search from its sealed items and kept up to date with the items stored since; nothing
of it is written to disk. With an embedding model, the items' vectors are kept beside it
(computed on first need, in memory only). Keyword (BM25) and semantic hits are fused by the
same reciprocal rank fusion as the workspace search (`engine.workspace_search.merge_hits`).

Who may read which chat is decided by the caller (the gateway's chat read rules, or a bot step's
reader): every chat asked here is wholly readable by that caller, so the chats searched together
are scored under their statistics added up, as the user and project pools of a workspace search
are. Only stored items are found (a running turn's appear once on disk, as in the listing).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from actors.chats.chat_logs import ChatLogs
from actors.contracts import ChatFound, ChatHit
from actors.shard.kernel import ShardKernel
from actors.workspace.semantic import SemanticSearch
from actors.workspace.vectors import PoolVectors
from engine.errors import InvalidInput
from engine.workspace_search import FUSION_DEPTH, FUSION_WEIGHTS, Hit, fusion_depth, merge_hits
from storage.chat_store import ChatLog, ChatStore, Item
from storage.search_index import Stats, TermIndex

KEEP = 256  # chats whose index stays in memory between searches
SEP = "/"  # a hit's id: <chat>/<item id>


@dataclass
class _Indexed:
    log: ChatLog
    index: TermIndex = field(default_factory=TermIndex)
    items: dict[str, Item] = field(default_factory=dict)  # item id -> item, indexed ones
    first: int = 0  # the seq of the log's first item when indexed (a deletion changes it)
    upto: int = 0  # the last seq indexed
    vectors: PoolVectors = field(default_factory=PoolVectors)


class ChatSearch:
    def __init__(
        self,
        *,
        kernel: ShardKernel,
        logs: ChatLogs,
        store: ChatStore,
        semantic: SemanticSearch | None,
        keep: int = KEEP,
    ) -> None:
        self.kernel = kernel
        self.logs = logs
        self.store = store
        self.semantic = semantic
        self.weights = FUSION_WEIGHTS  # keyword, semantic: as the workspace search's
        self.keep = keep
        self._kept: OrderedDict[str, _Indexed] = OrderedDict()

    def _index(self, chat: str, log: ChatLog) -> _Indexed:
        """The chat's index, brought up to date with the log's stored items (synchronously:
        a log changes only between awaits)."""
        got = self._kept.get(chat)
        first = log.items[0].seq if log.items else 0
        if (
            got is None
            or got.log is not log
            or got.first != first
            or len(got.items) > len(log.items)
        ):
            got = _Indexed(log=log, first=first)
            self._kept[chat] = got
        self._kept.move_to_end(chat)
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)
        if log.items and log.items[-1].seq > got.upto:
            analyzer = self.kernel.analyzer(f"chat:{chat}")
            for item in log.items:
                if item.seq <= got.upto or item.seq > log.committed:
                    continue
                got.index.put(item.id, analyzer.keys(self.store.text(log, item.seq)))
                got.items[item.id] = item
                got.upto = item.seq
        return got

    async def search(
        self, chats: Sequence[str], q: str, limit: int, using: str = "all"
    ) -> ChatFound:
        """The `limit` best items of `chats` for `q`, best first, with each retriever's hits
        among them (for a caller combining several shards' rankings)."""
        if limit < 1:
            raise InvalidInput("limit must be at least 1", code="invalid_limit")
        chats = list(dict.fromkeys(chats))
        hybrid = self.semantic is not None and using == "all"
        depth = fusion_depth(limit, self.weights, floor=FUSION_DEPTH) if hybrid else limit
        logs = {c: await self.logs.log(c) for c in chats}
        indexed = {c: self._index(c, logs[c]) for c in chats}
        keyword: list[Hit] = []
        keys_of = {c: self.kernel.analyzer(f"chat:{c}").query(q) for c in chats}
        if using != "semantic" and any(keys_of.values()):
            parts = [(indexed[c].index.stats(keys_of[c]), keys_of[c]) for c in chats]
            shared: list[Stats | None] = list(Stats.across(parts)) if len(chats) > 1 else [None]
            for chat, stats in zip(chats, shared, strict=True):
                got = indexed[chat]
                for item_id, score in got.index.search(keys_of[chat], depth, _stored(got), stats):
                    keyword.append(Hit(id=chat + SEP + item_id, score=score, kinds=("keyword",)))
            keyword.sort(key=lambda h: (-h.score, h.id))
            keyword = keyword[:depth]
        semantic: list[Hit] = []
        if self.semantic is not None and using != "keyword":
            semantic = await self._semantic(q, chats, indexed, depth)
        found: list[ChatHit] = []
        fused: list[Hit] = []
        everything = len(keyword) + len(semantic)
        for h in merge_hits(keyword, semantic, _yes, everything, weights=self.weights):
            if len(fused) == limit:
                break
            chat, item_id = h.id.split(SEP, 1)
            # Checked again after the awaits above: a history deleted meanwhile is not found.
            log = await self.logs.log(chat)
            item = self._index(chat, log).items.get(item_id)
            if item is None:
                continue
            fused.append(h)
            found.append(
                ChatHit(chat=chat, item=self.logs.view(log, item), score=h.score, foundBy=h.kinds)
            )
        top = {h.id for h in fused}
        return ChatFound(
            items=found,
            hits=[h for h in keyword if h.id in top],
            semantic=[h for h in semantic if h.id in top],
            fused=fused,
        )

    async def _semantic(
        self, q: str, chats: list[str], indexed: dict[str, _Indexed], depth: int
    ) -> list[Hit]:
        """Items nearest to `q` by cosine; items without a vector are embedded first, up to
        the semantic search's inline budget per search (no lock is held: logs have none)."""
        semantic = self.semantic
        assert semantic is not None
        unit = await semantic.query_vector(q)
        if unit is None:
            return []
        budget = semantic.inline_max
        for chat in chats:
            got = indexed[chat]
            todo = [i for i in got.items if i not in got.vectors.row][:budget]
            if not todo:
                continue
            texts = [self.store.text(got.log, got.items[i].seq) for i in todo]
            vectors = await semantic.embed_texts(texts)
            if vectors is None:
                break
            budget -= len(todo)
            for item_id, vector in zip(todo, vectors, strict=True):
                got.vectors.put(item_id, "", vector)
        out: list[Hit] = []
        for chat in chats:
            got = indexed[chat]
            v = got.vectors
            if not v.n or v.dim != unit.size:
                continue
            rows = [v.row[i] for i in got.items if i in v.row]
            for h in v.top(unit, rows, depth, semantic.min_score):
                out.append(Hit(id=chat + SEP + h.id, score=h.score, kinds=h.kinds))
        out.sort(key=lambda h: (-h.score, h.id))
        return out[:depth]


def _stored(got: _Indexed) -> Callable[[str], bool]:
    return got.items.__contains__


def _yes(_: str) -> bool:
    return True
