"""OpenAI's API shapes: request bodies checked into a GenerationRequest, responses, errors.

Nothing here touches the engine or a socket: parse_completion / parse_chat turn a
decoded JSON body into a GenerationRequest (or raise APIError with OpenAI's error
object and the HTTP status), and the builders make the response bodies and stream
chunks of /v1/completions and /v1/chat/completions.

Fields taken (OpenAI's names, and vLLM's extensions top_k, min_p, ignore_eos,
stop_token_ids, return_token_ids): model, prompt (a string, token ids, or a list of
one of those) or messages, max_tokens (max_completion_tokens for chat), temperature,
top_p, top_k, min_p, seed, stop (a string or a list), stream, stream_options.include_usage.
Fields with a value this engine cannot honour (n > 1, logprobs, penalties, echo,
best_of > 1, a suffix, logit_bias) are refused by name with 400 rather than ignored;
fields OpenAI has that change nothing here (user, ...) are ignored.

Structured outputs: response_format {"type": "json_object"} (any JSON object; unlike
OpenAI's, the messages need not say "json") or {"type": "json_schema", "json_schema":
{"name", "schema", "strict"}} (the schema is enforced whatever strict says), and vLLM's
extra field structured_outputs {"json" | "regex" | "choice" | "json_object"}. A schema or
regex the engine cannot compile is a 400 naming response_format (or structured_outputs).
The old guided_json / guided_regex / guided_choice fields get a 400 naming their
replacement: vLLM since v0.12 ignores them silently and answers unconstrained.

Defaults as OpenAI's: temperature 1.0; max_tokens 16 for completions, for chat all
the context the model and the KV pool leave after the prompt.
"""
from __future__ import annotations

import math
import time
import uuid
import warnings
from dataclasses import dataclass

from ..validate import is_int
from .sampling_params import SamplingParams
from .structured_outputs import KINDS, StructuredOutputsParams

COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default
CHAT_ROLES = ("system", "user", "assistant")
MAX_STOP_STRINGS = 16


class APIError(Exception):
    """An error as OpenAI sends it: the HTTP status and {"error": {message, type, param, code}}."""

    def __init__(self, status, message, *, type="invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = \
            status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def bad_request(message, param=None, code=None):
    return APIError(400, message, param=param, code=code)


@dataclass
class ModelInfo:
    """What the checks need to know of the served model."""
    name: str
    tokenizer: object  # None: token-id prompts only
    vocab: int
    max_seq: int  # the model's context
    kv_tokens: int  # positions the whole KV pool holds (num_blocks * block_size)
    chat_prompt: object = None  # messages -> prompt text (the model's chat template)
    chat_ids: object = None  # messages -> prompt ids, no message's text a special id
    chat_params: object = None  # SamplingParams -> the same that stop at a turn's end (LLM's)
    constraint_index: object = None  # SamplingParams -> its compiled constraint (LLM's)


@dataclass
class GenerationRequest:
    kind: str  # "completion" or "chat"
    prompt_ids: list
    params: SamplingParams
    max_tokens_given: bool
    stop: tuple = ()
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False
    prompt_text: str | None = None
    id: str = ""
    created: int = 0

    def __post_init__(self):
        prefix = "cmpl" if self.kind == "completion" else "chatcmpl"
        self.id = self.id or f"{prefix}-{uuid.uuid4().hex}"
        self.created = self.created or int(time.time())


# ---------------------------------------------------------------- field checks

def _type_name(value):
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "integer", float: "number"}.get(type(value), type(value).__name__)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _wrong_type(name, expected, value):
    return bad_request(f"'{name}' must be {expected}, got {_type_name(value)} {value!r:.60}",
                       param=name, code="invalid_type")


def _optional(body, name, check, expected, default=None):
    value = body.get(name)
    if value is None:
        return default
    if not check(value):
        raise _wrong_type(name, expected, value)
    return value


def _unsupported(body, name, allowed, what):
    value = body.get(name)
    if value is not None and value not in allowed:
        raise bad_request(f"'{name}'={value!r:.60} is not supported by this server ({what})",
                          param=name, code="unsupported_parameter")


