"""One answer as the front doors see it: each round's kept, rejected and supplied tokens and their
text, its running speedup, and the summary at its end. Whatever produced the round (the speculative
loop alone, or a step shared with other completions) the events have one shape."""

from __future__ import annotations

import time

from localspec.engine.events import Prefill, Round, Summary, Tally
from localspec.engine.model import Vocabulary
from localspec.engine.params import GenerationParams
from localspec.engine.session import TextStream
from localspec.engine.speculative import Step
from localspec.engine.speedup import Speedup, SpeedupMeter


class Answer:
    def __init__(self, vocab: Vocabulary, params: GenerationParams, meter: SpeedupMeter, started: float):
        self.vocab = vocab
        self.params = params     # its request's settings: the budget and the stop strings are read there
        self.stream = TextStream(params.stop)
        self.tally = Tally()
        self.meter = meter
        self.started = started   # when the request arrived (time to first token counts from here)
        self.first_token_s = 0.0

    def add(self, step: Step, context_len: int, seconds: float, priced: bool) -> tuple[Round, str | None]:
        """One round that took `seconds` at `context_len`; `priced`: its time is not a plain round's
        (it drafted, or shared a step with other sequences), so the speedup prices its tokens at plain
        decoding's measured cost. Returns the event and why the answer ends here, if it does."""
        kept, ended = self._within_budget(step, self.remaining())
        speedup = self.meter.add(context_len, seconds, len(kept), priced)
        event = self._round(step, kept, ended, self.tally.rounds, seconds, speedup)
        ended = ended or ("stop" if self.stream.stopped else None)
        self.tally.add(event)
        if not self.first_token_s and event.emitted:
            self.first_token_s = time.perf_counter() - self.started
        return event, ended

    def remaining(self) -> int:
        """Tokens this answer may still have (its request's budget: the one count of it)."""
        return max(self.params.max_tokens - self.tally.generated, 0)

    def finish(self, stop_reason: str, prefill: Prefill, wall_s: float, estimate_tokens_per_s: float,
               drafter: str, kv_tokens: int) -> list[Round | Summary]:
        """The last events: text held back for a stop string that never came, then the summary."""
        out: list[Round | Summary] = []
        tail = self.stream.flush()
        if tail:
            out.append(Round(index=self.tally.rounds, drafter="none", accepted=(), rejected=(), token=None,
                             token_kind="", accepted_text="", rejected_text="", token_text="", text=tail,
                             draft_s=0.0, verify_s=0.0))
        out.append(self.tally.summary(text=self.stream.text, stop_reason=stop_reason, prefill=prefill, wall_s=wall_s,
                                      baseline_tokens_per_s=estimate_tokens_per_s, drafter=drafter,
                                      first_token_s=self.first_token_s, kv_tokens=kv_tokens))
        return out

    def _within_budget(self, step: Step, room: int) -> tuple[list[int], str | None]:
        """The round's tokens (accepted draft, then the target's own) up to the end of the answer: an
        end-of-generation token, or the token budget."""
        kept: list[int] = []
        for tok in [*step.draft.tokens[:step.accepted], step.token]:
            if self.vocab.is_eog(tok):
                return kept, "eog"
            kept.append(tok)
            if len(kept) >= room:
                return kept, "length"
        return kept, None

    def _round(self, step: Step, kept: list[int], ended: str | None, index: int, seconds: float,
               speedup: Speedup) -> Round:
        """The round as the front doors see it: what was kept, rejected and supplied, and its text."""
        vocab, stream = self.vocab, self.stream
        accepted = tuple(kept[:step.accepted])
        token = kept[step.accepted] if len(kept) > step.accepted else None
        rejected = tuple(step.draft.tokens[step.accepted:]) if ended is None or token is not None else ()
        pieces, shown = [], ""
        for t in accepted:  # token by token: front doors that apply per-token rules get each token's text
            decoded, visible = stream.feed(vocab.token_bytes(t))
            pieces.append(decoded)
            shown += visible
        accepted_text = "".join(pieces)
        rejected_text = stream.piece(b"".join(vocab.token_bytes(t) for t in rejected))
        token_text = ""
        if token is not None:
            token_text, visible = stream.feed(vocab.token_bytes(token))
            pieces.append(token_text)
            shown += visible
        return Round(
            index=index,
            drafter=step.draft.source if step.draft.tokens else "none",
            accepted=accepted,
            rejected=rejected,
            token=token,
            token_kind=step.kind if token is not None else "",
            accepted_text=accepted_text,
            rejected_text=rejected_text,
            token_text=token_text,
            text=shown,
            draft_s=step.draft.seconds,
            verify_s=step.verify_s,
            evidence=step.draft.evidence,
            pieces=tuple(pieces),
            seconds=seconds,
            speedup=speedup.factor,
            baseline_tokens_per_s=speedup.baseline_tokens_per_s,
            baseline_measured=speedup.measured,
            shared=step.shared,
            logprobs=step.logprobs[:len(kept)],
            candidates=step.candidates,
            took_second=step.took_second,
        )

