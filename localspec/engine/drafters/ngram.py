"""Lookups in the request itself: copies of the prompt and the answer so far, and how this
session's other answers opened. Priced and registered as the "ngram" drafter in `copies.py`."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Sequence

from localspec.engine.drafters.base import Draft
from localspec.engine.drafters.respelling import Respelling


@dataclass(frozen=True)
class Copy:
    """A lookup's note on its draft (`Draft.note`): what the copy is, for pricing and for `observe`."""

    age: int = 0               # tokens before the proposal that agree with its source
    from_prompt: bool = False  # copied from the prompt (the text being edited), not the answer
    continuing: bool = False   # the match carries on the previous round's copy
    opening: bool = False      # how this session's other answers began, not a copy of this context


NO_COPY = Copy()


def copy_of(draft: Draft) -> Copy:
    """The lookup's note on a draft (a plain `Copy()` for one made elsewhere)."""
    return draft.note if isinstance(draft.note, Copy) else NO_COPY


class NgramDrafter:
    """Copy what followed an earlier occurrence of the text's current ending.

    It looks for earlier occurrences of the context's last tokens (up to `max_ngram` of them) and
    proposes what came after. While an answer is copying from a source (code being edited, a quoted
    passage), a match within a few tokens of where the previous copy stopped wins over longer matches
    elsewhere; and when the target replaced the copied token with its own (a renamed variable), the
    next proposal skips that token in the source. So the copy re-aligns right after an edit instead
    of jumping to an unrelated occurrence. Otherwise the longest match, latest occurrence, wins.

    Each proposal carries the copy's age (how many tokens before it already agree with the source)
    and whether it copies the prompt or the answer: the planner prices copies by both. A token the
    answer replaced with agreement on both sides is a rename (source token -> the answer's), applied
    to later copies: a variable renamed once is renamed at every later occurrence instead of breaking
    the copy each time. A token the answer added after a source token, with agreement on both sides,
    is an insertion (a name given a suffix: `month` -> `month_current`), applied likewise after that
    source token; right after the answer wrote one, the copy goes on from the source as if it had not.
    A source token the answer wrote as two (`print` -> `logging` `.info`) is both: a rename of it and an
    insertion after it. Given the target's vocabulary (`Respelling`), a rename carries to the name's other
    tokens in the context (`.calc` and `(calc` where ` calc` was renamed). The target rejecting a
    remembered rename or insertion forgets it.
    """

    name = "ngram"
    realign_window = 16  # how far past the previous copy's end a match still counts as its continuation
    max_age = 64         # a copy's age is counted up to this many tokens

    def __init__(self, max_ngram: int = 6, min_ngram: int = 1, ends_copy: Callable[[int], bool] | None = None,
                 respelling: Respelling | None = None):
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        # Control tokens (a turn's end, the next turn's header): a copy stops after the first one, since
        # an answer copying its prompt to the end goes on with its own text, not the template's.
        self.ends_copy = ends_copy
        self.respelling = respelling  # a rename carried to the name's other tokens (`.calc` with ` calc`)
        self._cursor: int | None = None       # source position the copy should continue from
        self._substituted: int | None = None  # source position of a copied token the target replaced
        self._last_start: int | None = None   # where the last proposal was copied from
        self._last_source: list[int] = []     # the source tokens behind the last proposal
        self._continuing = False
        self._age = 0
        self.prompt_len = 0  # tokens of the request's prompt at the start of the context
        self.replacements: dict[int, int] = {}   # source token -> the token the answer uses instead
        self.insertions: dict[int, int] = {}     # source token -> a token the answer adds after it
        self._last_from: list[int] = []          # each proposed token's offset in _last_source (-1: inserted)
        self._lead: int | None = None            # the source token whose insertion the last proposal began with
        self._candidate: tuple[int, int] | None = None  # (source token, the target's token) from a rejected draft
        self._forget_index()

    def reset(self, prompt_len: int = 0) -> None:
        self.prompt_len = prompt_len
        self._cursor = self._substituted = self._last_start = None
        self._last_source = []
        self._continuing = False
        self.replacements = {}
        self.insertions = {}
        self._last_from, self._lead = [], None
        self._candidate = None
        self._forget_index()

    def _forget_index(self) -> None:
        self._source: list[int] | None = None  # the context indexed (the engine's list, growing in place)
        self._indexed = 0                       # its positions indexed so far: all but its last token
        self._latest: dict[int, int] = {}       # token -> its latest indexed position
        self._pairs: dict[tuple[int, int], list[int]] = {}  # (token, next token) -> positions of the next

    def _index(self, context: list[int]) -> None:
        """Index the context's positions before its last token, from where the last call stopped.

        The lookup runs every round right after a decode has streamed the weights through the caches:
        there numpy calls over the whole context are slow (the caches hold the weights, not the
        context), so the index is kept up to date and the lookup reads dictionaries."""
        upto = len(context) - 1
        if context is not self._source or upto < self._indexed:
            self._forget_index()
            self._source = context
        latest, pairs = self._latest, self._pairs
        for i in range(self._indexed, upto):
            token = context[i]
            latest[token] = i
            if i:
                pairs.setdefault((context[i - 1], token), []).append(i)
        self._indexed = max(self._indexed, upto)

    def lookup(self, context: Sequence[int], max_len: int) -> tuple[list[int], int]:
        """(continuation, evidence); evidence is the match length, 0 for a copy resumed past an edit."""
        substituted, self._substituted = self._substituted, None
        self._last_start, self._continuing = None, False
        n_ctx = len(context)
        if n_ctx < 2 or max_len <= 0:
            return [], 0
        ctx = context if isinstance(context, list) else [int(t) for t in context]
        self._index(ctx)
        # Right after a learned insertion the text is matched as it was before it (`tail`), at sources
        # that do not already have the inserted token there.
        inserted = ctx[-1] if n_ctx >= 3 and self._inserted_after(ctx[-2], ctx[-1]) else None
        tail = n_ctx - 2 if inserted is not None else n_ctx - 1
        last = ctx[tail]

        def fits(e: int) -> bool:
            return e < tail and (inserted is None or ctx[e + 1] != inserted)

        if self._cursor is not None:
            near = [e for e in range(max(self._cursor, 0), min(self._cursor + self.realign_window, n_ctx - 1))
                    if (ctx[e] == last or self.replacements.get(ctx[e]) == last) and fits(e)]
            if near:
                lengths = [self._match_length(ctx, e, tail) for e in near]
                best = max(lengths)
                return self._copy(ctx, near[lengths.index(best)] + 1, max_len, continuing=True), best
        if substituted is not None and substituted + 1 < n_ctx - 1 and inserted is None:
            return self._copy(ctx, substituted + 1, max_len, continuing=True), 0
        if last not in self._latest:
            return [], 0
        # The longest match, latest occurrence: matches of two tokens or more are among the pairs.
        pairs = self._pairs.get((ctx[tail - 1], last)) if self.max_ngram > 1 else None
        pairs = [e for e in pairs if fits(e)] if pairs and inserted is not None else pairs
        if pairs:
            lengths = [self._match_length(ctx, e, tail) for e in pairs]
            best = max(lengths)
            end = pairs[len(lengths) - 1 - lengths[::-1].index(best)]
        elif inserted is not None:
            return [], 0
        else:
            best, end = 1, self._latest[last]
        if best < self.min_ngram:
            return [], 0
        return self._copy(ctx, end + 1, max_len, continuing=False), best

    def _match_length(self, ctx: list[int], end: int, tail: int | None = None) -> int:
        """How many tokens up to `end` equal the context's up to `tail` (its last: default; up to `max_ngram`)."""
        tail = len(ctx) - 1 if tail is None else tail
        length = 1
        while length < self.max_ngram and end - length >= 0 and ctx[end - length] == ctx[tail - length]:
            length += 1
        return length

    def _copy(self, ctx: list[int], start: int, max_len: int, *, continuing: bool) -> list[int]:
        self._last_start, self._continuing = start, continuing
        self._age = self._agreeing_before(ctx, start)
        self._last_source = ctx[start:min(start + max_len, len(ctx))]
        if self.ends_copy is not None:
            end = next((i for i, t in enumerate(self._last_source) if self.ends_copy(t)), None)
            if end is not None:
                del self._last_source[end + 1:]
        self._last_from, self._lead = list(range(len(self._last_source))), None
        if not self.replacements and not self.insertions:
            return list(self._last_source)
        proposal: list[int] = []
        self._last_from = []
        # The answer just wrote the source token before the copy (or its rename): what it adds after that
        # token first.
        before = ctx[start - 1]
        wrote = ctx[-1] in (before, self.replacements.get(before))
        self._lead = before if wrote and self._inserts_after(ctx, start - 1) else None
        if self._lead is not None:
            proposal.append(self.insertions[self._lead])
            self._last_from.append(-1)
        for i, token in enumerate(self._last_source):
            if len(proposal) >= max_len:
                break
            proposal.append(self.replacements.get(token, token))
            self._last_from.append(i)
            if len(proposal) < max_len and self._inserts_after(ctx, start + i):
                proposal.append(self.insertions[token])
                self._last_from.append(-1)
        return proposal

    def _inserted_after(self, written: int, added: int) -> bool:
        """Whether `added` is a learned insertion after a source token the answer wrote as `written`."""
        return any(token == added and (source == written or self.replacements.get(source) == written)
                   for source, token in self.insertions.items())

    def _inserts_after(self, ctx: list[int], at: int) -> bool:
        """Whether the answer adds a learned insertion after the source token at `at` (one the source does
        not already have after it)."""
        added = self.insertions.get(ctx[at])
        return added is not None and (at + 1 >= len(ctx) or ctx[at + 1] != added)

    def _agreeing_before(self, arr: list[int], start: int) -> int:
        """How many tokens before `start` the text's ending reproduces (through the learned renames),
        counting only tokens the answer wrote: the age of the copy. A copy that has already run long
        tends to keep running; agreement inside the prompt says nothing of the answer (a follow-up's
        prompt ends with the template's header for the answer, which stands before the previous answer
        in it too: docs/tuning.md, "Copy priors").

        A differing token on the way may be a rename (see `_is_rename`): it is learned here, so later
        copies apply it, and the walk goes on through it."""
        age, s, w = 0, start - 1, len(arr) - 1  # the source's token and the written one compared
        while age < self.max_age and s >= 0 and w >= self.prompt_len:
            source, written = int(arr[s]), int(arr[w])
            if self.replacements.get(source, source) != written and source != written:
                if self.insertions.get(source) == written or self._is_insertion(arr, s, w, agreeing_after=age):
                    self.insertions[source] = written
                    age, w = age + 1, w - 1  # the added token; the source's is compared with the one before it
                    continue
                if self._is_expansion(arr, s, w, agreeing_after=age):  # a rename, then a token added after it
                    self._learn_rename(arr, source, [int(arr[w - 1]), written])
                    age, s, w = age + 2, s - 1, w - 2
                    continue
                if not self._is_rename(arr, s, w, agreeing_after=age):
                    break
                self._learn_rename(arr, source, [written])
            age, s, w = age + 1, s - 1, w - 1
        return age

    def _learn_rename(self, arr: list[int], source: int, written: list[int]) -> None:
        """The source token is written as `written` (one token or two: a rename, then an insertion after
        it), and so are the context's other tokens spelling the same name (`Respelling`)."""
        renamed = {source: written}
        if self.respelling is not None:
            renamed.update((t, w) for t, w in self.respelling.renamed(source, written, arr).items()
                           if t not in self.replacements)
        self.rename(renamed)

    def rename(self, renamed: dict[int, list[int]]) -> None:
        """Write each source token as its tokens from now on: one (a rename) or two (a rename, then an
        insertion after it); longer ones are not written so."""
        for token, tokens in renamed.items():
            if not 1 <= len(tokens) <= 2:
                continue
            if tokens[0] != token:
                self.replacements[token] = tokens[0]
            if len(tokens) == 2:
                self.insertions[token] = tokens[1]

    def _is_rename(self, arr: list[int], source_at: int, written_at: int, agreeing_after: int) -> bool:
        """One differing token with agreement on both sides: two agreeing tokens after it and three
        before (the answer renamed something while nothing was being drafted, say in its first line),
        or one after it when the target rejected a draft's token for this one. A rejected token alone
        is no rename: the target may be inserting there (a type hint after a parameter)."""
        if agreeing_after >= 1 and self._candidate == (int(arr[source_at]), int(arr[written_at])):
            return True
        return agreeing_after >= 2 and self._agree(arr, source_at - 1, written_at - 1, 3)

    def _is_insertion(self, arr: list[int], source_at: int, written_at: int, agreeing_after: int) -> bool:
        """The written token added after the source's (which the token before it equals): three agreeing
        tokens before it and two after it, or one after it when the target rejected the source's next
        token for this one."""
        if written_at - 1 < self.prompt_len or not self._agree(arr, source_at, written_at - 1, 3):
            return False
        confirmed = source_at + 1 < len(arr) and self._candidate == (int(arr[source_at + 1]), int(arr[written_at]))
        return agreeing_after >= 2 or (agreeing_after >= 1 and confirmed)

    def _is_expansion(self, arr: list[int], source_at: int, written_at: int, agreeing_after: int) -> bool:
        """The source's token written as two (`print` -> `logging` `.info`): two agreeing tokens after
        them and three before, both written tokens the answer's. Learned as a rename of the source token
        to the first and an insertion of the second after it, so later copies write both."""
        return (agreeing_after >= 2 and written_at - 1 >= self.prompt_len
                and int(arr[written_at - 1]) != int(arr[source_at]) and self._agree(arr, source_at - 1, written_at - 2, 3))

    def _agree(self, arr: list[int], source_end: int, written_end: int, count: int) -> bool:
        if source_end - count + 1 < 0:
            return False
        for j in range(count):
            source, written = int(arr[source_end - j]), int(arr[written_end - j])
            if source != written and self.replacements.get(source) != written:
                return False
        return True

    def propose(self, context: Sequence[int], max_len: int, sampler: object = None) -> Draft:
        t0 = time.perf_counter()
        tokens, evidence = self.lookup(context, max_len)
        note = Copy(age=self._age, from_prompt=self._last_start is not None and self._last_start < self.prompt_len,
                    continuing=self._continuing) if tokens else NO_COPY
        return Draft(tokens=tokens, source="ngram", evidence=evidence, note=note, seconds=time.perf_counter() - t0)

    def observe(self, draft: Draft, accepted: int, token: int | None = None) -> None:
        """Remember how far the copy got, so the next lookup continues from the same source.

        `token` is what the target produced after the accepted part (its correction after a rejection).
        """
        if draft.source != "ngram" or not draft.tokens or self._last_start is None:
            self._candidate = None
            return
        self._learn_replacement(draft, accepted, token)
        # A copy is under way when some of it was kept, or when it came from a long or continuing match
        # (then a rejection is an edit, not a coincidence). Otherwise forget the source position.
        copying = accepted > 0 or copy_of(draft).continuing or draft.evidence >= 3
        copied = sum(1 for i in self._last_from[:accepted] if i >= 0)  # source tokens among those kept
        self._cursor = self._last_start + copied if copying else None
        # Guess a substitution once, after a real match broke; a failed guess is not guessed on.
        broke = copying and accepted < len(draft.tokens) and (draft.evidence > 0 or accepted > 0)
        self._substituted = self._cursor if broke else None

    def _learn_replacement(self, draft: Draft, accepted: int, token: int | None) -> None:
        self._candidate = None
        if accepted >= len(draft.tokens) or token is None or accepted >= len(self._last_from):
            return
        if self._last_from[accepted] < 0:  # an added token the target rejected
            before = self._last_from[accepted - 1] if accepted else -1
            source = self._last_source[before] if before >= 0 else self._lead
            after = self._last_source[before + 1] if before + 1 < len(self._last_source) else None
            if source is not None and token == after and self.insertions.get(source) == draft.tokens[accepted]:
                del self.insertions[source]  # here the answer went on with the source: the insertion was wrong
            return
        original = self._last_source[self._last_from[accepted]]
        if self.replacements.get(original) == draft.tokens[accepted] and token == original:
            del self.replacements[original]  # here the answer kept the original: the rename was wrong
        elif token != original and token != draft.tokens[accepted]:
            self._candidate = (original, token)


