"""A small OpenAI-compatible Chat Completions server for tests, served on loopback by uvicorn.

Queue answers with `stub.answer(...)`; each request takes the next one (or the default). Every
request body is recorded in `stub.requests`, so tests see exactly what crossed HTTP.

`POST /v1/embeddings` answers deterministic vectors (`embed_text`): a hashed bag of
words in which the words of a small thesaurus share one direction, so "car" is near "automobile"
without sharing a letter. Its requests go to `stub.embedding_requests`; queue failures with
`stub.embedding_faults.append(...)` (an HTTP status, HANG, GARBAGE, SHORT, ("delay", seconds) or
("hold", entered, gate, seconds): `entered` (a threading.Event) is set when the request arrives,
which is then answered when the test sets `gate` or after `seconds`, whichever comes first;
`stub.embeddings_held` counts the requests being held).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections import deque

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


def bot_of(body) -> str:
    """The bot a request is for, by the name its system prompt gives it ("You are <name>.")."""
    m = re.match(r"You are (\S+)\.", body["messages"][0]["content"])
    return m.group(1) if m else ""


def completion(text=None, tool_calls=(), usage=(10, 5)):
    message = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_{k}",
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for k, (name, args) in enumerate(tool_calls)
        ]
    body = {"id": "cmpl", "model": "stub-model", "choices": [{"index": 0, "message": message}]}
    if usage is not None:
        body["usage"] = {"prompt_tokens": usage[0], "completion_tokens": usage[1]}
    return body


EMBED_DIM = 1024
_STOP = frozenset(
    re.findall(r"\w+", "a an and are at be by for from in is it of on or the this to with")
)
_THESAURUS = {
    w: concept
    for concept, words in {
        "vehicle": "car cars automobile automobiles vehicle vehicles",
        "drink": "tea coffee beverage beverages drink drinks",
        "holiday": "holiday holidays vacation vacations leave",
    }.items()
    for w in words.split()
}


def embed_text(text: str) -> list[float]:
    vector = [0.0] * EMBED_DIM
    for word in re.findall(r"\w+", text.casefold()):
        if word in _STOP:
            continue
        digest = hashlib.sha256(_THESAURUS.get(word, word).encode()).digest()
        vector[int.from_bytes(digest[:4], "big") % EMBED_DIM] += 1.0
    return vector


class OpenAIStub:
    HANG = "hang"
    GARBAGE = "garbage"
    SHORT = "short"  # embeddings: one vector fewer than inputs

    def __init__(self) -> None:
        self.queue: deque = deque()
        # Routed answers come first: fn(request body) -> an answer, or None to fall through.
        self.routes: list = []
        self.default = completion("OK.")
        self.requests: list[dict] = []
        self.embedding_requests: list[dict] = []
        self.embedding_faults: deque = deque()
        self.embeddings_held = 0  # embedding requests being held by a "hold" fault right now
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._complete, methods=["POST"]),
                Route("/v1/embeddings", self._embed, methods=["POST"]),
            ]
        )

    def answer(self, *answers) -> None:
        self.queue.extend(answers)

    async def _complete(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.requests.append(body)
        answer = next((a for a in (fn(body) for fn in self.routes) if a is not None), None)
        if answer is None:
            answer = self.queue.popleft() if self.queue else self.default
        if isinstance(answer, tuple) and answer[0] == "delay":
            await asyncio.sleep(answer[1])
            answer = answer[2]
        if isinstance(answer, tuple) and answer[0] == "gate":
            # ("gate", threading.Event, answer): held until the test opens the gate (at most
            # 60 s), so "while the step runs" does not depend on how loaded the machine is.
            gate, answer = answer[1], answer[2]
            for _ in range(6000):
                if gate.is_set():
                    break
                await asyncio.sleep(0.01)
        if answer == self.HANG:
            await asyncio.sleep(3600)
        if answer == self.GARBAGE:
            return Response(b"<html>not json", media_type="text/html")
        if isinstance(answer, int):
            return JSONResponse({"error": {"message": "stub"}}, status_code=answer)
        return JSONResponse(answer)

    async def _embed(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.embedding_requests.append(body)
        fault = self.embedding_faults.popleft() if self.embedding_faults else None
        if isinstance(fault, tuple) and fault[0] == "delay":
            await asyncio.sleep(fault[1])
            fault = None
        if isinstance(fault, tuple) and fault[0] == "hold":
            _, entered, gate, seconds = fault
            self.embeddings_held += 1
            entered.set()
            try:
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(None, gate.wait, seconds)
            finally:
                self.embeddings_held -= 1
            fault = None
        if fault == self.HANG:
            await asyncio.sleep(3600)
        if fault == self.GARBAGE:
            return Response(b"<html>not json", media_type="text/html")
        if isinstance(fault, int):
            return JSONResponse({"error": {"message": "stub"}}, status_code=fault)
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if fault == self.SHORT:
            inputs = inputs[:-1]
        data = [
            {"object": "embedding", "index": k, "embedding": embed_text(text)}
            for k, text in reversed(list(enumerate(inputs)))  # out of order, as servers may
        ]
        return JSONResponse({"object": "list", "data": data, "model": body.get("model", "")})
