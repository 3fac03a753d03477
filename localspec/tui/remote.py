"""`localspec chat --connect`: the chat app on a running `localspec serve`, over its Unix socket.

One copy of the models serves the editor and the chat. The server's native stream carries the same
events the in-process engine yields, so the app cannot tell the difference.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

from localspec import paths
from localspec.engine.contract import ChatEngine, describe_drafters
from localspec.engine.events import Event, Prefill, Round, Summary, Tally
from localspec.errors import LocalspecError
from localspec.tui.provider import Choice

if TYPE_CHECKING:
    from localspec.engine.sampling import SamplingSettings


def _event(data: dict):
    kind = data.pop("type", None)
    if kind == "prefill":
        return Prefill(**data)
    if kind == "round":
        data["accepted"], data["rejected"] = tuple(data["accepted"]), tuple(data["rejected"])
        data["pieces"] = tuple(data["pieces"])
        return Round(**data)
    if kind == "summary":
        for key in ("acceptance_by_position", "drafted_by_position", "kept_by_position"):
            if key in data:
                data[key] = tuple(data[key])
        return Summary(**data)
    if kind == "error":
        raise LocalspecError(data.get("message", "The server reported an error."))
    return None


class RemoteEngine:
    """A `ChatEngine` whose model runs in `localspec serve`."""

    def __init__(self, client, info: dict):
        self.client = client
        self.info = info

    @property
    def n_ctx(self) -> int:
        return int(self.info["n_ctx"])

    @property
    def drafters(self) -> tuple[str, ...]:
        return tuple(self.info["drafters"])

    @property
    def baseline_tokens_per_s(self) -> float:
        return float(self.info.get("baseline_tokens_per_s", 0.0))

    @property
    def warnings(self) -> list[str]:
        return []  # the server said them where it was started

    @property
    def sees_images(self) -> bool:
        return bool(self.info.get("sees_images"))

    def chat(self, messages: Sequence[dict], *, max_tokens: int = 512, sampling: SamplingSettings | None = None,
             drafter: str | None = None, draft_len: int | None | str = "default", stop: Sequence[str] = (),
             cancel: threading.Event | None = None, draft_max: int | None = None,
             draft_min: int = 0) -> Iterator[Event]:
        body: dict = {"messages": [_sent(m) for m in messages], "max_tokens": max_tokens, "drafter": drafter,
                      "stop": list(stop)}
        if draft_len != "default":
            body["draft_len"] = draft_len
        if draft_max is not None:  # llama.cpp's names for the bounds (docs/serve.md)
            body["speculative.n_max"] = draft_max
        if draft_min:
            body["speculative.n_min"] = draft_min
        if sampling is not None:
            body |= {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
                     "min_p": sampling.min_p, "repeat_penalty": sampling.repeat_penalty, "seed": sampling.seed,
                     "grammar": sampling.grammar}
        return self._events(body, cancel or threading.Event())

    def _events(self, body: dict, cancel: threading.Event):
        import httpx

        tally, prefill, text, t0 = Tally(), None, "", time.perf_counter()
        try:
            with self.client.stream("POST", "/localspec/v1/generate", json=body) as response:
                if response.status_code != 200:
                    response.read()
                    raise LocalspecError(_message(response))
                for line in response.iter_lines():
                    if not line:
                        continue
                    event = _event(json.loads(line))
                    if isinstance(event, Prefill):
                        prefill = event
                    elif isinstance(event, Round):
                        tally.add(event)
                        text += event.text
                    if event is not None:
                        yield event
                    if isinstance(event, Summary):
                        return
                    if cancel.is_set():
                        break  # closing the stream is how the server learns to stop
        except httpx.HTTPError as exc:
            raise LocalspecError(f"Lost the server: {exc}") from None
        # Cancelled here: the server never sent its summary, so make one from what arrived.
        yield tally.summary(text=text, stop_reason="cancelled", prefill=prefill or Prefill(0, 0, 0, 0.0),
                            wall_s=time.perf_counter() - t0, baseline_tokens_per_s=self.baseline_tokens_per_s,
                            drafter=str(body.get("drafter") or "auto"))

    def maintain(self, interrupt: Callable[[], bool] = lambda: False) -> str:
        return ""  # the server maintains its engine when it is idle

    def close(self) -> None:
        self.client.close()


def _message(response) -> str:
    try:
        err = response.json().get("error")
        return str(err.get("message") if isinstance(err, dict) else err)
    except ValueError:
        return f"The server answered {response.status_code}."


class RemoteProvider:
    """One choice: whatever the server runs."""

    def __init__(self, socket_path: str | Path | None = None):
        self.socket = Path(socket_path) if socket_path else paths.server_socket()

    def _client(self):
        import httpx

        if not self.socket.exists():
            raise LocalspecError(f"No server socket at {self.socket}. Start one with `localspec serve`, "
                                 "or name its socket with --socket.")
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://localhost",
                            timeout=httpx.Timeout(10.0, read=None))

    def _info(self) -> dict:
        import httpx

        with self._client() as client:
            try:
                return client.get("/localspec/v1/info").json()
            except httpx.HTTPError as exc:
                raise LocalspecError(f"The server at {self.socket} does not answer: {exc}") from None

    def choices(self) -> list[Choice]:
        try:
            info = self._info()
        except LocalspecError:
            return []
        drafts = describe_drafters(RemoteEngine(None, info).drafters)
        return [Choice(info["model"], "pair" if info.get("has_draft") else "model", f"served by localspec serve ({drafts})",
                       None, True, default=True)]

    def default_id(self) -> str:
        return self._info()["model"]

    def is_ready(self, entry_id: str) -> bool:
        return True

    def pull(self, entry_id, say) -> None:
        raise LocalspecError("Connected to a server: pull models where the server runs.")

    def pull_progress(self, entry_id):
        return (0, None)

    def load(self, entry_id: str):
        info = self._info()
        if entry_id and entry_id != info["model"]:
            raise LocalspecError(f"The server runs '{info['model']}', not '{entry_id}'.")
        return RemoteEngine(self._client(), info)


_: type[ChatEngine] = RemoteEngine  # the contract, checked by mypy


def _sent(message: dict) -> dict:
    """A message as JSON carries it: its images base64 (their places stay marked in its text)."""
    if not message.get("images"):
        return message
    return {**message, "images": [base64.b64encode(data).decode() for data in message["images"]]}
