"""The engine's own overhead in group discussions and collaboration chains, with a zero-latency
`scripted` model, so every millisecond measured is the engine's (and HTTP's), never a model's.

    cd /work/main && .venv/bin/python -m benchmarks.discussion [--quick] [--runs N] [--profile]
        [--only floor,discussion,chains,groups] [--check]

Scenarios (one local Ray, one engine with 2 shards, a real gateway served by uvicorn from a thread
of this process on 127.0.0.1, set up through the admin API):

  floor      an 8-bot, 12-round discussion (96 bot steps) on one ShardService in this process:
             no Ray, no HTTP; DuckDB files, group commit and encryption are real. The engine's
             floor, with each DuckDB transaction timed on the database thread; `--profile`
             prints where the event loop's time goes (cProfile).
  discussion the same discussion through HTTP (`POST /v1/chats/{id}/turns?wait=true`, 12 rounds),
             once with the 8 bots' memory on both shards ("spread": 4 steps per round cross
             shards) and once all on the group chat's home shard ("colocated"): wall time of the
             turn and per bot step (turn / 96), p50/p99 over `--runs` turns in the same chat
             after one warm-up turn; gaps between consecutive items' timestamps (ms resolution).
  chain      collaboration chains started by a person's turn in a direct chat: "linear" (each
             bot sends to the next, so the chain is capped at depth 8 after 8 deliveries) and
             "tree" (each bot sends to two others, so it is capped at 32 deliveries). Time from
             the POST until a `collaboration.changed` event with a status other than "running"
             reaches a websocket client, and per delivery (also from the chain's first event,
             without the person's turn); then until the chain's work is idle.
  groups     100 group chats of 3 bots each, 1 round per turn, all at once: waves of one turn
             in every group (a child process over raw HTTP/1.1, a connection per turn; the
             first wave, on cold chats, is a warm-up): discussions/s, bot steps/s, the
             amortized ms per bot step and each discussion's latency.

Target: engine overhead <= 5 ms per bot turn on this machine (2 cores): p50 per step (floor and
discussion) and 1000 / (bot steps per second) under concurrency (groups); <= 8 ms p50 per
delivery for chains.
CPU time per step is by process: the shard actors, the directory actor and this process (the
gateway's thread, the Ray driver and the HTTP client). Writes benchmarks/results/discussion.json.
"""
