"""What the dialects share: errors, request fields, the served model's names, FIM prompts, and the one
streaming skeleton (`stream`), of which each dialect supplies only the formatting (`StreamFormat`)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterable, Sequence

from fastapi.responses import StreamingResponse

from pydantic import BaseModel, ConfigDict, Field

from localspec.engine.contract import ServedEngine
from localspec.engine.events import Prefill, Round, Summary
from localspec.engine.params import GenerationParams
from localspec.engine.request import check_length
from localspec.engine.sampling import SamplingSettings
from localspec.errors import ContextOverflowError, EngineUnavailableError, LocalspecError
from localspec.server.scheduler import Job, Scheduler
from localspec.structured import CALL_OPEN, Tool, call_grammar


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def api_error(exc: Exception) -> ApiError:
    """The API error a failure is answered with: the request's fault (400; a prompt over the context
    with llama.cpp's own kind), a worker or the engine gone (503), or the engine failing (500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextOverflowError):
        return ApiError(400, str(exc), "exceed_context_size_error")
    if isinstance(exc, EngineUnavailableError):
        return ApiError(503, str(exc), "unavailable_error")
    if isinstance(exc, LocalspecError):
        return ApiError(400, str(exc))
    return ApiError(500, str(exc), "server_error")


class Loose(BaseModel):
    """Requests carry many fields we do not use (llama.cpp's `samplers`, `cache_prompt`, …): accept them."""

    model_config = ConfigDict(extra="allow")


class SamplingFields(Loose):
    temperature: float | None = Field(None, ge=0, le=5)
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    min_p: float | None = Field(None, ge=0, lt=1)
    repeat_penalty: float | None = Field(None, gt=0)
    seed: int | None = None
    stop: list[str] | str | None = None
    drafter: str | None = None           # localspec: auto | model | self | ngram | none
    draft_len: int | None = Field(None, ge=0, le=32)
    # The longest draft a request allows, as Ollama (an option) and llama.cpp (flat dotted keys) name it;
    # 0 switches drafting off. llama.cpp's n_min: shorter drafts are not made.
    draft_num_predict: int | None = Field(None, ge=0)
    speculative_n_max: int | None = Field(None, ge=0, alias="speculative.n_max")
    speculative_n_min: int | None = Field(None, ge=0, alias="speculative.n_min")
    grammar: str | None = None           # llama.cpp's: GBNF every token must follow
    json_schema: dict | None = None      # llama.cpp's: a JSON schema the answer must follow


# Fields the dialects define that would change the output, and when they ask for something localspec does
# not do (their neutral values pass): refused with a 400 naming them rather than silently ignored.
_NOT_DONE: dict[str, Callable[[Any], bool]] = {
    "logprobs": bool, "top_logprobs": lambda v: v is not None, "n_probs": bool, "logit_bias": bool,
    "presence_penalty": bool, "frequency_penalty": bool, "best_of": lambda v: (v or 1) > 1,
    "mirostat": bool, "typical_p": lambda v: v not in (None, 1, 1.0), "tfs_z": lambda v: v not in (None, 1, 1.0),
    "dry_multiplier": bool, "xtc_probability": bool, "ignore_eos": bool,
}


def refuse_unsupported(fields: dict[str, Any]) -> None:
    """A 400 for the first field in `fields` that asks for what localspec does not do (see _NOT_DONE)."""
    for name, used in _NOT_DONE.items():
        if name in fields and used(fields[name]):
            raise ApiError(400, f"{name} is not supported by localspec; send the request without it.")


_SAMPLER_NAMES = {"top_k": "top_k", "top-k": "top_k", "k": "top_k", "top_p": "top_p", "top-p": "top_p", "p": "top_p",
                  "nucleus": "top_p", "min_p": "min_p", "min-p": "min_p", "m": "min_p", "temperature": "temperature",
                  "temp": "temperature", "t": "temperature", "infill": "infill", "i": "infill"}


def sampler_chain(samplers: list[str] | str | None) -> tuple[str, ...] | None:
    """llama.cpp's `samplers` (names, or a string of their letters as in "kpi") as the engine's chain;
    steps the engine does not offer (dry, xtc, typ_p, …) are left out, as llama.cpp leaves out unknown names."""
    if samplers is None:
        return None
    names = list(samplers) if isinstance(samplers, str) else samplers
    return tuple(_SAMPLER_NAMES[n.lower()] for n in names if n.lower() in _SAMPLER_NAMES)


