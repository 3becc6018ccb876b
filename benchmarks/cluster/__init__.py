"""Cluster mode under load: the engine on 1, 2 and 4 Ray nodes, then a node-failure drill.

    cd /work/main && .venv/bin/python -m benchmarks.cluster [--quick] [--nodes 1,2,4]
    .venv/bin/python -m benchmarks.cluster --address HEAD:6379 [--nodes 1,2,4]   # a real cluster

Clusters: without `--address`, a simulated cluster on this machine (`ray.cluster_utils.Cluster`,
on 127.0.0.1, `--cpus-per-node` CPUs each): it starts with one node and nodes are added for each
stage. With `--address` the real cluster is joined and each stage uses k of its nodes (k <= the
nodes alive). Simulated nodes share this machine's cores: on one machine more nodes add processes
and hops, not CPUs, so the 2- and 4-node figures show the cost of spreading, never a speed-up.
Run it on a real cluster to see scaling (the target there: >= 1.7x from 1 to 2 nodes).

A stage with k nodes: a fresh engine with k shards placed `spread` (one per node), one gateway
per node (a Ray actor running the real app under uvicorn on that node; `openbot serve
--ray-address` does the same as a process), `--accounts` accounts with a bot each (model
"talk", a zero-latency scripted model) and `--groups` group chats of 3 bots of different
accounts. Made through the admin API. The load comes from one child process (`python -m
benchmarks.cluster --load SPEC`; raw HTTP/1.1 keep-alive from benchmarks/_load.py, and
websockets), spread over every gateway, for `--seconds` after `--warmup`:
  memory      `--concurrency` closed-loop clients, each an account: GET /v1/bots/{bot}/memory,
              and every `--write-every`-th request a Remember (POST), so reads and writes over
              every account (and so every shard);
  turns       one closed-loop client per group: POST /v1/chats/{id}/turns?wait=true, 1 round,
              i.e. 3 bot steps whose memories are on up to 3 shards;
  events      `--subscribers` accounts listen on /v1/events (a gateway each, by cursor; on a
              failure they resume on the next gateway). Afterwards each must hold the event of
              every acknowledged write to its bot exactly once: lost and duplicated must be 0.
After the window every bot's memory is read back: every acknowledged write must be in it.

Drill (on the last stage's cluster, unless `--no-drill`): the same load for `--drill-seconds`;
a quarter of the way in, the node holding one shard (not the head, not the directory's node) is
killed like a crash (simulated: its processes are killed, then a node is added back 1 s later;
real cluster: the shard actor is killed, since this benchmark will not kill your machines). It
reports how long the lost shard refused requests (recovery), the requests that failed (none of
them acknowledged), acknowledged writes lost and events lost or duplicated (must be 0), and
whether every group chat takes a turn afterwards (in-flight discussions ended cleanly).

Figures per stage: requests/s (memory + turns), p50/p99 of reads, writes and turns, bot steps/s,
events delivered/lost/duplicated, the ratio of requests/s to the 1-node stage and, on a
simulated cluster, CPU seconds by process role (all roles share this machine's cores). Prints a
table and writes benchmarks/results/cluster.json. `--quick` finishes in under 2 minutes on a
2-core machine.
"""
