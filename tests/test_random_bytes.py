"""Nonces and new ids come from OS randomness read a block at a time (storage/crypto.py
`random_bytes`): every byte handed out once, across threads and across a fork."""

from __future__ import annotations

import os
import sys
import threading

from storage.crypto import Cipher, random_bytes


def test_each_seal_has_its_own_nonce_and_opens_again():
    cipher = Cipher(b"k" * 32)
    sealed = [cipher.seal(b"same text", b"aad") for _ in range(3000)]  # past one block
    assert len({s[:12] for s in sealed}) == len(sealed)
    assert {cipher.open(s, b"aad") for s in sealed} == {b"same text"}
    assert len(random_bytes(10_000)) == 10_000  # more than a block at once


def test_threads_never_get_the_same_bytes():
    got: list[list[bytes]] = [[] for _ in range(4)]

    def take(out: list[bytes]) -> None:
        for _ in range(5000):
            out.append(random_bytes(12))

    threads = [threading.Thread(target=take, args=(out,)) for out in got]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can: races show
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    every = [b for out in got for b in out]
    assert len(set(every)) == len(every)


def test_a_forked_child_does_not_hand_out_its_parents_next_bytes():
    random_bytes(12)  # a block is read and partly handed out
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next nonce, to the parent
        try:
            os.write(write, random_bytes(12))
        finally:
            os._exit(0)  # private: a forked child must not run the parent's exit handlers
    os.close(write)
    child = os.read(read, 12)
    os.close(read)
    os.waitpid(pid, 0)
    assert len(child) == 12
    assert child != random_bytes(12)
