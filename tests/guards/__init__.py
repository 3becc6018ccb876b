"""Guards for protections that no other test pinned down.

Each test is named after the requirement id it guards, and each was checked by applying a one-line
break of the protection by hand, seeing the test fail, and reverting. The break and the failure
are in each docstring ("Break:"). Tests drive `ShardService` directly (no Ray) with real DuckDB
files and real HTTP to loopback OpenAI-compatible stubs (tests/openai_stub.py); decryption is
observed by counting `Cipher.open`/`Cipher.seal` at the storage seam, not by reading code.
"""
