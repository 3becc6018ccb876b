"""A small OpenAI-compatible Chat Completions server for tests, served on loopback by uvicorn.

Queue answers with `stub.answer(...)`; each request takes the next one (or the default). Every
request body is recorded in `stub.requests`, so tests see exactly what crossed HTTP.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


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


class OpenAIStub:
    HANG = "hang"
    GARBAGE = "garbage"

    def __init__(self) -> None:
        self.queue: deque = deque()
        # Routed answers come first: fn(request body) -> an answer, or None to fall through.
        self.routes: list = []
        self.default = completion("OK.")
        self.requests: list[dict] = []
        self.app = Starlette(
            routes=[Route("/v1/chat/completions", self._complete, methods=["POST"])]
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
        if answer == self.HANG:
            await asyncio.sleep(3600)
        if answer == self.GARBAGE:
            return Response(b"<html>not json", media_type="text/html")
        if isinstance(answer, int):
            return JSONResponse({"error": {"message": "stub"}}, status_code=answer)
        return JSONResponse(answer)
