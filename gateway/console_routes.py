"""The web console (DESIGN §11): static files shipped inside the package, served at `/` and under
`/console/`. No build step: plain HTML, CSS and JavaScript modules. The pages are public (they
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
# What a browser may load while showing the console: its own scripts only (no inline script, so
# nothing injected into the page can run). 'unsafe-eval' is there for browser test drivers, whose
# string expressions (Playwright's wait_for_function) are evaluated in the page; inline styles
# for the same reason (a driver hides the caret with one). Avatars are image URLs from anywhere.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; "
        "img-src * data:; connect-src 'self' ws: wss:; frame-ancestors 'none'; base-uri 'none'"
    ),
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
