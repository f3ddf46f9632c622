"""How a failure on a request path becomes the ``InferError`` a client is answered with.

Framework errors (tornado's and jupyter_server's ``HTTPError``: 401, 403, 405, a query that
is not UTF-8) keep their status with a message that names the fix; anything unexpected is
logged and answered without internals.
"""

from __future__ import annotations

import logging
from http.client import responses

from tornado import web

from ..errors import InferError, InternalError, InvalidRequest

log = logging.getLogger("jupyter_infer.server.handler_base")  # the logger these lines always had

UNAUTHORIZED = ("Missing or invalid token: send this Jupyter server's token (an 'Authorization: token <t>' "
                "header, or ?token=), or from a browser its login cookie with the XSRF header "
                "('jupyter server list' shows the token).")
_HTTP_MESSAGES = {
    403: "Forbidden: this needs Jupyter's auth, the token (an 'Authorization: token <t>' header, or "
         "?token=) or the browser's login cookie with its XSRF header.",
    405: "This route does not answer this HTTP method (see docs/server.md for its verbs).",
}


class HTTPFailure(InferError):
    """A framework ``HTTPError`` (403 from auth, 405, a query that is not UTF-8, ...)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = {401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}.get(
            status, "invalid_request" if status < 500 else "internal_error")


class BodyTimeout(InferError):
    """The request body did not arrive within ``InferApp.body_timeout_s``."""

    status = 408
    code = "request_timeout"


def as_infer_error(err: BaseException, *, log_unexpected: bool = True) -> InferError:
    """What to answer for ``err``: an ``InferError`` as it is, anything else without internals."""
    if isinstance(err, InferError):
        return err
    if isinstance(err, RecursionError):
        return InvalidRequest("The request is nested too deeply to read; send a flat JSON object.")
    if isinstance(err, web.HTTPError):
        message = err.log_message % err.args if err.log_message and err.args else err.log_message
        return HTTPFailure(err.status_code, message or _HTTP_MESSAGES.get(
            err.status_code, err.reason or responses.get(err.status_code, "error")))
    if log_unexpected:
        log.error("jupyter_infer: unexpected error on a request", exc_info=err)
    return InternalError("The server failed on this request (an internal error, written to the server's "
                         "log). Try again, and report it if it persists.")
