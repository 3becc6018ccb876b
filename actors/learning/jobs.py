"""Learning jobs as people see and hear of them (MB-5): those of their own turns and their
channels', and the `memory.job.changed` event each change of a job sends to them."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from actors.shard.kernel import ShardKernel
from engine.chat_records import LearningJob
from engine.events import Audience, MemoryJobChanged
from storage.chat_store import ChatStore
from storage.stats import STATS

JOBS = "openbot_learning_jobs"


def job_event(job: LearningJob) -> tuple[MemoryJobChanged, Audience]:
    """A job's change as an event, to the turn's person or channel only."""
    STATS.inc(JOBS, help="Learning job changes by the status they reached", status=job.status)
    operator = job.grant.removeprefix("for:person:")
    users = (operator,) if job.grant.startswith("for:person:") else ()
    channels = (job.channel,) if job.channel else ()
    data = MemoryJobChanged(
        bot=job.pool.removeprefix("bot:"), job=job.id, status=job.status, attempts=job.attempts
    )
    return data, Audience(org=job.org, users=users, channels=channels)


def job_for(job: LearningJob, user: str, channels: frozenset[str]) -> bool:
    """Whether the job's turn was the user's: their own person turn, or one of their channels."""
    return job.grant == f"for:person:{user}" or (
        job.channel is not None and job.channel in channels
    )


async def jobs_for(
    kernel: ShardKernel,
    store: ChatStore,
    pools: Sequence[str],
    user: str,
    channels: frozenset[str],
) -> list[LearningJob]:
    """Learning jobs of these pools the user may see, with every attempt that reached the
    model, from the sealed call log (LRN-4)."""
    out = []
    for pool in pools:
        stored = None
        for job in await store.jobs(pool):
            if not job_for(job, user, channels):
                continue
            stored = stored or (await kernel.pool(pool)).stored
            records = await store.attempt_records(stored, job.id)
            out.append(msgspec.structs.replace(job, attemptRecords=records))
    return out


async def find_job(
    store: ChatStore, job_id: str, pools: Sequence[str], user: str, channels: frozenset[str]
) -> LearningJob | None:
    """The job if it is in one of these pools and the user may see it."""
    for pool in pools:
        for job in await store.jobs(pool):
            if job.id == job_id and job_for(job, user, channels):
                return job
    return None
