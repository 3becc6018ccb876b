"""The embedded Ray of a real `openbot serve` is reachable from no other host and
answers no caller without its token. Every listening TCP socket of the server's whole process
tree (gateway, gcs_server, raylet, agents, actor workers) must be on loopback, and every Ray
server among them must refuse a call that carries no token or a wrong one."""

from __future__ import annotations

import os
import stat

import grpc
import httpx
import pytest

from tests.listening import Listener, listeners
from tests.test_serve_restart import ADMIN, Serve

# Harmless calls, one per kind of Ray gRPC server: an unknown method is answered UNIMPLEMENTED
# before any auth check, so each server is probed with one it serves.
PROBES = (
    "/ray.rpc.NodeInfoGcsService/GetClusterId",  # gcs_server
    "/ray.rpc.NodeManagerService/GetSystemConfig",  # raylet
    "/ray.rpc.CoreWorkerService/NumPendingTasks",  # driver and actor workers
    "/ray.rpc.ObjectManagerService/Pull",  # raylet's object manager (never with a token)
)
SAFE_WITH_TOKEN = set(PROBES[:3])


def _grpc(port: int, method: str, token: str | None) -> grpc.StatusCode:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary(method, request_serializer=bytes, response_deserializer=bytes)
    metadata = [("authorization", f"Bearer {token}")] if token is not None else None
    try:
        call(b"", timeout=5, metadata=metadata)
        return grpc.StatusCode.OK
    except grpc.RpcError as e:
        return e.code()
    finally:
        channel.close()


def _refuses_without_token(lst: Listener, token: str) -> str:
    """How `lst` refuses an unauthenticated caller, or an AssertionError saying it does not."""
    for method in PROBES:
        bare = _grpc(lst.port, method, None)
        assert bare != grpc.StatusCode.OK, f"{lst} answered {method} without a token"
        if bare == grpc.StatusCode.UNAUTHENTICATED:
            assert _grpc(lst.port, method, "0" * 64) == grpc.StatusCode.UNAUTHENTICATED, lst
            if method in SAFE_WITH_TOKEN:
                # The probe reaches the auth check: with the right token it goes through.
                assert _grpc(lst.port, method, token) == grpc.StatusCode.OK, (lst, method)
            return f"grpc {method.rsplit('/', 1)[1]}"
    from ray.autoscaler._private.constants import AUTOSCALER_METRIC_PORT

    if lst.port == AUTOSCALER_METRIC_PORT:
        # Ray's autoscaler monitor exports its own gauges (node counts) over Prometheus, with
        # no auth, bound to loopback because the head is (checked above). It serves those
        # gauges and nothing else: no data of ours, no call into Ray.
        body = httpx.get(f"http://127.0.0.1:{lst.port}/metrics", timeout=5).text
        samples = [line for line in body.splitlines() if line and not line.startswith("#")]
        assert all(line.startswith("autoscaler_") for line in samples), (lst, samples[:5])
        return "autoscaler gauges only"
    # Not gRPC: Ray's HTTP agents (runtime env agent) check the same token.
    url = f"http://127.0.0.1:{lst.port}/get_or_create_runtime_env"
    bare = httpx.post(url, content=b"", timeout=5)
    assert bare.status_code == 401, (lst, bare.status_code, bare.text[:200])
    wrong = httpx.post(url, content=b"", headers={"Authorization": "Bearer x"}, timeout=5)
    assert wrong.status_code in (401, 403), (lst, wrong.status_code)
    return "http 401"


@pytest.mark.slow
def test_no_socket_of_the_server_listens_beyond_loopback_or_without_auth(tmp_path, ray_tmp):
    data = tmp_path / "data"
    # A careless shell: auth switched off and nothing keeping Ray on loopback. The server
    # must not depend on its caller's environment for either.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}
    server = Serve(data, ray_tmp, env=env)
    try:
        admin = {"Authorization": f"Bearer {ADMIN}"}
        # Make the server start what it starts on demand (the node hub, event pumps).
        with httpx.Client(base_url=server.url, headers=admin, timeout=30) as a:
            assert a.get("/v1/capabilities").status_code == 200
        found = listeners(server.proc.pid)
        names = {lst.name for lst in found}
        # Not vacuous: the tree was found, with Ray's servers and actor workers in it.
        assert "gcs_server" in names and "raylet" in names, found
        assert any(n.startswith("ray::") for n in names), found
        exposed = [lst for lst in found if not lst.loopback]
        assert exposed == [], f"listening beyond loopback: {exposed}"

        token_file = data / "ray.token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        how = {
            (lst.name, lst.port): _refuses_without_token(lst, token)
            for lst in found
            if lst.port != server.port  # the HTTP API: its auth is tested route by route
        }
        assert any(v.startswith("grpc GetClusterId") for v in how.values()), how
    finally:
        server.stop()
