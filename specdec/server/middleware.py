"""ASGI middleware in front of every route: the request body's size limit, the Host header check and the
API key; and the bounded endpoint labels the metrics count requests by."""

from __future__ import annotations

import hmac

from .api_errors import error_response


class BodyLimit:
    """ASGI middleware: refuse request bodies over `limit` bytes with 413, declared or streamed."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_big = error_response(413, f"request body is larger than {self.limit} bytes", code="body_too_large")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await too_big(scope, receive, send)
        body, more = [], True
        size = 0
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.limit:
                return await too_big(scope, receive, send)
            body.append(message.get("body", b""))
            more = message.get("more_body", False)
        data = b"".join(body)
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/docs", "/redoc",
             "/openapi.json")


def endpoint_label(path: str) -> str:
    """A bounded label for metrics: a known route, /v1/models/{id}, or "other"."""
    if path in ENDPOINTS:
        return path
    return "/v1/models/{id}" if path.startswith("/v1/models/") else "other"


LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")


class Guard:
    """ASGI middleware: the Host header check and the API key (pure ASGI, so a handler can still see
    its client disconnect, which Starlette's BaseHTTPMiddleware hides)."""

    def __init__(self, app, api_key: str | None, allowed_hosts: tuple[str, ...] | None, metrics):
        self.app, self.api_key, self.allowed_hosts, self.metrics = app, api_key, allowed_hosts, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        path = scope.get("path", "")
        if self.allowed_hosts is not None:
            host = headers.get(b"host", b"").decode("latin-1")
            name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
            if name not in self.allowed_hosts:
                self.metrics.requests.labels(endpoint=endpoint_label(path), status="400").inc()
                response = error_response(400, f"host {host!r} is not allowed: this server answers "
                                          f"{', '.join(self.allowed_hosts)} (see --allowed-hosts)", code="host_not_allowed")
                return await response(scope, receive, send)
        if self.api_key and path != "/health":
            scheme, _, given = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            # the scheme is case-insensitive (RFC 9110 11.1); the key is compared in constant time
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8", "replace"),
                                                                     self.api_key.encode()):
                self.metrics.requests.labels(endpoint=endpoint_label(path), status="401").inc()
                response = error_response(401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                                          type_="authentication_error", code="invalid_api_key")
                return await response(scope, receive, send)
        return await self.app(scope, receive, send)
