"""The web console (docs/design.md §11): static files shipped inside the package, served at `/` and
under `/console/`. No build step: plain HTML, CSS and JavaScript modules. The pages are public (they
hold no data); everything they show comes from the API with the token the person signs in with.
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

CONSOLE_DIR = Path(__file__).parent / "console"
ASSET_PREFIX = "/console"
# What a browser may load while showing the console: its own scripts only (no inline script and
# no eval, so nothing injected into the page can run), images from this server or inline (data:)
# only, and connections (fetch, the events websocket: CSP 'self' covers ws/wss of this origin)
# to this origin only, so an injected element can neither beacon out nor load a tracker. Inline
# styles stay allowed: browser test drivers hide the caret with one.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; connect-src 'self'; object-src 'none'; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


class _ConsoleFiles(StaticFiles):
    async def get_response(self, path: str, scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(_HEADERS)
        return response


async def _index(request: Request) -> Response:
    return FileResponse(CONSOLE_DIR / "index.html", headers=_HEADERS)


def console_routes() -> list:
    return [
        Route("/", _index, methods=["GET", "HEAD"]),
        Mount(ASSET_PREFIX, app=_ConsoleFiles(directory=CONSOLE_DIR), name="console"),
    ]