def _check_body(body, model: ModelInfo):
    """A JSON object, and the served model if it names one."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {_type_name(body)}")
    name = body.get("model")
    if name is None:
        return
    if not isinstance(name, str):
        raise _wrong_type("model", "a string", name)
    if name != model.name:
        raise APIError(404, f"The model `{name}` does not exist. This server serves "
                            f"`{model.name}` (GET /v1/models).",
                       param="model", code="model_not_found")


def _stop_strings(body):
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _wrong_type("stop", "a string or an array of strings", stop)
    if len(stop) > MAX_STOP_STRINGS:
        raise bad_request(f"'stop' holds {len(stop)} strings; at most {MAX_STOP_STRINGS}",
                          param="stop")
    return tuple(s for s in stop if s)


def _stream_options(body, stream):
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise _wrong_type("stream_options", "an object", options)
    if not stream:
        raise bad_request("'stream_options' is only allowed with 'stream': true",
                          param="stream_options")
    include = options.get("include_usage", False)
    if not isinstance(include, bool):
        raise _wrong_type("stream_options.include_usage", "a boolean", include)
    return include


GUIDED = {"guided_json": "response_format json_schema, or structured_outputs.json",
          "guided_regex": "structured_outputs.regex", "guided_choice": "structured_outputs.choice",
          "guided_grammar": "nothing here (grammars are not supported)",
          "guided_decoding_backend": "nothing (there is one backend)",
          "guided_whitespace_pattern": "nothing (whitespace is at most one space)"}


def _structured_outputs(body):
    """(StructuredOutputsParams or None, the field it came from) of response_format or
    vLLM's structured_outputs; 400 naming a bad one, or an old guided_* field."""
    for name, instead in GUIDED.items():
        if body.get(name) is not None:
            raise bad_request(f"'{name}' is no longer supported (vLLM removed it in v0.12 and "
                              f"ignores it); use {instead}", param=name,
                              code="unsupported_parameter")
    fmt, extra = body.get("response_format"), body.get("structured_outputs")
    found = []
    if fmt is not None:
        if not isinstance(fmt, dict):
            raise _wrong_type("response_format", "an object", fmt)
        kind = fmt.get("type")
        if kind == "json_object":
            found.append(("response_format", dict(json_object=True)))
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise bad_request("'response_format.json_schema' must be an object with a "
                                  "'name' string and a 'schema'", param="response_format")
            if not isinstance(spec.get("schema"), dict):
                raise _wrong_type("response_format.json_schema.schema", "an object",
                                  spec.get("schema"))
            if not isinstance(spec.get("strict", False), (bool, type(None))):
                raise _wrong_type("response_format.json_schema.strict", "a boolean",
                                  spec.get("strict"))
            found.append(("response_format", dict(json=spec["schema"])))
        elif kind != "text":
            raise bad_request(f"'response_format.type' must be text, json_object or "
                              f"json_schema, got {kind!r:.40}", param="response_format")
    if extra is not None:
        if not isinstance(extra, dict):
            raise _wrong_type("structured_outputs", "an object", extra)
        unknown = sorted(set(extra) - set(KINDS))
        if unknown:
            raise bad_request(f"'structured_outputs.{unknown[0]}' is not supported (take "
                              f"{', '.join(KINDS)})", param="structured_outputs")
        found.append(("structured_outputs", extra))
    if len(found) > 1:
        raise bad_request("give response_format or structured_outputs, not both",
                          param="structured_outputs")
    if not found:
        return None, None
    param, fields = found[0]
    try:
        return StructuredOutputsParams(**fields), param
    except ValueError as exc:
        raise bad_request(str(exc), param=param) from None