class OpeningDrafter:
    """How this session's answers begin, proposed at the start of the next answer.

    An answer opens before it can copy anything (a code fence, "Here is"), and those first tokens
    cost plain decoding. Answers in one session tend to open alike, so the first `length` tokens of
    each answer are remembered by the conversation they answered, for the `keep` latest
    conversations (a session moving from code to stories should stop opening with a code fence). A
    new answer is offered the continuation that at least `support` other conversations' answers agree
    on, each token's chance from the vote (5 of 6 answers went on with it: (5 + 1) / (6 + 2)), unless
    the two latest of them went another way (the session changed subject). Answers to the same
    conversation never count: a regenerated answer, or a benchmark's plain run of the same prompt,
    must not feed the next.
    """

    def __init__(self, length: int = 8, support: int = 2, keep: int = 6):
        self.length, self.support, self.keep = length, support, keep
        self._openings: dict[int, list[int]] = {}   # conversation -> its latest answer's first tokens

    @staticmethod
    def conversation(prompt: Sequence[int]) -> int:
        """The key a request's answers are remembered by: its prompt."""
        return hash(tuple(prompt))

    def remember(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        if answer:
            key = self.conversation(prompt)
            self._openings.pop(key, None)
            self._openings[key] = list(answer[:self.length])
            while len(self._openings) > self.keep:
                del self._openings[next(iter(self._openings))]

    def propose(self, context: Sequence[int], max_len: int, conversation: int,
                prompt_len: int) -> tuple[Draft, list[float]]:
        """The proposal after `context` (the first `prompt_len` tokens are the prompt of `conversation`)
        and, per token, the chance it is kept."""
        if len(context) - prompt_len >= self.length or max_len <= 0:  # past the opening: nothing to copy
            return Draft.empty(), []
        answer = list(context[prompt_len:])
        others = [o for key, o in self._openings.items() if key != conversation and o[:len(answer)] == answer]
        tokens: list[int] = []
        rates: list[float] = []
        at = len(answer)
        while len(tokens) < max_len and at < self.length:
            votes = Counter(o[at] for o in others if len(o) > at)
            if not votes:
                break
            token, count = votes.most_common(1)[0]
            latest = [o for o in others[-2:] if len(o) > at]
            if count < self.support or (len(latest) == 2 and all(o[at] != token for o in latest)):
                break  # too few agree, or the two latest answers went another way: the subject changed
            tokens.append(token)
            rates.append((count + 1) / (len(others) + 2))
            others = [o for o in others if len(o) > at and o[at] == token]
            at += 1
        return (Draft(tokens=tokens, source="ngram", note=Copy(opening=True)), rates) if tokens else (Draft.empty(), [])
