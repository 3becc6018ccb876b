"""User and project facts a learning step staged for other pools (LRN-5).

A step decides facts for the workspace pools of a person or a project, which may live on other
shards. They are not sent before the step commits: they are staged, sealed with the bot's pool
key, in the very commit that moves the chat's read position and ends the job, so that commit
holds both or neither. After it (and at every shard start, for sets a crash left behind) each
group is sent to its pool under a receipt of its own, keyed by the job, its read position and
the group's place in the set: a repeat stores nothing twice. A set is deleted once every group
was answered, in the batch that adds its pools' refusals to the job.
"""

from __future__ import annotations

import msgspec

from engine import scoped_memory as sm


class StagedGroup(msgspec.Struct, frozen=True, kw_only=True):
    """The facts for one workspace pool, and the evidence they cite."""

    pool: str
    proposals: tuple[sm.Extraction, ...]
    sources: tuple[sm.SourceItem, ...]


class StagedFacts(msgspec.Struct, frozen=True, kw_only=True):
    job: str
    upto: int
    at: int
    groups: tuple[StagedGroup, ...]

    def request_id(self, index: int) -> str:
        """The receipt key of group `index`: one per job, read position and group."""
        return f"learn:{self.job}:{self.upto}:{index}"


encode = msgspec.json.Encoder().encode
decode = msgspec.json.Decoder(StagedFacts).decode
