"""The one interface every drafter implements, and what it is priced with.

A registered `Drafter` lives as long as the engine and keeps what it learns across requests (a
history index, how often forced drafts were kept, the draft model's cost); each request gets a `Turn`
of every drafter (`Drafter.begin`), which keeps what belongs to that answer only (the copy being
followed, its acceptance so far), so requests decoded side by side never share a drafter's state.
Each round the planner asks every turn the setting allows for an `Offer`: a draft length and the
tokens per second it expects from it, priced from its statistics and cost against the target's
verify costs (`Plan`). The best offer wins; length 0 everywhere is plain decoding. A lookup has its
proposal ready with the offer (finding it is nearly free); a model drafter drafts only when chosen.
After the round, the turn that drafted observes what the target kept; when the request ends, every
turn sees its answer (`Turn.end`), drafted or not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

if TYPE_CHECKING:
    from localspec.engine.adaptive import CostModel
    from localspec.engine.constraint import Constraint
    from localspec.engine.kv import KvSequence
    from localspec.engine.model import BlockHead, LanguageModel, PredictionHead
    from localspec.engine.sampling import Sampler
    from localspec.engine.tree import DraftTree


@dataclass
class Draft:
    """One round's proposal, in the shape every drafter uses: the engine reads everything but `note`,
    which belongs to the drafter that made it (its `observe` gets the draft back), so a new drafter
    adds a module, not fields here."""

    tokens: list[int]
    q: np.ndarray | None = None   # (len(tokens), n_vocab) when sampling with a model drafter
    source: str = "none"          # the registered name of the drafter that made it, or "none"
    exact: bool = False           # the target's own greedy answer to this same context (accept_replayed)
    evidence: int = 0             # lookups: tokens of agreement behind the proposal (shown on its round)
    seconds: float = 0.0
    note: object = None           # the drafter's own record of how it made the draft
    tree: DraftTree | None = None  # candidates beside `tokens`, verified together (engine/tree.py); tokens is its
                                   # first branch, verified alone where a tree cannot be (a grammar, log-probs)

    @staticmethod
    def empty() -> "Draft":
        return Draft(tokens=[])


def text_only(draft: Draft) -> Draft:
    """`draft` ending before the first image position (a negative id, engine/backend/vision.py) a lookup
    copied from its context: those are the projector's rows, never a token to verify. A tree with one
    goes."""
    if not draft.tokens or min(draft.tokens) >= 0 and (draft.tree is None or min(draft.tree.tokens, default=0) >= 0):
        return draft
    cut = next((i for i, t in enumerate(draft.tokens) if t < 0), len(draft.tokens))
    q = draft.q[:cut] if draft.q is not None else None
    return dataclasses.replace(draft, tokens=draft.tokens[:cut], q=q, tree=None)


@dataclass(kw_only=True)
class Chain:
    """One request's draft as a drafter makes several at once (`Drafter.draft_many`): the logits after
    its history, the tokens drafted so far (and each one's q, sampling)."""

    index: int                     # which of the asks it answers
    history: list[int]
    length: int                    # the most tokens it may have
    sampler: Sampler
    logits: np.ndarray | None = None
    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray] = field(default_factory=list)

    def next_token(self, p_min: float) -> bool:
        """Draft one more token from the logits; whether the chain goes on. It stops where the drafter
        stops being sure (below `p_min`: its first token is kept, a later one is not)."""
        assert self.logits is not None
        token, confidence, q = self.sampler.draft_token(self.logits, self.history, p_min > 0)
        if self.tokens and confidence < p_min:
            return False
        self.tokens.append(token)
        self.history.append(token)
        if q is not None:
            self.q.append(q)
        return len(self.tokens) < self.length and confidence >= p_min

    def draft(self, source: str, seconds: float, note: object = None) -> Draft:
        return Draft(tokens=self.tokens, q=np.stack(self.q) if self.q else None, source=source, seconds=seconds,
                     note=note)


@dataclass(frozen=True)
class Plan:
    """One request's plan, fixed when it starts, and what offers are priced with: the drafter setting,
    the target's verify costs, the answer tokens the request may still produce (a model drafter's
    catch-up must pay for itself over them; the planner passes the current count), a forced draft
    length, whether the request's answer is a function of its context alone
    (`SamplingSettings.replayable`), its grammar's state after the context (None: free text;
    drafters must not advance it), and once its prompt is in, the target's KV sequence it decodes in
    (for drafters that read the target's own state, as the MTP head; None for requests decoded in a
    shared step)."""

    cost: CostModel
    budget: int = 512
    fixed_len: int | None = None
    replayable: bool = False
    grammar: Constraint | None = None
    mode: str = "auto"
    target: KvSequence | None = None
    longest: int | None = None  # the longest draft the request allows (None: any)
    shortest: int = 0           # and the shortest worth making


