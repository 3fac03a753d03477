"""Turning conversations into tokens and tokens into streamed text.

- `ChatTemplate`: the model's own Jinja chat template from its GGUF, rendered with llama-cpp-python's
  formatter (no hand-written templates; llama.cpp's built-in chatml when a GGUF has none).
- `TextStream`: incremental UTF-8 decoding across token boundaries, and stop strings that may span
  tokens: text that could still become a stop string is held back until it cannot.
"""

from __future__ import annotations

import codecs
from typing import Any, Iterable, Sequence, cast

Message = dict  # {"role": "system"|"user"|"assistant", "content": str, optionally "images": [bytes]}

# Where an image stands in a message's content or a raw prompt (mtmd's default media marker).
MEDIA_MARKER = "<__media__>"
MAX_IMAGE_BYTES = 32 << 20  # one image file as sent or attached, before decoding
NO_PROJECTOR = "This model cannot see images: it was loaded without a projector (--mmproj)."


def with_images(message: Message, images: Sequence[bytes]) -> Message:
    """`message` with `images`: where its text marks one MEDIA_MARKER for each, else before its text (as
    llama.cpp's and Ollama's clients place them)."""
    if not images:
        return message
    text = message.get("content") or ""
    if text.count(MEDIA_MARKER) != len(images):
        text = MEDIA_MARKER * len(images) + text
    return {**message, "content": text, "images": list(images)}

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplate:
    def __init__(self, template: str | None, bos_text: str, eos_text: str):
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self.source = "gguf" if template else "chatml (the GGUF has no chat template)"
        self.text = template or CHATML
        self._formatter = Jinja2ChatFormatter(template or CHATML, eos_token=eos_text, bos_token=bos_text)

    @classmethod
    def for_model(cls, model) -> "ChatTemplate":
        """The model's own template, with its BOS and EOS texts."""
        vocab = model.vocab
        bos = vocab.text(vocab.bos) if vocab.bos >= 0 else ""
        eos = vocab.text(vocab.eos) if vocab.eos >= 0 else ""
        return cls(model.chat_template(), bos_text=bos, eos_text=eos)

    def tokens(self, vocab, messages: Sequence[Message], tools: Sequence[dict] | None = None,
               media=None) -> list[int]:
        """The conversation rendered and tokenized, special tokens parsed, BOS once. A message's `images`
        (bytes each) stand where its content has MEDIA_MARKER, in order; `media` (the target's projector,
        backend/vision.py) makes them ids."""
        images = [image for message in messages for image in message.get("images") or ()]
        if images:
            if media is None:
                from localspec.errors import LocalspecError

                raise LocalspecError(NO_PROJECTOR)
            text = self.render([{k: v for k, v in m.items() if k != "images"} for m in messages], tools)
            tokens = media.tokenize(text, images)
        else:
            tokens = vocab.tokenize(self.render(messages, tools), add_special=True, parse_special=True)
        if len(tokens) >= 2 and tokens[0] == tokens[1] == vocab.bos:
            tokens = tokens[1:]  # the template wrote BOS itself
        return tokens

    def render(self, messages: Sequence[Message], tools: Sequence[dict] | None = None) -> str:
        """`tools`: OpenAI's function tools, for the template to list (None: the template's own default)."""
        try:
            # llama-cpp-python types messages as TypedDicts; ours are plain dicts of the same keys.
            return self._formatter(messages=cast(Any, list(messages)), tools=cast(Any, list(tools) if tools else None)).prompt
        except Exception as exc:  # a template's raise_exception or a Jinja error
            from localspec.errors import LocalspecError

            raise LocalspecError(f"The model's chat template rejected the conversation: {exc}") from None


class TextStream:
    """Bytes of tokens in, visible text out; stops at the first stop string."""

    def __init__(self, stop: Iterable[str] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop = [s for s in stop if s]
        self.text = ""          # everything decoded so far
        self._shown = 0         # how much of `text` was streamed out
        self.stopped = False

    def piece(self, data: bytes) -> str:
        """Decode bytes without affecting the stream (for rejected tokens)."""
        state = self._decoder.getstate()
        out = self._decoder.decode(data)
        self._decoder.setstate(state)
        return out

    def feed(self, data: bytes) -> tuple[str, str]:
        """(decoded text of these bytes, newly visible text)."""
        if self.stopped:
            return "", ""
        decoded = self._decoder.decode(data)
        self.text += decoded
        return decoded, self._release()

    def _release(self) -> str:
        for s in self.stop:
            at = self.text.find(s, max(0, self._shown - len(s) + 1))
            if at != -1:
                self.text = self.text[:at]
                self.stopped = True
                break
        end = len(self.text)
        if not self.stopped:
            end -= self._held_back()
        out = self.text[self._shown:end] if end > self._shown else ""
        self._shown = max(self._shown, end)
        return out

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), 0, -1):
                if self.text.endswith(s[:n]):
                    longest = max(longest, n)
                    break
        return longest

    def flush(self) -> str:
        """At the end of generation everything not cut by a stop string becomes visible."""
        if not self.stopped:
            self.text += self._decoder.decode(b"", final=True)
        out = self.text[self._shown:]
        self._shown = len(self.text)
        return out


def with_system(system: str | None, turns: Sequence[Message]) -> list[Message]:
    """The messages a chat template gets: the system prompt (if any) first, then the turns."""
    return ([{"role": "system", "content": system}] if system else []) + list(turns)
