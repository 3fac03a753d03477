"""User settings: what a new conversation starts with. YAML in the config dir, every key optional.

    # ~/.config/localspec/settings.yaml (see `localspec list --paths`)
    model: qwen2.5-coder-1.5b      # what `localspec chat` opens when no model is named
    history_drafts: true           # draft from earlier requests (kept under the cache folder); false: off
    rpc_workers: ""                # HOST:PORT,... of `localspec rpc-worker`s for the target (as --rpc)
    flash_attention: auto          # auto: llama.cpp's choice; on / off (off: faster after long contexts on CPUs)
    chat_draws: smooth             # smooth: the chat app redraws 10 times a second; sparingly: it draws only on
                                   # what llama.cpp leaves of the CPU (faster answers, fewer frames on small machines;
                                   # chat --connect always draws so, at full rate)
    chat:
      temperature: 0.0
      max_tokens: 1024
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from localspec import paths
from localspec.engine.params import DRAFTER_SETTINGS
from localspec.engine.sampling import SamplingSettings
from localspec.errors import LocalspecError

_SAMPLING = SamplingSettings()  # the sampling defaults live there, once


OUTPUTS = ("text", "json")


@dataclass(frozen=True)
class ChatSettings:
    """The settings of one conversation. Defaults favour code: greedy decoding, adaptive drafts."""

    drafter: str = "auto"              # auto: the draft model or n-gram lookups, whichever the costs favour
    draft_len: int | None = None       # None: adaptive; a number: always draft that many tokens
    temperature: float = _SAMPLING.temperature  # greedy: reproducible, and what speculation gains most on
    top_k: int = _SAMPLING.top_k
    top_p: float = _SAMPLING.top_p
    min_p: float = _SAMPLING.min_p
    repeat_penalty: float = _SAMPLING.repeat_penalty
    seed: int | None = None
    max_tokens: int = 1024
    system: str = ""
    output: str = "text"               # text, or json: every answer is a JSON value (a grammar constrains it)

    def validated(self) -> "ChatSettings":
        problems = []
        if self.drafter not in DRAFTER_SETTINGS:
            problems.append(f"drafter must be one of {', '.join(DRAFTER_SETTINGS)}")
        if self.draft_len is not None and not 0 <= self.draft_len <= 32:
            problems.append("draft length must be 'auto' or 0-32")
        if not 0.0 <= self.temperature <= 5.0:
            problems.append("temperature must be between 0 and 5")
        if self.top_k < 0:
            problems.append("top-k must be 0 (off) or more")
        if not 0.0 < self.top_p <= 1.0:
            problems.append("top-p must be in (0, 1]")
        if not 0.0 <= self.min_p < 1.0:
            problems.append("min-p must be in [0, 1)")
        if self.repeat_penalty <= 0:
            problems.append("repeat penalty must be positive")
        if self.max_tokens < 1:
            problems.append("max tokens must be at least 1")
        if self.output not in OUTPUTS:
            problems.append(f"output must be {' or '.join(OUTPUTS)}")
        if problems:
            raise LocalspecError("; ".join(problems).capitalize() + ".")
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None, base: "ChatSettings | None" = None) -> "ChatSettings":
        """Known keys with the right types win over `base`; anything else is ignored (old or hand-edited data)."""
        base = base or cls()
        if not isinstance(data, dict):
            return base
        known = {f.name: f for f in fields(cls)}
        changes: dict[str, Any] = {}
        for key, value in data.items():
            if key not in known:
                continue
            current = getattr(cls(), key)
            try:
                if value is None:
                    if key in ("draft_len", "seed"):
                        changes[key] = None
                elif isinstance(current, bool):
                    changes[key] = bool(value)
                elif isinstance(current, float):
                    changes[key] = float(value)
                elif isinstance(current, int) or key in ("draft_len", "seed"):
                    changes[key] = int(value)
                else:
                    changes[key] = str(value)
            except (TypeError, ValueError):
                continue
        return replace(base, **changes)

    def sampling(self) -> SamplingSettings:
        grammar = None
        if self.output == "json":
            from localspec.structured import json_grammar

            grammar = json_grammar()
        return SamplingSettings(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                                repeat_penalty=self.repeat_penalty, seed=self.seed, grammar=grammar)


@dataclass(frozen=True)
class UserConfig:
    model: str | None = None
    chat: ChatSettings = ChatSettings()
    history_drafts: bool = True
    rpc_workers: str = ""
    flash_attention: str = "auto"
    max_request_mb: float = 8.0   # `localspec serve` refuses larger request bodies with 413 (--max-request-mb)
    chat_draws: str = "smooth"    # "sparingly": the chat app's drawing yields the CPU to the engine

    def history(self, off: bool = False) -> str:
        """The engine's `history` option: a command's --no-history-drafts or this setting turns it off."""
        return "off" if off or not self.history_drafts else "saved"

    def flash_attn(self) -> bool | None:
        """The models' `flash_attn` option (backend.ModelOptions): None for auto, llama.cpp's choice."""
        return {"on": True, "off": False}.get(self.flash_attention)


def load_user_config() -> UserConfig:
    """settings.yaml, or defaults when it is absent. A broken file is an error that names it."""
    import yaml

    path = paths.settings_file()
    if not path.exists():
        return UserConfig()
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise LocalspecError(f"Cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise LocalspecError(f"{path} must be a mapping of settings (see the README, 'Chat').")
    chat = ChatSettings.from_dict(data.get("chat"))
    try:
        chat.validated()
    except LocalspecError as exc:
        raise LocalspecError(f"{path}: {exc}") from None
    model = data.get("model")
    history = data.get("history_drafts", True)
    if not isinstance(history, bool):
        raise LocalspecError(f"{path}: history_drafts must be true or false.")
    workers = data.get("rpc_workers") or ""
    if isinstance(workers, list):
        workers = ",".join(str(w) for w in workers)
    if not isinstance(workers, str):
        raise LocalspecError(f"{path}: rpc_workers must be HOST:PORT entries (a list, or one comma-separated string).")
    flash = data.get("flash_attention", "auto")
    flash = {True: "on", False: "off"}.get(flash, flash)  # YAML reads a bare on / off as true / false
    if flash not in ("auto", "on", "off"):
        raise LocalspecError(f"{path}: flash_attention must be auto, on or off.")
    draws = data.get("chat_draws", "smooth")
    if draws not in ("smooth", "sparingly"):
        raise LocalspecError(f"{path}: chat_draws must be smooth or sparingly.")
    max_mb = data.get("max_request_mb", UserConfig.max_request_mb)
    if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)) or max_mb <= 0:
        raise LocalspecError(f"{path}: max_request_mb must be a number of megabytes above 0.")
    return UserConfig(model=str(model) if model else None, chat=chat, history_drafts=history, rpc_workers=workers,
                      flash_attention=flash, max_request_mb=float(max_mb), chat_draws=draws)
