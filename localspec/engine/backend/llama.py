"""llama.cpp's models through llama-cpp-python's low-level C bindings: a model with its context and KV
sequences (`Model`): decoding, rolling back, recurrent checkpoints, candidate trees, following heads.
How it is loaded: backend/options.py; the file, its tokenizer and metadata: backend/gguf.py; images in
its prompts: backend/images.py."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import llama_cpp as L
import numpy as np

from localspec.engine.backend.gguf import Vocab, _load_model, _Metadata
from localspec.engine.backend.grids import Grids
from localspec.engine.backend.images import ImageDecoding
from localspec.engine.backend.mtp import MtpHead, record_hidden
from localspec.engine.backend.options import ModelOptions
from localspec.engine.backend.staging import Follower, logits_rows
from localspec.engine.backend.staging import unavailable as heads_unavailable
from localspec.engine.backend.system import build_id, problems_mark, problems_since
from localspec.errors import ContextOverflowError, LocalspecError


if TYPE_CHECKING:
    from localspec.engine.backend.vision import Projector

# A recurrent state's checkpoints kept per sequence (llama-server's context checkpoints), the newest: taken
# after each prompt evaluation (`checkpoint`), so a follow-up whose prompt parts from the cache inside the
# last answer restarts from the prompt's end instead of from the first token. Each holds one copy of the
# recurrent state.
CHECKPOINTS_PER_SEQ = 3


class Model(ImageDecoding, _Metadata):
    """One GGUF with one context: decode at explicit positions, roll back the KV cache.

    `options.n_seq` sequences (slots), each with its own `n_ctx` cells. `decode` appends tokens at
    positions start…start+n-1 of one sequence and returns logits for the indices in `logits_for` only.
    """

    def __init__(self, path: Path | str, options: ModelOptions | None = None):
        self.path = Path(path)
        self.options = options or ModelOptions()
        self._model = self._ctx = None
        self._batch = None
        self._attached: list[Callable[[], None]] = []
        self._model = _load_model(self.path, vocab_only=False, n_gpu_layers=self.options.gpu_layers(),
                                  load_mode=self.options.load_mode(), devices=self.options.devices,
                                  tensor_split=self.options.tensor_split,
                                  load_mtp=self.options.mtp and not heads_unavailable())
        self.vocab = Vocab(self._model)
        self.n_vocab = self.vocab.n_tokens
        self.n_ctx_train = L.llama_model_n_ctx_train(self._model)
        self.n_layer = L.llama_model_n_layer(self._model)
        self.size_bytes = L.llama_model_size(self._model)
        self.n_params = L.llama_model_n_params(self._model)
        self.architecture = self.meta("general.architecture") or "unknown"
        # Recurrent layers (Mamba, LFM2's short convolutions, Qwen3.5's delta net) keep one state per
        # sequence, not one entry per position: a position can be removed only while llama.cpp still holds
        # a snapshot from before it (n_rs_seq), and only for the architectures it keeps them for.
        self.recurrent = bool(L.llama_model_is_recurrent(self._model) or L.llama_model_is_hybrid(self._model))

        n_ctx = min(self.options.n_ctx, self.n_ctx_train) if self.n_ctx_train > 0 else self.options.n_ctx
        cparams = L.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = min(self.options.n_batch, n_ctx)
        cparams.n_ubatch = cparams.n_batch
        cparams.n_seq_max = max(1, self.options.n_seq)
        # Each sequence its own cells by default: a slot's attention never spans the others'.
        cparams.kv_unified = self.options.kv_unified
        trees = self.options.tree_seqs if self.options.n_seq <= 1 and not self.recurrent else 0
        if trees:
            # a token in several sequences needs them in one buffer (llama-batch.cpp: coupled sequences)
            cparams.n_seq_max, cparams.kv_unified = 1 + trees, True
        # Logits are asked for a few positions per call (a verify batch), never a whole batch: a
        # buffer for n_batch rows would cost n_batch x n_vocab floats (311 MB for Qwen) per model.
        cparams.n_outputs_max = self.options.n_outputs_max
        cparams.n_threads = self.options.threads()
        cparams.n_threads_batch = self.options.threads()
        cparams.no_perf = True
        cparams.flash_attn_type = self.options.attention_type()
        if self.recurrent:
            # A verify (up to n_rs_seq + 1 tokens) must fit one micro-batch for its snapshots to cover it
            cparams.n_rs_seq = max(0, self.options.rollback)
            cparams.n_ubatch = max(cparams.n_ubatch, cparams.n_rs_seq + 1)
        mark = problems_mark()
        self._ctx = L.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            why = problems_since(mark) or "out of memory?"
            self.close()
            raise LocalspecError(f"Cannot create a context of {n_ctx} tokens for {self.path.name}: {why}")
        self.n_seq = cparams.n_seq_max - trees
        self._spares = tuple(range(self.n_seq, cparams.n_seq_max))
        self._tree_batch = None  # a batch whose tokens may each be in every sequence (made at first use)
        self.n_ctx = L.llama_n_ctx_seq(self._ctx)  # per sequence: what one request may hold
        self.n_batch = L.llama_n_batch(self._ctx)
        self._memory = L.llama_get_memory(self._ctx)
        self._batch = L.llama_batch_init(self.n_batch, 0, 1)
        self.projector: Projector | None = None  # images in prompts (attach_projector)
        self._embd_batch: Any = None  # an image's rows (made at first use)
        # Per sequence, the images placed with M-RoPE positions: (first index, rows, positions taken). A
        # sequence's positions are its indices less what the images before took fewer (`_pos`, `_index`).
        self._grids = Grids(cparams.n_seq_max)
        newline = self.vocab.tokenize("\n", add_special=False, parse_special=False)
        self._blank = newline[0] if newline else max(self.vocab.bos, 0)  # what a model without a projector sees of an image
        # How many of its last positions a sequence can drop (None: any). A recurrent state rolls back
        # only within the tokens of the decode that wrote it, once (`_removable`).
        self.max_rollback: int | None = L.llama_n_rs_seq(self._ctx) if self.recurrent else None
        self._removable = [0] * self.n_seq  # per sequence: positions its last decode lets it drop
        self._checkpoints: list[list[tuple[int, ctypes.Array]]] = [[] for _ in range(self.n_seq)]
        # The file's MTP heads (Qwen3.5 and kin), followed decode by decode for the `mtp` drafter.
        self.n_mtp_layers = L.llama_model_n_layer_nextn(self._model)
        self.mtp: MtpHead | None = None
        # Heads whose caches follow this one's, decode by decode (the MTP head, an EAGLE-3 draft).
        self._followers: list[Follower] = []
        if self.n_mtp_layers > 0 and self.options.mtp and not heads_unavailable():
            try:
                self.mtp = MtpHead(self._model, self._ctx, n_layers=self.n_mtp_layers, n_vocab=self.n_vocab,
                                   kv_unified=self.options.kv_unified, threads=self.options.threads(),
                                   attention_type=self.options.attention_type(), name=self.path.name)
            except LocalspecError:
                self.close()
                raise
            self.add_follower(self.mtp)
            record_hidden(self._ctx)

    # --- metadata

    def description(self) -> str:
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    # --- the KV cache

    def decode(self, tokens: list[int], start: int, logits_for: list[int] | tuple[int, ...] = (),
               seq: int = 0) -> np.ndarray:
        """Evaluate `tokens` at positions start… of sequence `seq`; return logits rows for the indices in
        `logits_for`."""
        if not tokens:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        if min(tokens) < 0:
            return self._decode_runs(tokens, start, logits_for, seq)
        if start + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{start + len(tokens)} tokens do not fit the context window of {self.n_ctx} tokens."
            )
        rows_of: dict[int, list[int]] = {}  # token index -> the output rows that want its logits
        for row, index in enumerate(logits_for):
            rows_of.setdefault(index, []).append(row)
        if rows_of and not (0 <= min(rows_of) and max(rows_of) < len(tokens)):
            raise ValueError(f"logits asked for positions outside the {len(tokens)} tokens evaluated")
        limit = self.options.n_outputs_max or self.n_batch
        if len(rows_of) > limit:
            raise LocalspecError(f"At most {limit} logits rows per decode call; {len(rows_of)} asked.")
        out = np.empty((len(logits_for), self.n_vocab), dtype=np.float32)  # filled straight from llama.cpp's buffer
        batch = self._batch
        assert batch is not None, "decode after close()"
        first_pos = self._grids.pos(seq, start)
        for chunk_start in range(0, len(tokens), self.n_batch):
            chunk = tokens[chunk_start:chunk_start + self.n_batch]
            batch.n_tokens = len(chunk)
            outputs = []
            for j, token in enumerate(chunk):
                batch.token[j] = token
                batch.pos[j] = first_pos + chunk_start + j
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = seq
                want = (chunk_start + j) in rows_of
                batch.logits[j] = want
                if want:
                    outputs.append(j)
            self._run([(seq, chunk, start + chunk_start)])
            for j in outputs:
                logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self._ctx, j), shape=(self.n_vocab,))
                for row in rows_of[chunk_start + j]:
                    out[row] = logits
        return out

    def decode_many(self, parts: Sequence[tuple[int, list[int], int, int]]) -> list[np.ndarray]:
        """Several sequences in one `llama_decode`: each part is (seq, tokens, start, outputs), and gets
        back the logits after each of its last `outputs` tokens, (outputs, n_vocab). At most n_batch
        tokens in all (a step of several requests, not a prompt). A prompt's chunk with images has its
        text and images up to its last image evaluated first, alone (`_decode_runs`)."""
        if any(tokens and min(tokens) < 0 for _seq, tokens, _start, _outputs in parts):
            return self._images_first(parts)
        n = sum(len(tokens) for _seq, tokens, _start, _outputs in parts)
        wanted = sum(outputs for *_rest, outputs in parts)
        if n > self.n_batch:
            raise LocalspecError(f"At most {self.n_batch} tokens in one step of several sequences; {n} asked.")
        if wanted > (limit := self.options.n_outputs_max or self.n_batch):
            raise LocalspecError(f"At most {limit} logits rows in one step of several sequences; {wanted} asked.")
        batch = self._batch
        assert batch is not None, "decode after close()"
        j, outputs = 0, []
        for seq, tokens, start, count in parts:
            if not tokens or not 1 <= count <= len(tokens):
                raise ValueError("every sequence of a step evaluates a token and takes logits for 1 to all of them")
            if start + len(tokens) > self.n_ctx:
                raise ContextOverflowError(
                    f"{start + len(tokens)} tokens do not fit the context window of {self.n_ctx} tokens.")
            first_pos = self._grids.pos(seq, start)
            for i, token in enumerate(tokens):
                batch.token[j] = token
                batch.pos[j] = first_pos + i
                batch.n_seq_id[j] = 1
                batch.seq_id[j][0] = seq
                batch.logits[j] = i >= len(tokens) - count
                j += 1
            outputs.append(list(range(j - count, j)))
        batch.n_tokens = j
        self._run([(seq, tokens, start) for seq, tokens, start, _outputs in parts])
        return [self._logits_rows(rows) for rows in outputs]

    def _logits_rows(self, rows: Sequence[int]) -> np.ndarray:
        """The last decode's logits at these batch indices, (len(rows), n_vocab), copied out of llama.cpp's
        buffer (the next decode overwrites it)."""
        return logits_rows(self._ctx, rows, self.n_vocab)

    @property
    def spare_seqs(self) -> tuple[int, ...]:
        """The sequences a candidate tree's other branches use; none while heads follow this cache (they
        would see the tree's rows as a sequence's)."""
        return () if self._followers or self._gridded else self._spares

    def fork(self, seq: int, spares: Sequence[int]) -> None:
        """Each of `spares` holds what `seq` holds (in the one buffer: each cell gains a sequence id)."""
        for spare in spares:
            L.llama_memory_seq_rm(self._memory, spare, -1, -1)
            L.llama_memory_seq_cp(self._memory, seq, spare, -1, -1)

    def decode_placed(self, tokens: Sequence[int], positions: Sequence[int],
                      holders: Sequence[Sequence[int]]) -> np.ndarray:
        """One `llama_decode` of tokens each held by the sequences given (a candidate tree laid out by
        engine/tree.py's `place`), the logits after every one, (len(tokens), n_vocab)."""
        if not self.spare_seqs:
            raise LocalspecError(f"{self.path.name} was loaded without room for candidate trees.")
        if len(tokens) > (limit := self.options.n_outputs_max or self.n_batch):
            raise LocalspecError(f"At most {limit} logits rows per decode call; {len(tokens)} asked.")
        if max(positions) >= self.n_ctx:
            raise ContextOverflowError(f"{max(positions) + 1} tokens do not fit the context window of {self.n_ctx} tokens.")
        batch = self._tree_batch
        if batch is None:
            batch = self._tree_batch = L.llama_batch_init(limit, 0, 1 + len(self.spare_seqs))
        for j, (token, pos, seqs) in enumerate(zip(tokens, positions, holders)):
            batch.token[j] = token
            batch.pos[j] = pos
            batch.n_seq_id[j] = len(seqs)
            for k, seq in enumerate(seqs):
                batch.seq_id[j][k] = seq
            batch.logits[j] = True
        batch.n_tokens = len(tokens)
        self._run([], batch)  # (no parts: a tree's rows are no sequence's, and no head follows while trees are drafted)
        return self._logits_rows(range(len(tokens)))

    def settle_branches(self, seq: int, keeper: int, spares: Sequence[int], start: int, n_keep: int) -> None:
        """After a tree's verify: `seq` keeps its positions before `start`, then `keeper`'s up to `n_keep`
        (the kept branch); the spares hold nothing."""
        if keeper != seq:
            L.llama_memory_seq_rm(self._memory, seq, start, -1)
            L.llama_memory_seq_cp(self._memory, keeper, seq, start, n_keep)
        for spare in spares:
            L.llama_memory_seq_rm(self._memory, spare, -1, -1)
        L.llama_memory_seq_rm(self._memory, seq, n_keep, -1)

    def _run(self, parts: list[tuple[int, list[int], int]], batch=None) -> None:
        """The model's one `llama_decode`: the batch as filled (`batch`, else the model's own), holding these
        (seq, tokens, start) parts in order; the followers (prediction heads) see the same rows."""
        rc = L.llama_decode(self._ctx, self._batch if batch is None else batch)
        if rc == 1:
            raise ContextOverflowError(f"The KV cache of {self.path.name} is full ({self.n_ctx} tokens).")
        if rc != 0:
            raise LocalspecError(f"llama_decode failed with code {rc} on {self.path.name}.")
        for seq, tokens, _start in parts:
            self._removable[seq] = len(tokens) - 1
        if self._followers:
            first, follow = 0, []
            for seq, tokens, start in parts:
                # an image's rows: the heads pair the target's states there with the same newline a draft model
                # sees (llama.cpp's draft-mtp skips them and leaves a gap)
                follow.append((seq, self._as_text(tokens), start, range(first, first + len(tokens))))
                first += len(tokens)
            for follower in self._followers:
                follower.follow(follow)

    def copy_seq(self, src: int, dst: int) -> None:
        """Make sequence `dst` hold exactly what `src` holds (each sequence has its own cells here, so
        llama.cpp copies the whole buffer at the next decode: a prompt evaluated once, shared)."""
        if src == dst:
            return
        L.llama_memory_seq_rm(self._memory, dst, -1, -1)
        L.llama_memory_seq_cp(self._memory, src, dst, -1, -1)
        self._grids.copy(src, dst)
        self._removable[dst] = 0
        self._checkpoints[dst] = []
        for follower in self._followers:
            follower.copy_seq(src, dst)

    def checkpoint(self, seq: int = 0) -> None:
        """Keep the recurrent state of `seq` as it is now, for a later `truncate` that goes back further
        than its snapshots; nothing for a model without recurrent layers."""
        if not self.recurrent:
            return
        pos = self._grids.index(seq, L.llama_memory_seq_pos_max(self._memory, seq) + 1)  # (an index: `_restore`)
        flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY  # the recurrent layers only: attention keeps every position
        size = L.llama_state_seq_get_size_ext(self._ctx, seq, flags)
        data = (ctypes.c_uint8 * size)()
        if L.llama_state_seq_get_data_ext(self._ctx, data, size, seq, flags) != size:
            return
        kept = [c for c in self._checkpoints[seq] if c[0] < pos]
        self._checkpoints[seq] = (kept + [(pos, data)])[-CHECKPOINTS_PER_SEQ:]

    def checkpoint_bytes(self, seq: int = 0) -> int:
        """What one checkpoint of `seq` holds: its recurrent state (0 without recurrent layers)."""
        if not self.recurrent:
            return 0
        return L.llama_state_seq_get_size_ext(self._ctx, seq, L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY)

    def _restore(self, seq: int, n_keep: int) -> int:
        """The newest checkpoint (all are at or before `n_keep`) put back; returns its position (0: none)."""
        while self._checkpoints[seq]:
            pos, data = self._checkpoints[seq][-1]
            flags = L.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
            if (L.llama_state_seq_set_data_ext(self._ctx, data, len(data), seq, flags) == len(data)
                    and L.llama_memory_seq_rm(self._memory, seq, self._grids.pos(seq, pos), -1)):
                self._grids.forget(seq, pos)
                return pos
            self._checkpoints[seq].pop()
        L.llama_memory_seq_rm(self._memory, seq, -1, -1)
        self._grids.empty(seq)
        return 0

    def truncate(self, n_keep: int, seq: int = 0) -> int:
        """Forget every position >= n_keep of sequence `seq`; returns how many positions it holds after.

        That is `n_keep`, except for a recurrent state that cannot go back that far (more than the last
        decode's snapshots, or a second time since it): it goes back to its newest checkpoint at or before
        `n_keep` and returns that position (0: none, the sequence is emptied). Following heads' caches
        follow."""
        held = self._truncate(n_keep, seq)
        for follower in self._followers:
            follower.truncate(seq, held)
        return held

    def _truncate(self, n_keep: int, seq: int) -> int:
        if self.recurrent:
            held = self._grids.index(seq, L.llama_memory_seq_pos_max(self._memory, seq) + 1)
            if n_keep >= held:
                return held
            removable, self._removable[seq] = self._removable[seq], 0  # llama.cpp restores one snapshot per decode
            self._checkpoints[seq] = [c for c in self._checkpoints[seq] if c[0] <= n_keep]  # the later ones go
            if 0 < held - n_keep <= removable and L.llama_memory_seq_rm(self._memory, seq, self._grids.pos(seq, n_keep), -1):
                return self._grids.forget(seq, n_keep)
            return self._restore(seq, n_keep)
        n_keep = self._grids.forget(seq, n_keep)
        if not L.llama_memory_seq_rm(self._memory, seq, self._grids.pos(seq, n_keep), -1):
            L.llama_memory_clear(self._memory, True)
            raise LocalspecError("llama.cpp could not remove part of the KV cache; it was cleared.")
        return n_keep

    @property
    def build(self) -> str:
        return build_id()

    @property
    def can_shift(self) -> bool:
        """Whether cached positions can be moved (`cut`): llama.cpp's K-shift, not for every model, and
        never past a recurrent state (it would still hold the tokens cut out), nor with heads following
        (their caches pair each position with the target's states, which a shift would not move)."""
        return (not self.recurrent and not self._followers and not self._gridded
                and bool(L.llama_memory_can_shift(self._memory)))

    def cut(self, p0: int, p1: int, seq: int = 0) -> None:
        """Remove positions p0..p1-1 of sequence `seq` and move every later one down by p1 - p0 (their
        keys are rotated to the new positions: llama-server's --cache-reuse)."""
        if not L.llama_memory_seq_rm(self._memory, seq, p0, p1):
            L.llama_memory_clear(self._memory, True)
            raise LocalspecError("llama.cpp could not remove part of the KV cache; it was cleared.")
        L.llama_memory_seq_add(self._memory, seq, p1, -1, p0 - p1)

    def clear(self) -> None:
        L.llama_memory_clear(self._memory, True)
        for follower in self._followers:
            follower.clear()
        self._removable = [0] * self.n_seq
        self._checkpoints = [[] for _ in range(self.n_seq)]
        self._grids.clear()

    def add_follower(self, head: "Follower") -> None:
        """A head whose cache follows this model's (backend/mtp.py, backend/eagle3.py): it sees every
        decode, truncation, sequence copy and clear from now on, and closes before the weights."""
        self._followers.append(head)
        self.attach(head.close)

    def attach(self, close: Callable[[], None]) -> None:
        """A context of another kind on these weights (backend/embedding.py): `close` frees it, and runs
        before the weights are freed."""
        self._attached.append(close)

    # --- lifetime

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def close(self) -> None:
        attached, self._attached = getattr(self, "_attached", []), []
        self.mtp, self._followers = None, []
        for close in attached:  # (their contexts use these weights)
            close()
        if getattr(self, "_tree_batch", None) is not None:
            L.llama_batch_free(self._tree_batch)
            self._tree_batch = None
        if getattr(self, "_embd_batch", None) is not None:
            L.llama_batch_free(self._embd_batch)
            self._embd_batch = None
        self.projector = None
        free_context(self._ctx, self._batch)
        self._ctx = self._batch = None
        if self._model:
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()


def free_context(ctx, batch) -> None:
    """A llama.cpp context and its batch, either of which may be missing (a load that failed half-way)."""
    if batch is not None:
        L.llama_batch_free(batch)
    if ctx:
        L.llama_free(ctx)