@dataclass
class Offer:
    length: int                 # tokens to draft; 0: this drafter would not draft this round
    rate: float                 # expected tokens per second of the round, drafting included
    draft: Draft | None = None  # a lookup's proposal, made already; None: `Drafter.draft` makes it
    chances: list[float] = field(default_factory=list)  # a lookup's: each proposed token kept, given the one
                                                         # before (what it was priced with), for any length


class Turn:
    """One drafter's part in one request: what it keeps for this answer only. A turn must implement
    `offer`; the other hooks default to nothing."""

    def prefill(self, context: Sequence[int], plan: Plan) -> None:
        """Prompt time: get ready if this request is expected to draft with it."""

    def offer(self, context: Sequence[int], room: int, plan: Plan) -> Offer | None:
        """What drafting after `context` (at most `room` tokens) would bring, or None (nothing to offer)."""
        raise NotImplementedError

    def probe(self, context: Sequence[int], plan: Plan) -> Offer | None:
        """A one-token probe, asked for after rounds in which nothing was worth drafting (model
        drafters, whose acceptance can change with the text; lookups find their own evidence)."""
        return None

    def draft(self, context: Sequence[int], length: int, sampler: Sampler) -> Draft:
        """Draft `length` tokens, for an offer made without its proposal."""
        raise NotImplementedError

    def observe(self, draft: Draft, accepted: int, token: int | None) -> None:
        """The target kept `accepted` tokens of this turn's draft, then produced `token`."""

    def end(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        """The request ended with this answer (also in plain decoding: answers are evidence too)."""


class Drafter(Turn):
    """Base of every drafter: `name` is its drafter setting and the label on its rounds.

    `begin` makes a request's turn; a drafter that keeps nothing per request is its own turn (the
    default), implementing `Turn`'s hooks itself."""

    name = "drafter"
    warning: str | None = None  # a problem met at load that the user should hear about
    # Whether it drafts in steps shared by several requests' sequences (`draft_many`) as well as in
    # rounds alone, and whether it drafts for all of them in the same decodes (a batch: one decode per
    # draft token whatever the sequences) or for one after the other.
    drafts_together = False
    batched = False

    def begin(self, prompt: Sequence[int], plan: Plan) -> Turn:
        """A new request with this prompt: its turn."""
        return self

    def token_s(self) -> float:
        """Seconds one drafted token costs (a lookup's: nothing)."""
        return 0.0

    def draft_many(self, asks: Sequence[tuple[Turn, Sequence[int], int, Sampler]]) -> list[Draft]:
        """Drafts for several requests' turns of this drafter in one step (`drafts_together`): (turn,
        context, length, sampler) each; one after the other unless the drafter batches them."""
        return [turn.draft(context, length, sampler) for turn, context, length, sampler in asks]

    def drafting_s(self, lengths: Sequence[int], rows_cost: Callable[[int], float] = lambda rows: 1.0) -> float:
        """Seconds drafting these lengths for as many sequences takes: one after the other, a token's cost
        each; `batched`, one decode per draft position holding every chain that reaches it, a decode of
        n rows costing `rows_cost(n)` times one row's."""
        if not self.batched:
            return sum(lengths) * self.token_s()
        depth = max(lengths, default=0)
        return self.token_s() * sum(rows_cost(sum(k > d for k in lengths)) for d in range(depth))

    def reset(self) -> None:
        """Forget cached state tied to the target's KV cache (the engine's cache was cleared)."""

    def close(self) -> None:
        """The engine is closing: persist what should outlive it."""


@dataclass
class Sources:
    """What the registered drafters are built from: the engine's models and settings."""

    target: LanguageModel
    draft: LanguageModel | None = None
    self_draft: LanguageModel | None = None
    eagle3: PredictionHead | None = None  # an EAGLE-3 draft following the target (backend/eagle3.py)
    assistant: PredictionHead | None = None  # a Gemma 4 assistant, drafting as the target's head (backend/assistant.py)
    dflash: BlockHead | None = None       # a DFlash draft following the target (backend/dflash.py)
    p_min: float = 0.5
    calibrate: bool = True
    learn_costs: bool = True
    draft_cost_s: float | None = None   # a measured cost per draft token, to skip calibration (tests)
    history: bool = True                # draft from earlier requests' text
    tree_leaves: int | None = None      # a model draft's second candidates (EngineOptions.tree_leaves)
    history_file: object | None = None  # where the history index persists (None: memory only)


@dataclass(frozen=True)
class Registration:
    """A drafter setting: its name, what it means, how to build it (None: this engine cannot have it)
    and what it needs when it cannot."""

    name: str
    help: str
    label: str
    build: Callable[[Sources], Drafter | None]
    needs: str = ""