def _common(body, model: ModelInfo, kind, prompt_ids, prompt_text, max_tokens_name):
    """The fields both endpoints share, checked; the GenerationRequest."""
    for name in ("n", "best_of"):
        _unsupported(body, name, (1,), "one completion per request")
    for name in ("presence_penalty", "frequency_penalty"):
        _unsupported(body, name, (0, 0.0), "no penalties")
    _unsupported(body, "logprobs", (False,), "no log-probabilities")
    _unsupported(body, "top_logprobs", (0,), "no log-probabilities")
    _unsupported(body, "echo", (False,), "no echo")
    _unsupported(body, "suffix", ("",), "no suffix")
    if body.get("logit_bias"):
        raise bad_request("'logit_bias' is not supported by this server", param="logit_bias",
                          code="unsupported_parameter")

    stream = _optional(body, "stream", lambda v: isinstance(v, bool), "a boolean", False)
    include_usage = _stream_options(body, stream)
    temperature = _optional(body, "temperature", _is_number, "a number", DEFAULT_TEMPERATURE)
    if not math.isfinite(temperature) or temperature < 0:
        raise bad_request(f"'temperature' must be >= 0, got {temperature!r}", param="temperature")
    top_k = _optional(body, "top_k", is_int, "an integer")
    if top_k is not None and (top_k < -1 or top_k > model.vocab):
        raise bad_request(f"'top_k' must be -1 or 0 (all tokens) or 1..{model.vocab}, got {top_k}",
                          param="top_k")
    top_p = _optional(body, "top_p", _is_number, "a number", 1.0)
    if not 0 < top_p <= 1:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p!r}", param="top_p")
    min_p = _optional(body, "min_p", _is_number, "a number", 0.0)
    if not 0 <= min_p <= 1:
        raise bad_request(f"'min_p' must be in [0, 1], got {min_p!r}", param="min_p")
    seed = _optional(body, "seed", is_int, "an integer")
    if seed is not None and seed < 0:
        raise bad_request(f"'seed' must be >= 0, got {seed}", param="seed")
    ignore_eos = _optional(body, "ignore_eos", lambda v: isinstance(v, bool), "a boolean", False)
    stop_ids = _optional(body, "stop_token_ids",
                         lambda v: isinstance(v, list) and all(is_int(t) for t in v),
                         "an array of integers", [])
    _check_ids(stop_ids, model, "stop_token_ids")
    return_ids = _optional(body, "return_token_ids", lambda v: isinstance(v, bool), "a boolean",
                           False)
    structured, structured_param = _structured_outputs(body)
    stop = _stop_strings(body)
    if stop and model.tokenizer is None:
        raise bad_request("'stop' strings need a tokenizer; this model has none (use "
                          "stop_token_ids)", param="stop")

    n = len(prompt_ids)
    room = min(model.max_seq - n, model.kv_tokens + 1 - n)
    if body.get(max_tokens_name) is None:
        max_tokens_name = "max_tokens"  # chat takes the older name too
    max_tokens = body.get(max_tokens_name)
    given = max_tokens is not None
    if given:
        if not is_int(max_tokens):
            raise _wrong_type(max_tokens_name, "an integer", max_tokens)
        if max_tokens <= 0:
            raise bad_request(f"'{max_tokens_name}' must be at least 1, got {max_tokens}",
                              param=max_tokens_name)
    else:
        max_tokens = COMPLETIONS_MAX_TOKENS if kind == "completion" else max(room, 1)
    if n + max_tokens > model.max_seq:
        raise bad_request(
            f"This model's maximum context length is {model.max_seq} tokens. However, you "
            f"requested {n + max_tokens} tokens ({n} in the prompt, {max_tokens} for the "
            f"completion). Please reduce the length of the prompt or the completion.",
            param="max_tokens" if n < model.max_seq else "prompt", code="context_length_exceeded")
    if n + max_tokens - 1 > model.kv_tokens:
        raise bad_request(
            f"The request needs KV cache for {n + max_tokens - 1} positions ({n} in the prompt, "
            f"{max_tokens} for the completion, the last never stored) but this server's whole "
            f"KV pool holds {model.kv_tokens}. Please reduce the length of the prompt or the "
            f"completion.", param="max_tokens", code="context_length_exceeded")
    params = SamplingParams(temperature=float(temperature), top_k=top_k, top_p=float(top_p),
                            min_p=float(min_p), max_tokens=max_tokens, seed=seed,
                            ignore_eos=ignore_eos, stop_token_ids=tuple(stop_ids),
                            structured_outputs=structured)
    if kind == "chat" and model.chat_params is not None:
        params = model.chat_params(params)
    if structured is not None and model.constraint_index is not None:
        try:  # compiled here, in the handler: a bad schema is this request's 400
            model.constraint_index(params)
        except ValueError as exc:
            raise bad_request(str(exc), param=structured_param) from None
    return GenerationRequest(kind, prompt_ids, params, given, stop=stop, stream=stream,
                             include_usage=include_usage, return_token_ids=return_ids,
                             prompt_text=prompt_text)


def _encode(model: ModelInfo, text, param):
    if model.tokenizer is None:
        raise bad_request(f"this model has no tokenizer: give '{param}' as token ids",
                          param=param)
    with warnings.catch_warnings():  # characters with no token: encode drops them, as offline
        warnings.simplefilter("ignore")
        return model.tokenizer.encode(text)


def _check_ids(ids, model: ModelInfo, param):
    for t in ids:
        if not 0 <= t < model.vocab:
            raise bad_request(f"'{param}' holds token id {t}, outside [0, {model.vocab})",
                              param=param)
    return list(ids)


def parse_completion(body, model: ModelInfo) -> GenerationRequest:
    """A POST /v1/completions body, checked."""
    _check_body(body, model)
    if "prompt" not in body:
        raise bad_request("'prompt' is required", param="prompt", code="missing_required_parameter")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    text = None
    if isinstance(prompt, str):
        text, ids = prompt, _encode(model, prompt, "prompt")
    elif isinstance(prompt, list) and all(is_int(t) for t in prompt):
        ids = _check_ids(prompt, model, "prompt")
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request(f"'prompt' holds {len(prompt)} prompts; this server takes one per "
                          f"request", param="prompt")
    else:
        raise _wrong_type("prompt", "a string or an array of token ids", prompt)
    if not ids:
        raise bad_request("'prompt' is empty", param="prompt")
    return _common(body, model, "completion", ids, text, "max_tokens")


