"""`benchmarks.gateway_cpu --events` runs the hub on events a shard in this process hands it,
and every subscriber gets its frames (a small run: the figure itself is not checked)."""

from __future__ import annotations

import argparse
import gc

from benchmarks.gateway_cpu import event_rounds


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
    thresholds = gc.get_threshold()
    try:
        event_rounds(args)  # raises when a client got no frame
    finally:  # (it tunes the collector as a server does: not for the rest of the tests)
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    assert "us of CPU per event" in capsys.readouterr().out
