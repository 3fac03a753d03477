"""What the engine needs of a model and of its vocabulary: the boundary between the pure engine and
llama.cpp.

`engine.backend.Model` / `Vocab` implement it on llama.cpp; the tests' toy model (tests/toy.py)
implements it in numpy. Both are pinned to these protocols under mypy (the end of this module and of
tests/toy.py; tests/test_layers.py runs mypy), so the engine reads a model's attributes directly,
never through `getattr` with a default.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from localspec.engine.constraint import Constraint


class Tokenizer(Protocol):
    """Text <-> token ids, as a chat template and the server's prompt building use it."""

    @property
    def bos(self) -> int: ...
    @property
    def eos(self) -> int: ...

    def text(self, token: int) -> str: ...
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...


class InfillTokenizer(Tokenizer, Protocol):
    """A code model's tokenizer as the server uses it: the fill-in-the-middle ids (-1: absent)."""

    @property
    def fim_pre(self) -> int: ...
    @property
    def fim_suf(self) -> int: ...
    @property
    def fim_mid(self) -> int: ...
    @property
    def fim_rep(self) -> int: ...
    @property
    def fim_sep(self) -> int: ...


class Vocabulary(InfillTokenizer, Protocol):
    """A model's vocabulary as the engine decodes with it: the ids that end or frame a text, and
    each token's bytes."""

    @property
    def n_tokens(self) -> int: ...
    @property
    def type(self) -> str:
        """The tokenizer's kind ("spm", "bpe", …): a pair must share it (engine/pairing.py)."""
        ...
    @property
    def eot(self) -> int:
        """End of turn, or -1 when the vocabulary has none (then `eos` ends an infill)."""
        ...
    @property
    def add_bos(self) -> bool: ...
    @property
    def add_eos(self) -> bool: ...

    def is_eog(self, token: int) -> bool: ...
    def is_control(self, token: int) -> bool: ...
    def token_bytes(self, token: int) -> bytes: ...
    def grammar(self, text: str, trigger: str | None = None) -> Constraint:
        """A GBNF grammar's start state over this vocabulary; LocalspecError if it does not parse. With
        `trigger` (one token's text; LocalspecError otherwise), any text until that token, the grammar
        from it on (the grammar's text starts with the trigger's)."""
        ...


class LoadSettings(Protocol):
    """How a model was loaded, as far as it decides its decode costs (engine/calibration.py's cache key)."""

    @property
    def placement(self) -> str:
        """Where the layers are: "" on this machine, "rpc:HOST:PORT,…" on RPC workers."""
        ...
    @property
    def flash_attn(self) -> bool | None: ...

    def threads(self) -> int: ...
    def gpu_layers(self) -> int: ...


