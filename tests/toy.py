"""A deterministic in-process model with the backend's interface, for exactness tests.

Logits at a position depend on the two previous tokens through fixed random tables. The KV cache is
a list of tokens; `decode` insists that it continues exactly where the cache ends, so any bookkeeping
mistake in the engine fails loudly instead of silently using a wrong state. `batch_noise` moves the
logits of calls that evaluate 4 or more positions a little, as llama.cpp's batched kernels do
(docs/findings.md), so that near ties can flip between a verify batch and one-token decoding.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np


class ToyVocab:
    type = "toy"
    bos = 0
    eos = 1
    eot = -1
    add_bos = True
    add_eos = False
    fim_pre = fim_suf = fim_mid = fim_rep = fim_sep = -1

    def __init__(self, n_tokens: int):
        self.n_tokens = n_tokens

    def text(self, token: int) -> str:
        return f"t{token}"

    def is_eog(self, token: int) -> bool:
        return token == self.eos

    def is_control(self, token: int) -> bool:
        return token in (self.bos, self.eos)

    def token_bytes(self, token: int) -> bytes:
        if token < 2:
            return b""
        if token == 2:
            return "é".encode()[:1]   # half of a two-byte character...
        if token == 3:
            return "é".encode()[1:]   # ...and its other half
        return f"w{token} ".encode()

    def grammar(self, text: str, trigger: str | None = None) -> "ToyGrammar":
        """A DFA over token ids as JSON: {"start": 0, "edges": {"0": {"5": 1, ...}, ...}, "final": [1]};
        the end of the text (eos) is allowed in final states only. `trigger`: one token's text; any
        tokens until it, then the DFA, which reads the trigger token first."""
        spec = json.loads(text)
        edges = {int(s): {int(t): int(d) for t, d in out.items()} for s, out in spec["edges"].items()}
        waits_for = None
        if trigger is not None:
            (waits_for,) = self.tokenize(trigger, add_special=False)
        return ToyGrammar(edges, set(spec["final"]), int(spec["start"]), self.eos, waits_for=waits_for)

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        ids = [4 + (ord(c) % (self.n_tokens - 4)) for c in text]
        return ([self.bos] if add_special else []) + ids


@dataclass
class ToyGrammar:
    """A DFA state: what `engine.constraint.Constraint` asks of a grammar. Accepting a forbidden token
    fails loudly, as llama.cpp's grammar aborts the process."""
    edges: dict[int, dict[int, int]]
    final: set[int]
    state: int
    eos: int
    forks: list[int] = field(default_factory=lambda: [0])  # shared: forks made, for tests to count
    closed: bool = False
    waits_for: int | None = None  # a lazy grammar's trigger token, until it is accepted

    def allows(self, tokens) -> np.ndarray:
        if self.waits_for is not None:
            return np.ones(len(tokens), dtype=bool)
        out = self.edges.get(self.state, {})
        return np.array([int(t) in out or (int(t) == self.eos and self.state in self.final) for t in tokens])

    def accept(self, token: int) -> None:
        if self.waits_for is not None:
            if token != self.waits_for:
                return
            self.waits_for = None
        assert not self.closed and self.allows([token])[0], f"token {token} is not allowed in state {self.state}"
        if token != self.eos:
            self.state = self.edges[self.state][token]

    def fork(self) -> "ToyGrammar":
        self.forks[0] += 1
        return ToyGrammar(self.edges, self.final, self.state, self.eos, self.forks, waits_for=self.waits_for)

    def close(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class ToyOptions:
    """How a toy is "loaded": on this CPU, one thread."""
    placement: str = ""
    flash_attn: bool | None = None

    def threads(self) -> int:
        return 1

    def gpu_layers(self) -> int:
        return 0


class ToyModel:
    path: Path | None = None  # no file: its costs are never cached
    build = "toy"
    options = ToyOptions()
    def __init__(self, n_vocab: int = 48, seed: int = 0, n_ctx: int = 512, sharpness: float = 3.0, noise_seed: int | None = None,
                 noise: float = 0.0, eos_bias: float = -4.0, n_seq: int = 1, batch_noise: float = 0.0,
                 tree_seqs: int = 0):
        rng = np.random.default_rng(seed)
        self.n_vocab = n_vocab
        self.n_ctx = n_ctx
        self.n_batch = n_ctx  # tokens one decode may hold
        self.vocab = ToyVocab(n_vocab)
        self.a = rng.normal(size=(n_vocab, n_vocab)) * sharpness
        self.b = rng.normal(size=(n_vocab, n_vocab)) * sharpness * 0.5
        if noise_seed is not None:  # a "draft" that agrees with the target only partly
            nrng = np.random.default_rng(noise_seed)
            self.a = self.a + nrng.normal(size=self.a.shape) * noise
            self.b = self.b + nrng.normal(size=self.b.shape) * noise
        self.a[:, 1] += eos_bias
        self.batch_noise = batch_noise
        self.n_seq = n_seq
        self.seqs: dict[int, list[int]] = {s: [] for s in range(n_seq + tree_seqs)}  # each sequence's cache (slots)
        self.spare_seqs = tuple(range(n_seq, n_seq + tree_seqs))  # a candidate tree's other branches
        self.trees: list[int] = []  # the nodes of every tree verified
        self.tokens = self.seqs[0]
        self.evaluated = 0
        self.calls: list[tuple[int, int]] = []  # (start, n) of every decode
        self.steps: list[list[tuple[int, int, int]]] = []  # every decode_many call's (seq, start, n) parts

    def logits_at(self, prefix: list[int]) -> np.ndarray:
        p1 = prefix[-1]
        p2 = prefix[-2] if len(prefix) > 1 else 0
        return (self.a[p1] + self.b[p2]).astype(np.float32)

    def decode(self, tokens: list[int], start: int, logits_for: list[int], seq: int = 0) -> np.ndarray:
        held = self.seqs[seq]
        assert start == len(held), f"decode at {start} but sequence {seq} holds {len(held)}"
        assert start + len(tokens) <= self.n_ctx
        held.extend(tokens)
        self.evaluated += len(tokens)
        self.calls.append((start, len(tokens)))
        rows = [self.logits_at(held[: start + i + 1]) for i in logits_for]
        if self.batch_noise and len(tokens) >= 4:
            rows = [row + self._kernel_noise(held[: start + i + 1]) for row, i in zip(rows, logits_for)]
        return np.stack(rows) if rows else np.zeros((0, self.n_vocab), np.float32)

    def decode_many(self, parts) -> list[np.ndarray]:
        """One call for several sequences (llama.cpp's batch of several seq ids); `steps` records each
        call's (seq, start, n) parts, so tests see which positions were evaluated together."""
        assert sum(outputs for *_rest, outputs in parts) <= 64, "more logits rows than llama.cpp's context gives"
        assert sum(len(tokens) for _seq, tokens, _start, _outputs in parts) <= self.n_batch, "more than a batch"
        self.steps.append([(seq, start, len(tokens)) for seq, tokens, start, _outputs in parts])
        return [self.decode(list(tokens), start, list(range(len(tokens) - outputs, len(tokens))), seq=seq)
                for seq, tokens, start, outputs in parts]

    def copy_seq(self, src: int, dst: int) -> None:
        self.seqs[dst][:] = self.seqs[src]

    def fork(self, seq: int, spares) -> None:
        for spare in spares:
            self.seqs[spare][:] = self.seqs[seq]

    def decode_placed(self, tokens, positions, holders) -> np.ndarray:
        """llama.cpp's batch of tokens in several sequences: each sequence gets its tokens in order, and a
        token's logits follow the context of the sequences holding it (which must agree)."""
        assert self.spare_seqs, "a toy without spare sequences verifies chains only"
        self.trees.append(len(tokens) - 1)
        rows = []
        for token, pos, seqs in zip(tokens, positions, holders):
            for seq in seqs:
                assert len(self.seqs[seq]) == pos, f"sequence {seq} holds {len(self.seqs[seq])}, token at {pos}"
                self.seqs[seq].append(token)
            contexts = {tuple(self.seqs[seq]) for seq in seqs}
            assert len(contexts) == 1, "the sequences holding a token must hold the same context"
            rows.append(self.logits_at(list(contexts.pop())))
        self.evaluated += len(tokens)
        return np.stack(rows)

    def settle_branches(self, seq: int, keeper: int, spares, start: int, n_keep: int) -> None:
        kept = self.seqs[keeper][start:n_keep]
        self.seqs[seq][start:] = kept
        for spare in spares:
            self.seqs[spare].clear()

    def _kernel_noise(self, prefix: list[int]) -> np.ndarray:
        p2 = prefix[-2] if len(prefix) > 1 else 0
        noise = np.random.default_rng([prefix[-1], p2]).uniform(-1, 1, self.n_vocab) * self.batch_noise
        return noise.astype(np.float32)

    max_rollback: int | None = None  # any position can be dropped (a recurrent toy sets a limit)
    mtp: "ToyHead | None" = None  # a multi-token-prediction head, where a test gives it one
    projector = None  # (text only)

    def truncate(self, n_keep: int, seq: int = 0) -> int:
        del self.seqs[seq][n_keep:]
        return len(self.seqs[seq])

    def checkpoint(self, seq: int = 0) -> None:
        pass  # every position can be dropped

    can_shift = True

    def cut(self, p0: int, p1: int, seq: int = 0) -> None:
        del self.seqs[seq][p0:p1]  # later positions move down, as llama.cpp's K-shift moves them

    def chat_template(self):
        return None

    def meta(self, key: str) -> str | None:
        return None

    def close(self) -> None:
        pass


class RecurrentToy(ToyModel):
    """A toy whose sequences behave as a recurrent state in llama.cpp (backend.Model with n_rs_seq): the
    last `max_rollback` positions can be dropped only right after the decode that wrote them, once; a
    checkpoint taken after a prompt is the only other way back; otherwise the sequence is emptied."""

    def __init__(self, *args, max_rollback: int = 2, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_rollback = self._limit = max_rollback
        self._removable = {s: 0 for s in self.seqs}
        self._checkpoints: dict[int, list[int]] = {s: [] for s in self.seqs}

    def decode(self, tokens: list[int], start: int, logits_for: list[int], seq: int = 0) -> np.ndarray:
        rows = super().decode(tokens, start, logits_for, seq)
        self._removable[seq] = min(len(tokens) - 1, self._limit)
        return rows

    def truncate(self, n_keep: int, seq: int = 0) -> int:
        held = len(self.seqs[seq])
        removable, self._removable[seq] = self._removable[seq], 0
        if n_keep >= held or held - n_keep <= removable:
            return super().truncate(n_keep, seq)
        points = [p for p in self._checkpoints[seq] if p <= n_keep]
        self._checkpoints[seq] = points
        return super().truncate(points[-1] if points else 0, seq)

    def checkpoint(self, seq: int = 0) -> None:
        self._checkpoints[seq].append(len(self.seqs[seq]))


class ToyHead:
    """A toy target's multi-token-prediction head, through the calls backend.mtp.MtpHead answers: its
    logits are those of `model` (a noisy copy of the target's tables: a head that agrees only partly),
    and the "hidden state" before a position is the token there, so a step sees the two tokens the target
    would. Drafting must start where the target's cache ends (the pending token's position)."""

    n_embd = 1

    def __init__(self, target: ToyModel, model: ToyModel, max_steps: int | None = None):
        self.max_steps = max_steps  # as chained heads are: a draft of at most this many tokens
        self.target = target
        self.model = model
        self.steps = 0
        self.forgotten: list[tuple[int, int]] = []
        self.many: list[list[int]] = []  # the sequences of each predict_many call

    def hidden_at(self, seq: int, pos: int) -> np.ndarray:
        held = self.target.seqs[seq]
        return np.array([held[pos] if 0 <= pos < len(held) else 0], dtype=np.float32)

    def predict(self, seq: int, token: int, pos: int, hidden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        assert pos >= len(self.target.seqs[seq]), f"a head step at {pos} inside the target's cache"
        if self.max_steps is not None:
            assert pos - len(self.target.seqs[seq]) < self.max_steps, f"a draft step past the {self.max_steps} heads"
        self.steps += 1
        return self.model.logits_at([int(hidden[0]), token]), np.array([token], dtype=np.float32)

    def forget(self, seq: int, pos: int) -> None:
        self.forgotten.append((seq, pos))

    def predict_many(self, steps) -> list[tuple[np.ndarray, np.ndarray]]:
        self.many.append([seq for seq, _token, _pos, _hidden in steps])
        return [self.predict(*step) for step in steps]


class ToyBlock:
    """A toy block drafter, through the call backend.dflash.DFlashDraft answers: the n tokens after the
    pending one from `model` (a noisy copy of the target's tables) in one call, each row its logits
    after the greedy chain before it. Drafting must start where the target's cache ends."""

    block_size = 8

    def __init__(self, target: ToyModel, model: ToyModel):
        self.target = target
        self.model = model
        self.passes: list[tuple[int, int]] = []  # (pos, n) of each pass

    def predict_block(self, seq: int, token: int, pos: int, n: int) -> np.ndarray:
        held = self.target.seqs[seq]
        assert pos == len(held), f"a block at {pos} but the target's cache holds {len(held)}"
        self.passes.append((pos, n))
        chain, rows = list(held) + [token], []
        for _ in range(n):
            rows.append(self.model.logits_at(chain))
            chain.append(int(np.argmax(rows[-1])))
        return np.stack(rows)


if TYPE_CHECKING:  # the pin: the toy implements what the engine needs of a model (mypy, tests/test_layers.py)
    from localspec.engine.model import BlockHead, LanguageModel, PredictionHead

    def _the_toy_implements_the_boundary(toy: ToyModel) -> LanguageModel:
        return toy

    def _the_toy_head_implements_the_boundary(head: ToyHead) -> PredictionHead:
        return head

    def _the_toy_block_implements_the_boundary(block: ToyBlock) -> BlockHead:
        return block


TWO_TOKEN_TOY = dict(n_vocab=8, seed=4, sharpness=1.0, eos_bias=-50.0)  # small enough to enumerate


def exact_two_tokens(prompt: list[int], **toy) -> dict[tuple[int, int], float]:
    """The exact distribution of the first two tokens sampled at temperature 1 after `prompt`, for the
    exactness checks of speculative sampling."""
    target = ToyModel(**toy)

    def softmax(logits):
        e = np.exp(logits - logits.max())
        return e / e.sum()

    p1 = softmax(target.logits_at(prompt))
    n = target.n_vocab
    return {(a, b): p1[a] * softmax(target.logits_at(prompt + [a]))[b] for a in range(n) for b in range(n)}


class CpuScript:
    """Stands in for `engine.calibration.cpu_sample`: each call is `wall_step` seconds after the last,
    in which this process used `share` of `threads` cores and other programs `others` of `cores`."""

    def __init__(self, share: float = 1.0, others: float = 0.0, threads: int = 1, cores: int = 1, wall_step: float = 1.0):
        self.share, self.others, self.threads, self.cores, self.wall_step = share, others, threads, cores, wall_step
        self.wall = self.process = self.busy = 0.0

    def __call__(self):
        from localspec.engine.cpu_load import CpuSample

        sample = CpuSample(self.wall, self.process, self.busy)
        own = self.share * self.threads * self.wall_step
        self.wall += self.wall_step
        self.process += own
        self.busy += own + self.others * self.cores * self.wall_step
        return sample


def step_until_done(engine, lanes) -> None:
    """Step only `lanes` (the others wait, as the scheduler steps an editor's completion) until they end."""
    while any(lane is held for lane in lanes for held in engine.core.lanes):
        engine.step(only=lanes)


def submit_one(engine, prompt, deliver, *, max_tokens=512, sampling=None, drafter=None, draft_len="default", stop=(),
               cancel=None, urgent=False):
    """One sequence submitted (`Engine.submit` of a one-sequence request) with its events, not
    (0, event), handed to `deliver`; its lane."""
    from localspec.engine.params import GenerationParams

    params = GenerationParams.one(sampling, max_tokens=max_tokens, stop=stop, drafter=drafter, draft_len=draft_len)
    [lane] = engine.submit(prompt, params, lambda item: deliver(item if isinstance(item, Exception) else item[1]),
                           cancel=cancel, cancels=None if cancel is None else [cancel], urgent=urgent)
    return lane
