"""The OpenAI-compatible routes under ``<base_url>infer/v1/`` (and the vLLM-style tokenizer
routes): the same service, answers and errors in OpenAI's shapes (bodies parsed in
``openai_requests``, answers shaped in ``openai_answers``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from jupyter_server.auth.decorator import authorized
from tornado import web

from ..errors import InferError, InvalidRequest, NotFound
from ..values.metrics import wall
from ..values.request import RequestResult, TokenEvent, show
from ..values.stream import RequestStream
from ..wire import openai_answers, openai_requests
from .handler_base import GENERATE, InferHandler, NotFoundHandler, answers_errors
from .sse import format_event

INVALID_KEY = ("Invalid or missing API key: use this Jupyter server's token as the API key "
               "(Authorization: Bearer <token>).")


class OpenAIHandler(InferHandler):
    """Errors in the client's language: OpenAI's ``{"error": {...}}`` for what we raise and
    for what tornado and jupyter_server raise (401 for a bad key, where jupyter_server would
    say 403 or complain about a missing ``_xsrf``; 404; 405)."""

    def error_body(self, err: InferError) -> dict[str, Any]:
        return openai_answers.error_body(err)

    unauthorized = INVALID_KEY

    def no_user_is_401(self) -> bool:
        return True  # OpenAI's clients read any refused key as 401 (AuthenticationError)

    def get_login_url(self) -> str:
        raise web.HTTPError(401, INVALID_KEY)  # what @web.authenticated asks for without a user

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.count_refusal(status_code)
        message = self.refusal_message(status_code, kwargs.get("exc_info", (None, None))[1])
        code = {401: "invalid_api_key", 404: "not_found", 405: "method_not_allowed"}.get(status_code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(openai_answers.error_json(status_code, message, code)))

    def write_infer_error(self, err: InferError) -> None:
        if self.streaming:  # OpenAI streams report a late error as a data chunk, then end
            self.write(format_event(json.dumps(self.error_body(err))) + format_event("[DONE]"))
            self.finish_event_stream()
            return
        super().write_infer_error(err)

    async def complete(self, parse: Callable[..., openai_requests.OpenAIRequest], chat: bool) -> None:
        body = self.read_json()
        info = await self.ready_for(body)
        call = parse(body, info, max_new_tokens=self.max_new_tokens, max_choices=self.infer_config.max_choices)
        self.say_ignored(call.ignored)
        streams = await self.submit_all(call.requests)
        call.model = streams[0].model or call.model  # behind a router: the model that serves it
        shape = openai_answers.Shaper(chat, streams[0].id, call, self.service.token_texts)
        if call.stream:
            await self._stream_choices(streams, call, shape)
            return
        try:
            results = await asyncio.gather(*(s.result() for s in streams))
        finally:
            for stream in streams:
                if not stream.done:
                    stream.cancel()  # another choice failed, or the client left
        if not self.gone.is_set():
            self.finish(shape.whole(results))

    async def _stream_choices(
        self, streams: list[RequestStream], call: openai_requests.OpenAIRequest, shape: openai_answers.Shaper,
    ) -> None:
        """Chunks of every choice, interleaved as they come, each with its ``index``."""
        chat = shape.chat
        tokens = [0] * len(streams)  # completion tokens so far, per choice
        chars = [0] * len(streams)  # text sent so far, per choice (logprobs' text_offset)
        records = [0] * len(streams)  # logprob records sent so far, per choice
        opened = [chat] * len(streams)  # completions: the echo chunk is sent (chat: role chunk)

        def data(obj: Any) -> str:
            return format_event(json.dumps(obj))

        def usage(i: int) -> dict[str, int] | None:
            if not call.continuous_usage:
                return None
            return shape.usage([len(streams[i].prompt_ids)], [tokens[i]])

        def echo(i: int, prompt_logprobs: Any) -> str:
            opened[i] = True
            if not call.echo:
                return ""
            text = call.requests[i].prompt
            chars[i] = len(text)
            return data(shape.chunk(i, text, logprobs=shape.echo_logprobs(streams[i].prompt_ids, prompt_logprobs),
                                    usage=usage(i)))

        def render(i: int, event: TokenEvent | RequestResult) -> str:
            """An answer's pieces as the answer stage read them, then its finish."""
            text = "" if opened[i] else echo(i, event.prompt_logprobs)
            if isinstance(event, TokenEvent):
                tokens[i] = event.index
                records[i] += len(event.logprobs)
                lp = shape.event_logprobs(event.logprobs, chars[i])
                chars[i] += len(event.text)
                return text + "".join(map(data, shape.piece_chunks(i, event.pieces, usage(i), lp)))
            tokens[i] = event.completion_tokens
            rest = (event.logprobs or ())[records[i]:]
            lp = shape.event_logprobs(rest, chars[i]) if rest else None
            reason = openai_answers.finish_reason(event, legacy=call.tools is not None and call.tools.legacy)
            return text + data(shape.chunk(i, None if chat else "", finish_reason=reason, logprobs=lp, usage=usage(i)))

        self.start_event_stream()
        if chat and not await self.send("".join(
                data(shape.chunk(i, "", first=True, usage=usage(i))) for i in range(len(streams)))):
            return
        outcome = await self.relay(streams, render)
        if outcome is None:
            return
        if isinstance(outcome, InferError):
            self.write_infer_error(outcome)
            return
        text = data(shape.usage_chunk(outcome)) if call.include_usage else ""
        await self.send(text + format_event("[DONE]"))
        self.finish_event_stream()


