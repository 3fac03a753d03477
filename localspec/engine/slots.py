"""The target's KV sequences as llama-server's slots: each request takes the one holding the longest
prefix of its prompt, or the least recently used, so an editor's cache-warming request or a second
client does not evict the cache the completions at the cursor keep using. A slot a request is
generating on (`KvSequence.busy`) is never handed to another.

Without a prefix worth keeping, a request takes a slot that holds its own kind of prompt (an editor's
fill-in-the-middle prompt, or anything else) or nothing, before one of the other kind: a new chat
must not evict the editor's cache (its next completion would evaluate its whole prompt again, seconds
on a CPU), nor a completion in another file a chat's conversation."""

from __future__ import annotations

from typing import Iterator, Sequence

from localspec.engine.kv import KvSequence, common_prefix
from localspec.engine.model import LanguageModel
from localspec.errors import LocalspecError


# A prefix another slot holds is copied when it saves evaluating at least this many tokens. The copy
# moves the whole slot's cache (llama.cpp copies a sequence across streams only whole), which costs a
# fraction of one token's decode, while evaluating this many prompt tokens costs several.
COPY_AT_LEAST = 16


class Slots:
    def __init__(self, target: LanguageModel, cache_reuse: int = 0):
        self.all = [KvSequence(target, seq=i) for i in range(target.n_seq)]
        self.latest = self.all[0]  # the slot the latest request took
        self.cache_reuse = cache_reuse  # reuse cached runs of at least this many tokens that moved (0: prefix only)
        self._fim_mid = target.vocab.fim_mid  # (-1: the model has no infill tokens: one kind of prompt)
        self._taken = 0

    def __iter__(self) -> Iterator[KvSequence]:
        return iter(self.all)

    def __len__(self) -> int:
        return len(self.all)

    def __getitem__(self, i: int) -> KvSequence:
        return self.all[i]

    def free(self) -> list[KvSequence]:
        """The slots no request is generating on, least recently used first."""
        return sorted((s for s in self.all if not s.busy), key=lambda s: s.last_used)

    def for_prompt(self, prompt: Sequence[int]) -> tuple[KvSequence, int]:
        """The free slot holding the longest prefix of `prompt`, when that prefix is at least a tenth of
        the prompt (llama-server's slot similarity), otherwise the least recently used one; and how many
        of the prompt's tokens it already holds."""
        free = [s for s in self.all if not s.busy]
        if not free:
            raise LocalspecError("No KV slot is free for another request.")
        held = [common_prefix(s.tokens, prompt) for s in free]
        i = max(range(len(free)), key=lambda j: (held[j], -free[j].last_used))
        if held[i] > 0 and held[i] * 10 >= len(prompt):
            return free[i], held[i]
        kind = self._infill(prompt)
        oldest = min(range(len(free)), key=lambda j: (self._infill(free[j].tokens) not in (kind, None),
                                                      free[j].last_used))
        return free[oldest], held[oldest]

    def _infill(self, tokens: Sequence[int]) -> bool | None:
        """Whether these tokens are a fill-in-the-middle prompt; None for no tokens."""
        if not tokens:
            return None
        return self._fim_mid >= 0 and self._fim_mid in tokens

    def take(self, kv: KvSequence) -> None:
        """A request generates on `kv` from now on (Request.close frees it)."""
        kv.busy = True
        self._taken += 1
        kv.last_used = self._taken
        self.latest = kv

    def place(self, prompt: Sequence[int]) -> tuple[KvSequence, int]:
        """A free slot for `prompt`, taken, holding the longest cached prefix and, with `cache_reuse`,
        the cached runs that moved; or, when another slot (busy or not) holds a longer prefix of it
        by COPY_AT_LEAST tokens, that prefix copied from there (a chat template's system prompt, an
        agent's instructions and tools: evaluated once, not once per slot). Nothing evaluated yet.
        Returns the slot and how many of the prompt's tokens it keeps (at most all but the last: the
        first round evaluates that one)."""
        kv, reuse = self.for_prompt(prompt)
        self.take(kv)
        if self.cache_reuse:
            reuse = kv.reuse(prompt, self.cache_reuse)
        donor, shared = max(((s, common_prefix(s.tokens, prompt)) for s in self.all if s is not kv),
                            key=lambda held: held[1], default=(None, 0))
        if donor is not None and shared >= reuse + COPY_AT_LEAST:
            kv.copy_from(donor)  # (then cut back to the prefix they share, below)
            reuse = shared
        keep = min(reuse, len(prompt) - 1)
        kv.rewind(keep)
        return kv, keep
