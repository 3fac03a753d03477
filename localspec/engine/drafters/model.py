"""The "model" and "self" drafters: a smaller GGUF with the target's vocabulary (or the target's own
first layers), drafting token by token in its own KV cache, priced by its acceptance by position.

The draft model has a KV sequence per target slot: each request drafts in its own (the free one its
prompt continues), so requests that alternate (two chats, a chat and an editor) each find their
conversation still there instead of evaluating it again."""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from localspec.engine.adaptive import Acceptance, DrafterCost, best_length, free_positions, margin_for
from localspec.engine.calibration import calibrated_costs
from localspec.engine.drafters.base import Chain, Draft, Drafter, Offer, Plan, Sources, Turn
from localspec.engine.kv import KvSequence, common_prefix, extend_together
from localspec.engine.sampling import Sampler
from localspec.engine.tree import DraftTree, with_alternates


# A chain's second candidates: one beside each of its tokens and one after (ModelDrafter.max_len + 1)
MAX_TREE_LEAVES = 8


class ModelDrafter(Drafter):
    """A smaller GGUF with the same vocabulary, drafting token by token in its own KV cache.

    What it learns across requests: its cost per token and its acceptance by position (each request
    starts from it at reduced weight and leaves its own record). Each request drafts in a `ModelTurn`
    on a KV sequence of its own. The last drafted token is never decoded there: if the target keeps
    it, it is evaluated with the next round's catch-up, so no position is ever run twice.
    """

    max_len = 7            # longest draft: a verify batch of 8, a calibrated size (measuring.CALIBRATION_SIZES)
    plausible_best = 0.9   # the acceptance a probe assumes: is drafting worth finding out about at all?
    probe_share = 0.01     # a probe's catch-up may cost at most this share of the rest of the answer, plain
    prefill_batch = 64     # positions of the prefill whose cost prices a catch-up, measured at load

    def __init__(self, model, p_min: float = 0.5, name: str = "model", per_token_s: float = 0.0,
                 prior: float = 0.7, learn_costs: bool = True, prefill_s: float | None = None,
                 tree_leaves: int | None = None):
        self.name = name  # "model" (a separate draft GGUF) or "self" (the target's own layers)
        self.sequences = [KvSequence(model, seq=i) for i in range(model.n_seq)]
        self.p_min = p_min  # stop drafting when the draft's top probability falls below this
        self.cost = DrafterCost(per_token_s=per_token_s)
        self.prefill_s = prefill_s  # seconds per position of a catch-up, measured; None: estimated
        self.acceptance = Acceptance(prior_mean=prior, prior_strength=3.0)
        self.learn_costs = learn_costs
        # Second candidates beside the chain, verified with it as a tree (engine/tree.py): None, as many
        # as the target's verify costs make free (`leaves_for`); a number: that many wherever there is room.
        self.tree_leaves = tree_leaves
        self._requests = 0

    @classmethod
    def build(cls, sources: Sources, name: str = "model") -> "ModelDrafter | None":
        model = sources.draft if name == "model" else sources.self_draft
        if model is None:
            return None
        per_token, prefill = sources.draft_cost_s, None
        if per_token is None:
            per_token = calibrated_costs(model, sources.calibrate, sizes=(1,))[1]
            n = cls.prefill_batch
            prefill = calibrated_costs(model, sources.calibrate, sizes=(n,), prefill=True).get(n)
        return cls(model, p_min=sources.p_min, name=name, per_token_s=per_token,
                   prior=0.7 if name == "model" else 0.6, learn_costs=sources.learn_costs,
                   prefill_s=prefill / cls.prefill_batch if prefill else None, tree_leaves=sources.tree_leaves)

    drafts_together = batched = True

    def token_s(self) -> float:
        return self.cost.per_token_s

    def draft_many(self, asks: Sequence[tuple[Turn, Sequence[int], int, Sampler]]) -> list[Draft]:
        """Chains for several requests at once, in their own sequences of the draft model: one decode
        brings every sequence that is behind up to its context, then one decode per draft token holds
        every chain still going; each stops where its draft stops being sure, as `ModelTurn.propose`'s.
        A sequence two requests share (more requests than sequences) drafts for the first only."""
        t0 = time.perf_counter()
        chains: list[_Chain] = []
        caught_up: list[tuple[_Chain, int]] = []
        for i, (turn, context, length, sampler) in enumerate(asks):
            assert isinstance(turn, ModelTurn)
            kv = turn.kv
            if length <= 0 or len(context) + length > kv.n_ctx or any(c.kv is kv for c in chains):
                continue
            chain = _Chain(index=i, kv=kv, history=list(context), length=length, sampler=sampler,
                           logits=turn.prepared(context))
            chains.append(chain)
            if chain.logits is None:
                keep = min(common_prefix(kv.tokens, context), len(context) - 1)
                kv.rewind(keep)
                caught_up.append((chain, len(context) - keep))
        decodes = 0
        together, room = [], self.sequences[0].model.n_batch
        for chain, behind in caught_up:
            if behind <= room:
                together.append(chain)
                room -= behind
            else:  # (more than one decode holds: a prompt the draft model never saw, evaluated in chunks)
                chain.logits = chain.kv.sync(chain.history)
                decodes += 1
        if together:
            rows = extend_together([(c.kv, c.history[len(c.kv.tokens):], 1) for c in together])
            for chain, row in zip(together, rows):
                chain.logits = row[0]
            decodes += 1
        going = chains
        while going:
            going = [c for c in going if c.next_token(self.p_min)]
            if going:
                rows = extend_together([(c.kv, c.tokens[-1:], 1) for c in going])
                for chain, row in zip(going, rows):
                    chain.logits = row[0]
                decodes += 1
        elapsed = time.perf_counter() - t0
        # a draft made alone measures a token's cost (unless a long catch-up came first); one made beside
        # others, a share of a batch's
        steady = len(chains) == 1 and decodes > 0 and max((n for _c, n in caught_up), default=0) <= 2
        drafts = [Draft.empty() for _ in asks]
        for chain in chains:
            drafts[chain.index] = chain.draft(self.name, elapsed, elapsed / decodes if steady else None)
        return drafts

    def leaves_for(self, length: int, room: int, plan: Plan) -> int:
        """How many second candidates a chain of `length` gets: one per depth at most, and one after the
        chain where it fits `room`; none without spare sequences in the target (engine/tree.py), under a
        grammar (a tree's leaves are not checked against it), or for a draft of nothing."""
        spares = len(plan.target.model.spare_seqs) if plan.target is not None else 0
        if length <= 0 or spares == 0 or plan.grammar is not None:
            return 0
        most = min(length + (1 if length < room else 0), spares)
        if self.tree_leaves is not None:
            return min(self.tree_leaves, most)
        return min(free_positions(plan.cost, length + 1) - (length + 1), most)

    def begin(self, prompt: Sequence[int], plan: Plan) -> "ModelTurn":
        # What earlier requests taught is kept as a prior at reduced weight, so this request's own
        # evidence takes over within a few rounds.
        known = self.acceptance
        acceptance = dataclasses.replace(known, tried=[t * 0.3 for t in known.tried], kept=[k * 0.3 for k in known.kept])
        return ModelTurn(self, self._sequence_for(prompt), acceptance)

    def _sequence_for(self, prompt: Sequence[int]) -> KvSequence:
        """A free sequence this prompt continues (its prefix is at least half of what the sequence holds:
        the same conversation, not another one with the same system prompt), the one holding most of it;
        else the least recently used free one (an empty one first); with none free (more requests than
        slots), the least recently used one, shared."""
        self._requests += 1
        free = [kv for kv in self.sequences if not kv.busy]
        if not free:
            kv = min(self.sequences, key=lambda kv: kv.last_used)
        else:
            held = {kv.seq: common_prefix(kv.tokens, prompt) for kv in free}
            continued = [kv for kv in free if held[kv.seq] > 0 and 2 * held[kv.seq] >= len(kv.tokens)]
            kv = (max(continued, key=lambda kv: held[kv.seq]) if continued
                  else min(free, key=lambda kv: kv.last_used))
            kv.busy = True
        kv.last_used = self._requests
        return kv

    def reset(self) -> None:
        for kv in self.sequences:
            kv.reset()

    def observe_cost(self, draft: Draft) -> None:
        if isinstance(draft.note, float) and self.learn_costs:  # seconds per token, where the draft measured them
            self.cost.observe(1, draft.note)


