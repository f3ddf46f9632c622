"""Errors a user can hit, each with the HTTP status that tells the truth about it."""

from __future__ import annotations


class InferError(Exception):
    """Base class: ``message`` says what went wrong and what to do."""

    status: int = 500
    code: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(InferError):
    status = 400
    code = "invalid_request"


class ContextLengthExceeded(InvalidRequest):
    """The prompt, or the prompt and ``max_tokens``, do not fit the model's context. Its own
    code, as OpenAI's: clients act on it (litellm's ``ContextWindowExceededError`` and its
    fallbacks, LangChain's ``ContextOverflowError``)."""

    code = "context_length_exceeded"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        # The code in the text too: the openai SDK (3.x) puts only the message into
        # ``str(error)``, which is where LangChain looks for "context_length_exceeded".
        super().__init__(f"{message} ({self.code})", param=param)


class UnknownModel(InferError):
    """A model this server does not serve (OpenAI and vLLM: 404)."""

    status = 404
    code = "model_not_found"


class Forbidden(InferError):
    status = 403
    code = "forbidden"


class NotFound(InferError):
    status = 404
    code = "not_found"


class PayloadTooLarge(InferError):
    status = 413
    code = "payload_too_large"


class QueueFull(InferError):
    status = 429
    code = "queue_full"

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TooManySubscribers(QueueFull):
    code = "too_many_subscribers"


class EngineUnavailable(InferError):
    status = 503
    code = "engine_unavailable"


class InternalError(InferError):
    """A bug on the server's side: the body says so, the details go to the server's log only."""

    status = 500
    code = "internal_error"


class ConstraintFailed(InferError):
    """The request's own constraint could not go on mid-answer (its grammar ran out of the
    library's fuel, or allows no way to finish): the request's fault, so a 4xx."""

    status = 400
    code = "constraint_failed"


class RequestFailed(InferError):
    """The engine failed while running this request; other requests go on."""

    status = 500
    code = "engine_error"


class ServerTimeout(EngineUnavailable, TimeoutError):
    """The client heard nothing from the server for too long (a frozen or unreachable
    server); raised by ``jupyter_infer.Client`` instead of waiting forever."""

    status = 504
    code = "timeout"


class UpstreamError(InferError):
    """The upstream server (``engine = "openai"``) answered with an error or broke its stream."""

    status = 502
    code = "upstream_error"


class UpstreamUnavailable(InferError):
    """The upstream server cannot be reached (or says it is overloaded)."""

    status = 503
    code = "upstream_unavailable"


class UpstreamTimeout(InferError):
    """The upstream server took longer than ``InferApp.upstream_timeout_s`` to answer."""

    status = 504
    code = "upstream_timeout"


_REASONS = {400: "invalid", 403: "forbidden", 404: "not_found", 405: "invalid", 408: "timeout",
            413: "too_large", 429: "queue_full", 503: "unavailable"}


def refusal_reason(status: int) -> str:
    """The ``reason`` label a refused request is counted under (``rejected_total{reason}``)."""
    return _REASONS.get(status, "invalid" if 400 <= status < 500 else "error")
