"""`benchmarks.gateway_cpu --events` runs the hub on events a shard in this process hands it,
and every subscriber gets its frames; `--published` brings each POST's event to its writer's
clients through the coalescer and the follower (small runs: the figures are not checked)."""

from __future__ import annotations

import argparse
import gc
import re

from benchmarks.gateway_cpu import event_rounds, published_rounds


def _run(rounds, args: argparse.Namespace) -> None:
    thresholds = gc.get_threshold()
    try:
        rounds(args)  # raises when a client missed a frame (or a POST failed)
    finally:  # (it tunes the collector as a server does: not for the rest of the tests)
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_the_event_harness_delivers_to_every_client(capsys):
    args = argparse.Namespace(
        events=True,
        requests=40,
        rounds=1,
        users=3,
        clients_per_user=2,
        batch=4,
        profile=False,
        top=5,
    )
    _run(event_rounds, args)
    assert "us of CPU per event" in capsys.readouterr().out


def test_the_published_harness_brings_every_event_to_its_clients(capsys):
    """`--published`: POSTs through the real coalescer and follower; every event reaches its
    writer's clients (checked by the harness), in coalesced calls."""
    args = argparse.Namespace(
        published=True,
        requests=60,
        rounds=1,
        users=3,
        clients_per_user=2,
        connections=4,
        profile=False,
        top=5,
    )
    _run(published_rounds, args)
    out = capsys.readouterr().out
    assert "us of CPU per request" in out
    calls = int(re.search(r"coalesced calls: (\d+),", out).group(1))  # type: ignore[union-attr]
    assert calls < 140 / 2  # 140 POSTs (20 before the clock per connection), many to a call