def parse_chat(body, model: ModelInfo) -> GenerationRequest:
    """A POST /v1/chat/completions body, checked; the messages through the chat template."""
    _check_body(body, model)
    messages = body.get("messages")
    if messages is None:
        raise bad_request("'messages' is required", param="messages",
                          code="missing_required_parameter")
    if not isinstance(messages, list):
        raise _wrong_type("messages", "an array of messages", messages)
    if not messages:
        raise bad_request("'messages' is empty", param="messages")
    if model.tokenizer is None or model.chat_prompt is None or model.chat_ids is None:
        raise bad_request("this model has no tokenizer and chat template; use /v1/completions "
                          "with token ids", param="messages")
    turns = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _wrong_type(where, "an object with 'role' and 'content'", message)
        role, content = message.get("role"), message.get("content")
        if role not in CHAT_ROLES:
            raise bad_request(f"'{where}.role' must be one of {', '.join(CHAT_ROLES)}, got "
                              f"{role!r:.40}", param=f"{where}.role")
        if isinstance(content, list):  # content parts: text ones only
            parts = []
            for part in content:
                if not (isinstance(part, dict) and part.get("type") == "text"
                        and isinstance(part.get("text"), str)):
                    raise bad_request(f"'{where}.content' parts must be "
                                      f"{{\"type\": \"text\", \"text\": ...}}; this model reads "
                                      f"text only", param=f"{where}.content")
                parts.append(part["text"])
            content = "".join(parts)
        if not isinstance(content, str):
            raise _wrong_type(f"{where}.content", "a string", content)
        turns.append({"role": role, "content": content})
    text = model.chat_prompt(turns)
    with warnings.catch_warnings():  # characters with no token: dropped, as offline
        warnings.simplefilter("ignore")
        # A message's content never parses special tokens: no message forges a turn.
        ids = model.chat_ids(turns)
    return _common(body, model, "chat", ids, text, "max_completion_tokens")


# ---------------------------------------------------------------- responses

def usage(prompt_tokens, completion_tokens) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _choice(req, text, finish_reason, token_ids=None, *, chunk=False):
    key = "text" if req.kind == "completion" else "delta" if chunk else "message"
    content = {"role": "assistant", "content": text} if key == "message" else text
    choice = {"index": 0, key: content, "logprobs": None, "finish_reason": finish_reason}
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    return choice


def response(req: GenerationRequest, model_name, text, finish_reason, num_tokens,
             token_ids=None) -> dict:
    """The whole response of a request that did not stream."""
    body = {"id": req.id, "object": "text_completion" if req.kind == "completion"
            else "chat.completion", "created": req.created, "model": model_name,
            "choices": [_choice(req, text, finish_reason,
                                token_ids if req.return_token_ids else None)],
            "usage": usage(len(req.prompt_ids), num_tokens)}
    if req.return_token_ids:
        body["prompt_token_ids"] = list(req.prompt_ids)
    return body


def chunk(req: GenerationRequest, model_name, text, finish_reason=None, token_ids=None,
          *, first=False) -> dict:
    """One streamed chunk: new text (chat: a delta, with the role in the first one)."""
    if req.kind == "chat":
        delta = {"role": "assistant", "content": text} if first else \
            ({"content": text} if text or finish_reason is None else {})
        text = delta
    body = {"id": req.id, "object": "text_completion" if req.kind == "completion"
            else "chat.completion.chunk", "created": req.created, "model": model_name,
            "choices": [_choice(req, text, finish_reason,
                                token_ids if req.return_token_ids else None, chunk=True)]}
    if req.include_usage:
        body["usage"] = None
    return body


def usage_chunk(req: GenerationRequest, model_name, num_tokens) -> dict:
    """stream_options.include_usage: the last chunk, no choices, the usage."""
    return {"id": req.id, "object": "text_completion" if req.kind == "completion"
            else "chat.completion.chunk", "created": req.created, "model": model_name,
            "choices": [], "usage": usage(len(req.prompt_ids), num_tokens)}


def models_list(model: ModelInfo, created) -> dict:
    return {"object": "list", "data": [{"id": model.name, "object": "model", "created": created,
                                        "owned_by": "transformer_lab",
                                        "max_model_len": model.max_seq}]}