def compact(obj: Any) -> bytes:
    """llama.vim matches `"content"\\s*:"`: no spaces after separators. A lone surrogate a client sent (an
    unknown model's name echoed in an error) is written as its JSON escape, as it arrived: UTF-8 has no
    byte for it."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8", "backslashreplace")


def answers_to(aliases: frozenset[str], requested: str) -> bool:
    """Whether a model that answers to `aliases` is the one `requested` names (Ollama's clients add ":latest")."""
    base = requested[:-len(":latest")] if requested.endswith(":latest") else requested
    return requested in aliases or base in aliases


@dataclass
class Served:
    """The loaded engine and the names clients may call it by."""

    engine: ServedEngine
    scheduler: Scheduler
    name: str
    aliases: frozenset[str]
    size: int = 0
    family: str = ""
    quantization: str = ""
    created: int = 0
    temperature: float | None = None   # for requests that set none (`serve --temp`); None: each dialect's default
    embeddings: list = field(default_factory=list)  # what answers embedding requests (server/embeddings.py), first the default
    images_from_files: bool = False  # image_url may name a local file:// (`serve --allow-image-files`)
    images_from_urls: bool = False   # or a remote URL the server fetches (`serve --allow-image-urls`)

    def check_model(self, requested: str | None) -> None:
        if requested and not answers_to(self.aliases, requested):
            raise ApiError(404, f"Unknown model '{requested}'. This server runs '{self.name}' "
                                f"(also answers to: {', '.join(sorted(self.aliases - {self.name}))}).",
                           "not_found_error")

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    @property
    def vocab(self):
        return self.engine.vocab

    def text_tokens(self, text: str, *, special: bool, images: list[bytes] | None = None) -> list[int]:
        """A prompt sent as text. `special`: parse special tokens in it, as llama.cpp's `/completion` and
        Ollama's `raw` mode do, whose clients write chat-template and FIM markers as text. OpenAI's
        legacy completions and localspec's own prompts do not: there a typed '<|im_end|>' is text, never
        the end of a turn. (Prefix and suffix of an infill are never parsed: see `fim_tokens`.)"""
        if images:  # (a raw prompt with images: MEDIA_MARKER where each stands, special tokens parsed)
            self._can_see()
            try:
                return self.engine.image_tokens(text, images)
            except LocalspecError as exc:
                raise ApiError(400, str(exc)) from None
        return self.vocab.tokenize(text, add_special=True, parse_special=special)

    def chat_tokens(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """A conversation through the model's chat template; a template that rejects it, or an image that
        cannot be used, is a 400."""
        if any(m.get("images") for m in messages):
            self._can_see()
        try:
            return self.engine.chat_tokens(messages, tools)
        except LocalspecError as exc:
            raise ApiError(400, str(exc)) from None

    def _can_see(self) -> None:
        if self.engine.projector is None:
            raise ApiError(400, f"Model '{self.name}' cannot see images: serve it with its projector "
                                "(--mmproj PATH, or a catalog model that lists one).")

    def sampling(self, f: SamplingFields, default_temperature: float, seed: int | None = None,
                 grammar: str | None = None, trigger: str | None = None,
                 logprobs: int | None = None) -> SamplingSettings:
        """`seed`: this completion's own, over the request's (n_cmpl: the request's seed plus its index);
        `logprobs`: alternatives per token when log-probabilities are asked for (server/logprobs.py)."""
        d = SamplingSettings()
        return SamplingSettings(
            temperature=f.temperature if f.temperature is not None else
            self.temperature if self.temperature is not None else default_temperature,
            top_k=d.top_k if f.top_k is None else f.top_k,
            top_p=d.top_p if f.top_p is None else f.top_p,
            min_p=d.min_p if f.min_p is None else f.min_p,
            repeat_penalty=d.repeat_penalty if f.repeat_penalty is None else f.repeat_penalty,
            seed=seed if seed is not None else f.seed,
            samplers=sampler_chain(getattr(f, "samplers", None)),
            grammar=grammar,
            grammar_trigger=trigger,
            logprobs=logprobs,
        )

    def job(self, tokens: list[int], max_tokens: int | None, f: SamplingFields, default_temperature: float,
            endpoint: str, seed: int | None = None, grammar: str | None = None, urgent: bool = False,
            tools: list[Tool] | None = None, parallel_calls: bool = False, logprobs: int | None = None,
            n: int = 1) -> Job:
        """The request for the scheduler, its settings fixed here (`GenerationParams`); `n` sequences of
        the prompt, the i-th seeded with the request's seed plus i; `grammar`: the GBNF the dialect's
        structured-output fields ask for (localspec/structured.py); `urgent`: a completion at an editor's
        cursor (it runs between the rounds of a generation that holds the engine, scheduler.py); `tools`
        the model may call, where no grammar is asked for: free text until the model opens a call, then
        the call follows the tools' schemas (llama.cpp's lazy grammar, as its server does;
        `parallel_calls`: one call or several)."""
        refuse_unsupported(f.model_extra or {})
        trigger = None
        if tools and grammar is None:
            grammar, trigger = call_grammar(tools, several=parallel_calls), CALL_OPEN
        check_length(len(tokens), self.n_ctx)
        room = self.n_ctx - len(tokens)
        if max_tokens is None or max_tokens < 0:
            max_tokens = room
        stops = [f.stop] if isinstance(f.stop, str) else list(f.stop or [])
        seed = seed if seed is not None else f.seed
        samplings = tuple(self.sampling(f, default_temperature, None if seed is None else seed + i, grammar, trigger,
                                        logprobs) for i in range(n))
        longest = f.draft_num_predict if f.draft_num_predict is not None else f.speculative_n_max
        params = GenerationParams(max(1, min(max_tokens, room)), samplings, tuple(stops), f.drafter,
                                  "default" if f.draft_len is None else f.draft_len, longest, f.speculative_n_min or 0)
        return Job(tokens, params, endpoint=endpoint, urgent=urgent)

    async def start(self, job: Job, request=None) -> tuple[Prefill, AsyncIterator]:
        """Queue the job and wait for its prefill, so a bad request fails before any response is sent.
        A client that goes away while its request waits in the queue takes the request with it (an editor
        abandons a completion the moment the user types on): it is never run."""
        events = self.scheduler.generate(job)
        watcher = asyncio.create_task(guard_disconnect(request, job)) if request is not None else None
        try:
            first = await events.__anext__()
        except StopAsyncIteration:
            if job.cancel.is_set():
                raise ApiError(400, "The client went away before its request started.") from None
            raise ApiError(503, "The server is shutting down.", "unavailable_error") from None
        except (LocalspecError, RuntimeError) as exc:
            raise api_error(exc) from None
        finally:
            if watcher is not None:
                watcher.cancel()
        first = first[1]  # (sequence, event): the first sequence's prefill comes first
        if not isinstance(first, Prefill):
            raise ApiError(500, "The engine did not start with the prompt.", "server_error")
        return first, events


async def guard_disconnect(request, job: Job, interval: float = 0.1) -> None:
    """Cancel the request once its client is gone: while it waits in the queue, and while a
    non-streaming one generates (a streaming response notices by itself)."""
    while not job.cancel.is_set():
        if await request.is_disconnected():
            job.cancel.set()
            return
        await asyncio.sleep(interval)


async def collect(request, job: Job, events: AsyncIterator,
                  on_round: Callable[[int, Round], None] | None = None) -> tuple[dict[int, Prefill], list[Summary]]:
    """Run a request to the summary of each sequence (non-streaming), cancelling it if the client
    disconnects: each sequence's prefill but the first's (`Served.start` took that one), and summary."""
    watcher = asyncio.create_task(guard_disconnect(request, job))
    prefills: dict[int, Prefill] = {}
    summaries: dict[int, Summary] = {}
    try:
        async for i, event in events:
            if isinstance(event, Prefill):
                prefills[i] = event
            elif isinstance(event, Round):
                if on_round is not None:
                    on_round(i, event)
            elif isinstance(event, Summary):
                summaries[i] = event
        if len(summaries) != job.params.n:
            raise ApiError(500, "The generation ended without a result.", "server_error")
        return prefills, [summaries[i] for i in range(job.params.n)]
    except (LocalspecError, RuntimeError) as exc:
        raise api_error(exc) from None
    finally:
        watcher.cancel()


def finish_reason(summary: Summary) -> str:
    """OpenAI's `finish_reason` and Ollama's `done_reason`: the budget or the context ran out, or not."""
    return "length" if summary.stop_reason in ("length", "context") else "stop"


@dataclass
class StreamFormat:
    """What one dialect writes for the events of a stream; `stream` is the rest, shared."""

    media_type: str
    round: Callable[[Round], bytes | None]          # a chunk for a round's text, or None for nothing
    summary: Callable[[Summary], Iterable[bytes]]   # the closing chunk(s) with the statistics
    error: Callable[[ApiError], bytes]              # a failure after the response has started
    opening: Iterable[bytes] = ()
    closing: Iterable[bytes] = ()                   # after the summary (not after an error)
    # Several sequences of one prompt: each sequence's events handled by its own format's round and
    # summary (opening, closing and error are this one's); one sequence: this one's.
    choices: Sequence["StreamFormat"] = ()


def stream(events: AsyncIterator, fmt: StreamFormat) -> StreamingResponse:
    """A streamed response: the dialect's chunks for each event; an error mid-stream becomes the
    dialect's error chunk (the status line is long gone); the generation is cancelled if the client
    leaves (closing `events` does that)."""

    async def body():
        try:
            for chunk in fmt.opening:
                yield chunk
            async for i, event in events:
                own = fmt.choices[i] if fmt.choices else fmt
                if isinstance(event, Round):
                    chunk = own.round(event)
                    if chunk:
                        yield chunk
                elif isinstance(event, Summary):
                    for chunk in own.summary(event):
                        yield chunk
            for chunk in fmt.closing:
                yield chunk
        except (ApiError, LocalspecError, RuntimeError) as exc:  # the engine failed mid-answer: it keeps serving
            yield fmt.error(api_error(exc))
        finally:
            await events.aclose()

    return StreamingResponse(body(), media_type=fmt.media_type)


def speculation(summary: Summary) -> dict:
    """localspec's statistics, in a key clients ignore."""
    return {
        "drafter": summary.drafter,
        "drafted": summary.drafted,
        "accepted": summary.accepted,
        "acceptance_rate": round(summary.acceptance_rate, 4),
        "mean_accepted_per_round": round(summary.mean_accepted_per_round, 3),
        "rounds": summary.rounds,
        "tokens_per_s": round(summary.tokens_per_s, 3),
        "baseline_tokens_per_s": round(summary.baseline_tokens_per_s, 3),
        "speedup": round(summary.speedup, 3),
        "baseline_measured": summary.baseline_measured,
        "first_token_s": round(summary.first_token_s, 4),
        "acceptance_by_position": [round(x, 4) for x in summary.acceptance_by_position],
        "by_drafter": {name: [drafted, summary.accepted_by_drafter.get(name, 0)]  # draft tokens made, kept
                       for name, drafted in summary.drafted_by_drafter.items()},
    }


# ----------------------------------------------------------------------------- fill-in-the-middle


def fim_tokens(served: Served, prefix: str, suffix: str, extra: list[tuple[str, str]], prompt: str = "",
               n_predict: int = 128) -> list[int]:
    """llama.cpp's infill prompt: [BOS] extra FIM_PRE prefix+prompt FIM_SUF suffix FIM_MID.

    The budget keeps the tail of the prefix and the head of the suffix; the extra context (other files)
    gets what is left.
    """
    v = served.vocab
    if v.fim_pre < 0 or v.fim_suf < 0 or v.fim_mid < 0:
        raise ApiError(400, "Infill is not supported by this model: it has no FIM tokens "
                            "(use a code model such as Qwen2.5-Coder).", "not_supported_error")
    pre = v.tokenize(prefix + prompt, add_special=False, parse_special=False)
    suf = v.tokenize(suffix, add_special=False, parse_special=False)
    budget = served.n_ctx - max(n_predict, 16) - 4
    keep_suf = min(len(suf), budget // 4)
    keep_pre = min(len(pre), budget - keep_suf)
    pre, suf = pre[len(pre) - keep_pre:], suf[:keep_suf]
    extra_tokens: list[int] = []
    if extra:
        if v.fim_rep >= 0 and v.fim_sep >= 0:
            extra_tokens = [v.fim_rep] + v.tokenize("myproject\n", add_special=False)
            for filename, text in extra:
                extra_tokens += [v.fim_sep] + v.tokenize(f"{filename}\n{text}", add_special=False)
            extra_tokens += [v.fim_sep] + v.tokenize("filename\n", add_special=False)
        else:
            for filename, text in extra:
                extra_tokens += v.tokenize(f"--- {filename} ---\n{text}\n", add_special=False)
        room = budget - len(pre) - len(suf)
        extra_tokens = extra_tokens[max(0, len(extra_tokens) - max(room, 0)):] if room > 0 else []
    head = [v.bos] if v.add_bos and v.bos >= 0 else []
    return head + extra_tokens + [v.fim_pre] + pre + [v.fim_suf] + suf + [v.fim_mid]
