"""The errors the API answers with: OpenAI's error body, `{"error": {"message", "type", "param", "code"}}`,
with a 4xx status (5xx only where the server itself cannot go on)."""

from __future__ import annotations

from fastapi.responses import JSONResponse


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        self.status, self.message, self.type, self.param, self.code, self.headers = status, message, type_, param, code, headers


def error_response(status: int, message: str, type_: str = "invalid_request_error", param=None, code=None,
                   headers=None) -> JSONResponse:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)