class CompletionsHandler(OpenAIHandler):
    generates = True

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        await self.complete(openai_requests.parse_completion, chat=False)


class ChatCompletionsHandler(OpenAIHandler):
    generates = True

    @web.authenticated
    @authorized(GENERATE)
    @answers_errors
    async def post(self) -> None:
        await self.complete(openai_requests.parse_chat, chat=True)


class ModelsHandler(OpenAIHandler):
    @web.authenticated
    @authorized
    @answers_errors
    async def get(self) -> None:
        info = await self.service.wait_ready()
        answer = openai_answers.models_list(info, self._created())
        shelf = getattr(self.service, "models", None)
        if shelf is not None and self.service.config.load_on_demand:  # Ollama's way: what a request may name
            served = {card["id"] for card in answer["data"]}
            answer["data"] += [{"id": m["id"], "object": "model", "created": self._created(), "owned_by": "jupyter_infer",
                                "root": m["path"], "parent": None, "loaded": False}
                               for m in shelf.listing()
                               if not m["loaded"] and m["id"] not in served and m["source"] != "simulated engine"]
        self.finish(answer)

    def _created(self) -> int:
        return int(wall(self.service.collector.started_at))


class ModelHandler(ModelsHandler):
    """``GET infer/v1/models/{id}``: the card of the served model (ids may hold ``/``)."""

    @web.authenticated
    @authorized
    @answers_errors
    async def get(self, model: str) -> None:
        info = await self.service.wait_ready()
        if model not in info.model_names():
            raise NotFound(f"The model {show(model)} is not served here; GET infer/v1/models lists the one that is.")
        self.finish(openai_answers.model_card(info, self._created()))


class TokenizeHandler(OpenAIHandler):
    """``POST infer/tokenize`` (vLLM's shape): ``{prompt}`` or ``{messages}`` (with ``tools``
    and ``chat_template_kwargs`` as a chat sends them) →
    ``{count, max_model_len, tokens, token_strs}``, as the generate routes tokenize."""

    @web.authenticated
    @authorized("read")  # tokenizing runs no model: reading, though it is a POST
    @answers_errors
    async def post(self) -> None:
        info = await self.service.wait_ready()
        body = self.read_json()
        if not isinstance(body, dict):
            raise InvalidRequest("The request body must be a JSON object with 'prompt' or 'messages'.")
        if "messages" in body:
            prompt = await self.service.render_chat(openai_requests.chat_to_render(body))
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise InvalidRequest("'prompt' must be a string (or send 'messages').", param="prompt")
        tokens = await self.service.tokenize(prompt)
        strs = self.service.token_texts(tokens) if body.get("return_token_strs") else None
        self.finish({"count": len(tokens), "max_model_len": info.max_context, "tokens": tokens, "token_strs": strs})


class DetokenizeHandler(OpenAIHandler):
    """``POST infer/detokenize`` (vLLM's shape): ``{tokens}`` → ``{prompt}``."""

    @web.authenticated
    @authorized("read")
    @answers_errors
    async def post(self) -> None:
        body = self.read_json()
        tokens = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise InvalidRequest("'tokens' must be a list of token ids.", param="tokens")
        self.finish({"prompt": await self.service.detokenize(tokens)})


class OpenAINotFoundHandler(OpenAIHandler, NotFoundHandler):
    """Any other path under ``infer/v1/``: the same 404, in OpenAI's shape."""

    def _not_found(self) -> None:
        raise web.HTTPError(404, f"No route {self.request.path}: this server offers v1/completions, "
                                 "v1/chat/completions, v1/responses, v1/embeddings, v1/rerank, v1/messages (Anthropic's) "
                                 "and v1/models.")