class ModelTurn(Turn):
    """One request's drafting with the draft model: its KV sequence, and its record of the draft's
    acceptance (from the drafter's at reduced weight; it becomes the drafter's when the request ends)."""

    def __init__(self, drafter: ModelDrafter, kv: KvSequence, acceptance: Acceptance):
        self.drafter = drafter
        self.kv = kv
        self.acceptance = acceptance
        self._ready: tuple[int, np.ndarray] | None = None  # logits after a prepared context
        self._leaves = 0  # second candidates the last offer priced (`ModelDrafter.leaves_for`)
        self.drafted = False  # whether this request drafted with it (its record then is the drafter's)

    # ------------------------------------------------------------------ pricing

    def prefill(self, context: Sequence[int], plan: Plan) -> None:
        """Bring the prompt in only when this request is expected to draft with it (or a fixed length
        forces it). A drafter that is not expected to pay costs nothing: no prefill now, and a catch-up
        (priced, see `catch_up_pays`) only when it first wins a round: where the draft model never pays,
        prefilling it would only delay the first token."""
        cap = plan.fixed_len if plan.fixed_len is not None else self.drafter.max_len
        if plan.fixed_len is not None or self._best(cap, plan)[0] > 0:
            self.prepare(context)

    def _best(self, cap: int, plan: Plan) -> tuple[int, float]:
        return best_length(self.acceptance.rates(cap), plan.cost, self.drafter.cost.per_token_s,
                           margin_for(self.acceptance.samples))

    def offer(self, context: Sequence[int], room: int, plan: Plan) -> Offer | None:
        cap = min(plan.fixed_len if plan.fixed_len is not None else self.drafter.max_len, room)
        if cap <= 0:
            return None
        if plan.fixed_len is not None:
            self._leaves = self.drafter.leaves_for(cap, room, plan)
            return Offer(cap, 0.0)  # a fixed length: a lookup that found something goes first
        k, rate = self._best(cap, plan)
        if k > 0 and not self.catch_up_pays(context, rate, plan):
            k = 0
        self._leaves = self.drafter.leaves_for(k, room, plan)
        # (the chances up to the cap: a step shared with other sequences chooses its own length)
        return Offer(k, rate, chances=self.acceptance.rates(cap) if k > 0 else [])

    def probe(self, context: Sequence[int], plan: Plan) -> Offer | None:
        """Never for a drafter that cannot pay on this machine even when nearly always right, nor one
        whose catch-up would cost more than `probe_share` of decoding the rest of the answer plainly: a
        probe is a guess at what the drafter might do, and with the target on RPC workers (a verify batch
        dear, a draft token cheap) probes that each caught up a whole prompt cost short answers that never
        drafted a large share of their time."""
        drafter = self.drafter
        k, rate = best_length([drafter.plausible_best] * drafter.max_len, plan.cost, drafter.cost.per_token_s)
        if k == 0:
            return None
        if self.behind(context) * self._catch_up_per_position(plan) > drafter.probe_share * plan.budget * plan.cost.verify(1):
            return None
        return Offer(1, rate) if self.catch_up_pays(context, rate, plan) else None

    def _catch_up_per_position(self, plan: Plan) -> float:
        """A catch-up is a batched prefill on this machine: priced by the draft model's own prefill, measured
        at load. Without that measurement (a given per-token cost): the target's per-position cost in its
        largest calibrated batch, scaled by how much cheaper a draft token is than a target token; with
        the target on RPC workers that undercounts a prefill on the client's cores several times over."""
        if self.drafter.prefill_s is not None:
            return self.drafter.prefill_s
        cost = plan.cost
        largest = max(cost.verify_s)
        return cost.verify(largest) / largest * self.drafter.cost.per_token_s / cost.verify(1)

    def catch_up_pays(self, context: Sequence[int], rate: float, plan: Plan) -> bool:
        """Whether drafting at `rate` tokens/s over the rest of the answer repays bringing the cache up
        to date first."""
        behind = self.behind(context)
        if behind <= 2:
            return True
        saving_per_token = 1.0 / plan.cost.plain_tokens_per_s - 1.0 / rate
        return saving_per_token * plan.budget > behind * self._catch_up_per_position(plan)

    def observe(self, draft: Draft, accepted: int, token: int | None) -> None:
        self.acceptance.observe(len(draft.tokens), accepted)
        self.drafter.observe_cost(draft)
        self.drafted = True

    def end(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        if self.drafted:  # a request that never drafted with it leaves the record as it found it
            self.drafter.acceptance = self.acceptance
        self.kv.busy = False  # (its tokens stay: this conversation's next request finds them)

    # ------------------------------------------------------------------ drafting

    def prepare(self, context: Sequence[int]) -> None:
        """Bring a new prompt into the draft's cache now (counted as prompt time, not draft time)."""
        self._ready = None
        if 0 < len(context) <= self.kv.n_ctx:
            self._ready = (len(context), self.kv.sync(context))

    def behind(self, context: Sequence[int]) -> int:
        """Tokens of `context` this request's draft sequence would have to evaluate before it can draft
        (for pricing; `propose` does the real sync). Asked every round the drafter could win: when the
        cache ends the way the context did at that length (the usual case), no scan of the whole context."""
        held = self.kv.tokens
        n = len(held)
        if n <= len(context) and held[-8:] == list(context[max(n - 8, 0):n]):
            return len(context) - n
        return len(context) - common_prefix(held, context)

    def prepared(self, context: Sequence[int]) -> np.ndarray | None:
        """The logits `prepare` left after exactly this context, if it did (taken: once)."""
        ready, self._ready = self._ready, None
        if ready is not None and ready[0] == len(context) and self.kv.tokens == list(context):
            return ready[1]
        return None

    def _logits_after(self, context: Sequence[int]) -> tuple[np.ndarray, int]:
        """Logits after the context's last token, and how many tokens had to be evaluated."""
        ready = self.prepared(context)
        if ready is not None:
            return ready, 0
        before = self.kv.evaluated
        logits = self.kv.sync(context)
        return logits, self.kv.evaluated - before

    def draft(self, context: Sequence[int], length: int, sampler: Sampler) -> Draft:
        return self.propose(context, length, sampler, leaves=self._leaves if length > 0 else 0)

    def propose(self, context: Sequence[int], max_len: int, sampler: Sampler, leaves: int = 0) -> Draft:
        """A chain of at most `max_len` tokens, and with `leaves`, a candidate tree: that many second
        candidates where they are worth most (`with_leaves`), for the same decodes."""
        if max_len <= 0 or len(context) + max_len > self.kv.n_ctx:
            return Draft.empty()  # a draft context smaller than the target's just stops drafting
        t0 = time.perf_counter()
        logits, caught_up = self._logits_after(context)
        p_min = self.drafter.p_min
        history = list(context)
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        seconds: list[tuple[int, float, float]] = []  # per depth: a second candidate, its worth, the chain's confidence
        while True:
            token, confidence, q = sampler.draft_token(logits, history, p_min > 0 or leaves > 0)
            if q is not None:
                rows.append(q)
            if tokens and confidence < p_min:
                seconds.append((token, confidence, 0.0))  # where the chain stops, its own choice is the candidate
                break  # not even this one: the draft stops where the model stops being sure
            if leaves:
                runner_up, worth = sampler.second_candidate(logits, history, token, q)
                seconds.append((runner_up, worth, confidence))
            tokens.append(token)
            history.append(token)
            if len(tokens) >= max_len or confidence < p_min:
                break
            logits = self.kv.extend([token], [0])[0]
        elapsed = time.perf_counter() - t0
        decodes = len(tokens) - 1 + (1 if caught_up else 0)
        draft = Draft(
            tokens=tokens,
            q=np.stack(rows[:len(tokens)]) if rows else None,
            source=self.drafter.name,
            seconds=elapsed,
            # The note: seconds per drafted token, when this draft measured the steady cost (a long
            # catch-up, a new prompt, says nothing about it).
            note=elapsed / decodes if decodes > 0 and caught_up <= 2 else None,
        )
        if leaves:
            draft.tree = with_leaves(tokens, seconds, leaves, np.stack(rows) if rows else None)
        return draft


def with_leaves(chain: list[int], seconds: list[tuple[int, float, float]], leaves: int,
                q: np.ndarray | None) -> DraftTree:
    """The chain and `leaves` of its second candidates (`seconds[d]`: the one at depth d, its worth where
    depth d is reached, and the draft's confidence in the chain's own token there; one after the chain
    where it stopped): those most likely to be what the target keeps, each weighed by the chance the
    chain reaches its depth (the product of the confidences before it). Sampling, a depth's worth reads
    only q, so which depths get a candidate never depends on a candidate's own draw."""
    reach, weighed = 1.0, []
    for depth, (_token, worth, confidence) in enumerate(seconds):
        weighed.append((reach * worth, -depth))
        reach *= confidence
    chosen = {-d for _w, d in sorted(weighed, reverse=True)[:leaves]}
    alternates = [token if depth in chosen else None for depth, (token, _w, _c) in enumerate(seconds)]
    return with_alternates(chain, alternates, q)


@dataclasses.dataclass(kw_only=True)
class _Chain(Chain):
    kv: KvSequence  # the request's sequence of the draft model