class PredictionHead(Protocol):
    """A target's multi-token-prediction head, following its KV cache (backend/mtp.py's `MtpHead`)."""

    @property
    def n_embd(self) -> int: ...

    @property
    def max_steps(self) -> int | None:
        """The longest draft one chain of steps can write (chained heads: one head a token), None: any."""
        ...

    def hidden_at(self, seq: int, pos: int) -> np.ndarray:
        """The trunk's hidden state at `pos` of sequence `seq` (zeros where it is not known)."""
        ...

    def predict(self, seq: int, token: int, pos: int, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Logits for the token after `token` at `pos` (paired with `hidden`), and the head's own state."""
        ...

    def predict_many(self, steps: Sequence[tuple[int, int, int, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
        """`predict` for several sequences in one decode, (seq, token, pos, hidden) each, at one depth of
        their drafts."""
        ...

    def forget(self, seq: int, pos: int) -> None:
        """Drop the head's positions >= `pos` of `seq` (its draft)."""
        ...


class BlockHead(Protocol):
    """A drafter that fills a block in one pass from the target's hidden states, following its KV cache
    (backend/dflash.py's `DFlashDraft`)."""

    block_size: int  # what it was trained to fill: the pending token and block_size - 1 masks

    def predict_block(self, seq: int, token: int, pos: int, n: int) -> np.ndarray:
        """Logits (n, n_vocab) for the n tokens after `token`, the pending one at `pos` of `seq`."""
        ...


class ImageInput(Protocol):
    """Images into a model's prompts (backend/vision.py): each image one negative id per embedding row."""

    path: Path    # its mmproj file
    encoded: int  # images encoded so far (a follow-up on an image already seen encodes none)

    def tokenize(self, text: str, images: Sequence[bytes]) -> list[int]:
        """`text` with a media marker where each image stands: its tokens and each image's ids."""
        ...

    def holds(self, token: int) -> bool:
        """Whether a negative id is a row of an image it knows."""
        ...


class LanguageModel(Protocol):
    """A loaded model with KV sequences (slots) the engine extends, rolls back and shifts."""

    @property
    def path(self) -> Path | None:
        """Its GGUF file; None for a model without one (nothing to cache its costs by)."""
        ...
    @property
    def vocab(self) -> Vocabulary: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_ctx(self) -> int:
        """Tokens one sequence may hold."""
        ...
    @property
    def n_seq(self) -> int: ...
    @property
    def n_batch(self) -> int:
        """Tokens one decode may hold (a step of several sequences)."""
        ...
    @property
    def can_shift(self) -> bool:
        """Whether cached positions can be moved down (`cut`); not every model's cache can."""
        ...
    @property
    def build(self) -> str:
        """The llama.cpp build it runs on: costs measured on another build are measured again."""
        ...
    @property
    def options(self) -> LoadSettings: ...

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value ("general.architecture", …); None when absent."""
        ...

    def decode(self, tokens: list[int], start: int, logits_for: list[int],
               seq: int = 0) -> np.ndarray:
        """Evaluate `tokens` at positions start… of sequence `seq`; the logits rows at `logits_for`."""
        ...

    def decode_many(self, parts: Sequence[tuple[int, list[int], int, int]]) -> list[np.ndarray]:
        """One evaluation for several sequences: (seq, tokens, start, outputs) each; the logits after each
        of a part's last `outputs` tokens, (outputs, n_vocab)."""
        ...

    def copy_seq(self, src: int, dst: int) -> None:
        """Sequence `dst` holds exactly what `src` holds."""
        ...

    @property
    def spare_seqs(self) -> Sequence[int]:
        """Sequences a candidate tree's other branches may use while one is verified (engine/tree.py);
        empty: this model verifies chains only."""
        ...

    def fork(self, seq: int, spares: Sequence[int]) -> None:
        """Each of `spares` holds what `seq` holds (a tree's branches start from its context)."""
        ...

    def decode_placed(self, tokens: Sequence[int], positions: Sequence[int],
                      holders: Sequence[Sequence[int]]) -> np.ndarray:
        """One evaluation of tokens each held by the sequences given; the logits after every one."""
        ...

    def settle_branches(self, seq: int, keeper: int, spares: Sequence[int], start: int, n_keep: int) -> None:
        """`seq` keeps its positions before `start`, then `keeper`'s up to `n_keep`; the spares nothing."""
        ...

    @property
    def max_rollback(self) -> int | None:
        """How many of its last positions a sequence can drop after a decode (a recurrent state's
        snapshots); None: any. The longest draft a verify can take back."""
        ...

    @property
    def mtp(self) -> PredictionHead | None:
        """The file's multi-token-prediction head, following this model's cache (None: it has none)."""
        ...

    @property
    def projector(self) -> ImageInput | None:
        """What turns images into its prompts' ids (None: a text-only model)."""
        ...

    def truncate(self, n_keep: int, seq: int = 0) -> int:
        """Forget positions >= n_keep; returns the positions still held: n_keep, or fewer where a
        recurrent state could not go back that far (its newest checkpoint before, or 0)."""
        ...

    def checkpoint(self, seq: int = 0) -> None:
        """Keep what `seq` holds now as a point `truncate` can go back to (recurrent states; a KV cache
        needs none)."""
        ...
    def cut(self, p0: int, p1: int, seq: int = 0) -> None: ...
    def close(self) -> None: ...


if TYPE_CHECKING:  # the pin: llama.cpp's model implements the protocol (mypy checks this function)
    from localspec.engine.backend import Model, Vocab

    def _llama_cpp_implements_the_boundary(model: Model, vocab: Vocab) -> Sequence[object]:
        as_model: LanguageModel = model
        as_vocab: Vocabulary = vocab
        return as_model, as_vocab
