"""The drafting history's store: `SuffixIndex` keeps the text of past requests for one target (bounded,
oldest dropped first) and finds where the current text's ending occurred before, with hashed n-grams
(the idea of suffix decoding, arXiv 2411.04975, without a suffix tree). It persists per model file,
written atomically and merged under a lock when several processes share it; a corrupt or foreign file
is ignored with a warning and rebuilt."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

FORMAT = "localspec-history-1"
MAX_TOKENS = 500_000  # per target file: ~2 MB on disk, ~26 MB in memory (memory_bound)
_P = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier of the n-gram hash (mod 2**64)


def _ngram_hashes(tokens: np.ndarray, n: int) -> np.ndarray:
    """Hash of the n tokens ending at each position i >= n - 1 (entry i - n + 1)."""
    t = tokens.astype(np.uint64) + np.uint64(1)
    h = np.zeros(len(t) - n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = h * _P + t[j:len(t) - n + 1 + j]
    return h


def _hash_of(tokens: Sequence[int]) -> np.uint64:
    """`_ngram_hashes` of one n-gram, in Python's integers (a lookup hashes a few short ones)."""
    h, p = 0, int(_P)
    for t in tokens:
        h = (h * p + int(t) + 1) & 0xFFFF_FFFF_FFFF_FFFF
    return np.uint64(h)


def _equal_to(keys: np.ndarray, values: np.ndarray, key: np.uint64) -> np.ndarray:
    """The values stored under `key` in sorted `keys` (values[i] belongs to keys[i])."""
    lo = int(keys.searchsorted(key, side="left"))
    if lo == len(keys) or keys[lo] != key:  # (most lookups: one search)
        return values[:0]
    return values[lo:int(keys.searchsorted(key, side="right"))]


def context_digest(tokens: Sequence[int]) -> bytes:
    return hashlib.blake2b(np.asarray(tokens, dtype=np.int32).tobytes(), digest_size=16).digest()


class SuffixIndex:
    """Documents (a request's new prompt text and its answer), token ids in one array, looked up by the
    hash of their n-grams at a few lengths (`levels`, longest tried first).

    Recent documents wait in a small sorted tail, re-sorted as each is added; it is merged into the
    large sorted part when it grows past `merge_at`, so adding a request sorts the tail, not the whole
    index, and a lookup (once per round) is a binary search in each part, never a scan."""

    levels = (12, 6, 3)
    merge_at = 32_768
    overlap = 16  # tokens of context kept before a document's new text, so its start can be matched

    def __init__(self, max_tokens: int = MAX_TOKENS):
        self.max_tokens = max_tokens
        self.tokens = np.zeros(0, dtype=np.int32)
        self.starts = np.zeros(0, dtype=np.int64)  # where each document begins in `tokens`
        self._last = np.zeros(0, dtype=np.int32)   # the previous request's whole text
        self._sorted_upto = 0
        self._keys: dict[int, np.ndarray] = {}     # level -> sorted hashes of n-grams before _sorted_upto
        self._ends: dict[int, np.ndarray] = {}     # level -> position of each such n-gram's last token
        self._tail_keys: dict[int, np.ndarray] = {}
        self._tail_ends: dict[int, np.ndarray] = {}
        self._rebuild()

    # ------------------------------------------------------------------ building

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def n_documents(self) -> int:
        return len(self.starts)

    def add(self, text: Sequence[int]) -> int:
        """Index a request's text (prompt then answer); only what the previous request's text does not
        already begin with is stored (a chat's next prompt repeats the conversation so far). Tokens stored."""
        new = full = np.asarray(text, dtype=np.int32)
        last, self._last = self._last, full
        if len(last):
            n = min(len(last), len(new))
            differs = np.flatnonzero(last[:n] != new[:n])
            same = int(differs[0]) if differs.size else n
            new = new[max(same - self.overlap, 0):] if same < len(new) else new[:0]
        if len(new) <= self.levels[-1]:
            return 0
        self.append(new)
        return len(new)

    def append(self, new: np.ndarray) -> None:
        """Index one document as it is (`add` decides what of a request's text that is)."""
        start = self.n_tokens
        self.tokens = np.concatenate([self.tokens, np.asarray(new, dtype=np.int32)])
        self.starts = np.append(self.starts, start)
        if self.n_tokens > self.max_tokens:
            self._evict()
            return
        for n in self.levels:
            if len(new) >= n:
                keys, ends = self._hashes(start, self.n_tokens, n)
                keys = np.concatenate([self._tail_keys[n], keys])
                ends = np.concatenate([self._tail_ends[n], ends])
                order = np.argsort(keys, kind="stable")
                self._tail_keys[n], self._tail_ends[n] = keys[order], ends[order]
        if self.n_tokens - self._sorted_upto > self.merge_at:
            self._rebuild()

    def last_document(self) -> np.ndarray:
        return self.tokens[int(self.starts[-1]):].copy() if self.n_documents else np.zeros(0, dtype=np.int32)

    def _hashes(self, begin: int, end: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Hashes and end positions of the n-grams within tokens[begin:end] (one document)."""
        if end - begin < n:
            return np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
        keys = _ngram_hashes(self.tokens[begin:end], n)
        return keys, np.arange(begin + n - 1, end, dtype=np.int64)

    def _rebuild(self) -> None:
        for n in self.levels:
            parts = [self._hashes(int(b), int(e), n) for b, e in zip(self.starts, [*self.starts[1:], self.n_tokens])]
            keys = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.uint64)
            ends = np.concatenate([p[1] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
            order = np.argsort(keys, kind="stable")
            self._keys[n], self._ends[n] = keys[order], ends[order]
            self._tail_keys[n], self._tail_ends[n] = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.int64)
        self._sorted_upto = self.n_tokens

    def _evict(self) -> None:
        """Drop the oldest documents down to three quarters of the bound (so eviction is rare)."""
        keep = self.max_tokens * 3 // 4
        first = int(np.searchsorted(self.starts, self.n_tokens - keep, side="left"))
        if first >= self.n_documents:  # the latest document alone is larger: keep its end
            self.tokens, self.starts = self.tokens[-keep:].copy(), np.zeros(1, dtype=np.int64)
        else:
            cut = int(self.starts[first])
            self.tokens, self.starts = self.tokens[cut:].copy(), self.starts[first:] - cut
        self._rebuild()

    # ------------------------------------------------------------------ lookup

    def _doc_end(self, positions: np.ndarray) -> np.ndarray:
        docs = np.searchsorted(self.starts, positions, side="right")
        bounds = np.append(self.starts, self.n_tokens)
        return bounds[docs]

    def _doc_start(self, positions: np.ndarray) -> np.ndarray:
        return self.starts[np.searchsorted(self.starts, positions, side="right") - 1]

    def matches(self, context: Sequence[int], most: int = 32) -> tuple[int, np.ndarray]:
        """(n, positions): the longest level whose last-n-tokens of `context` occurred before with
        something after them; the positions of those occurrences' last tokens, latest first."""
        if not self.n_tokens:  # nothing recorded (history off in the bench's single requests): no hashing
            return 0, np.zeros(0, dtype=np.int64)
        for n in self.levels:
            if len(context) < n:
                continue
            tail = list(context[-n:])
            h = _hash_of(tail)
            found = np.concatenate([_equal_to(self._keys[n], self._ends[n], h),
                                    _equal_to(self._tail_keys[n], self._tail_ends[n], h)])
            if not found.size:
                continue
            found = found[found + 1 < self._doc_end(found)]  # something follows within its document
            found = np.sort(found)[::-1][:4 * most]
            same = (self.tokens[found[:, None] + np.arange(1 - n, 1)] == np.asarray(tail, dtype=np.int32)).all(axis=1)
            found = found[same][:most]  # (not a hash's collision)
            if found.size:
                return n, found
        return 0, np.zeros(0, dtype=np.int64)

    def agreeing(self, context: Sequence[int], positions: np.ndarray, most: int = 64) -> np.ndarray:
        """How many tokens before and at each position agree with the context's ending (up to `most`)."""
        ctx = np.asarray(context[-most:], dtype=np.int64)[::-1]
        floor = self._doc_start(positions)
        length = np.zeros(len(positions), dtype=np.int64)
        alive = np.ones(len(positions), dtype=bool)
        for back in range(min(most, len(ctx))):
            at = positions - back
            ok = alive & (at >= floor)
            ok[ok] = self.tokens[at[ok]] == ctx[back]
            length += ok
            alive = ok
            if not alive.any():
                break
        return length

    def propose(self, context: Sequence[int], max_len: int, p_min: float = 0.3) -> tuple[list[int], list[float], int]:
        """(tokens, chance of each given the ones before it, age): what followed the latest and longest
        agreeing occurrences of the context's ending, token by token while the weighted majority of
        the occurrences still going agree on at least `p_min` of their weight."""
        n, positions = self.matches(context)
        if not n or max_len <= 0:
            return [], [], 0
        agree = self.agreeing(context, positions)
        docs = np.searchsorted(self.starts, positions, side="right")
        recency = 0.98 ** (self.n_documents - docs).astype(np.float64)
        weight = agree.astype(np.float64) * recency
        ends = self._doc_end(positions)
        # what follows each occurrence, one column per draft position (-1 past its document's end)
        at = positions[:, None] + 1 + np.arange(min(max_len, int((ends - positions).max()) - 1))
        following = np.where(at < ends[:, None], self.tokens[np.minimum(at, self.n_tokens - 1)], -1)
        tokens: list[int] = []
        chances: list[float] = []
        alive = np.ones(len(positions), dtype=bool)
        i = 0
        while i < following.shape[1]:
            nxt = following[:, i]
            going = alive & (nxt >= 0)
            total = weight[alive].sum()
            if not going.any() or total <= 0:
                break
            if np.array_equal(going, alive):  # every occurrence alive goes on: agreeing columns at once
                rows = following[alive, i:]
                same = (rows == rows[0]).all(axis=0) & (rows[0] >= 0)
                run = len(same) if same.all() else int(np.argmin(same))
                if run:  # (each token the whole weight's: a chance of 1)
                    tokens += rows[0, :run].tolist()
                    chances += [1.0] * run
                    i += run
                    continue
            candidates, inverse = np.unique(nxt[going], return_inverse=True)
            votes = np.bincount(inverse, weights=weight[going])
            best = int(np.argmax(votes))
            chance = float(votes[best] / total)
            if chance < p_min:
                break
            tokens.append(int(candidates[best]))
            chances.append(chance)
            alive = going & (nxt == candidates[best])
            i += 1
        age = int(agree[alive].max()) if tokens and alive.any() else 0
        return tokens, chances, age

    # ------------------------------------------------------------------ storage

    def to_arrays(self, key: str) -> dict[str, np.ndarray]:
        meta = json.dumps({"format": FORMAT, "model": key})
        return {"meta": np.frombuffer(meta.encode(), dtype=np.uint8), "tokens": self.tokens, "starts": self.starts}

    @classmethod
    def from_arrays(cls, arrays, key: str, n_vocab: int, max_tokens: int) -> "SuffixIndex":
        """Raises ValueError for anything but a well-formed index of this model."""
        meta = json.loads(bytes(np.asarray(arrays["meta"], dtype=np.uint8)).decode())
        if meta.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} file")
        if meta.get("model") != key:
            raise ValueError(f"it belongs to another model ({meta.get('model')})")
        tokens, starts = np.asarray(arrays["tokens"]), np.asarray(arrays["starts"])
        if tokens.dtype != np.int32 or starts.dtype != np.int64 or tokens.ndim != 1 or starts.ndim != 1:
            raise ValueError("unexpected array types")
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= n_vocab):
            raise ValueError("token ids outside the model's vocabulary")
        if len(starts) and (starts[0] != 0 or np.any(np.diff(starts) <= 0) or starts[-1] >= len(tokens)):
            raise ValueError("document boundaries out of order")
        index = cls(max_tokens)
        index.tokens, index.starts = tokens.copy(), starts.copy()
        if index.n_tokens > max_tokens:
            index._evict()
        else:
            index._rebuild()
        return index


def describe_file(file: Path) -> tuple[int, int]:
    """(documents, tokens) of a stored index, for `localspec doctor`; ValueError if it is not one."""
    try:
        with np.load(file, allow_pickle=False) as arrays:
            return len(arrays["starts"]), len(arrays["tokens"])
    except Exception as e:  # a damaged archive raises whatever its reader meets first
        raise ValueError(str(e) or type(e).__name__) from None


def memory_bound(max_tokens: int = MAX_TOKENS) -> int:
    """Bytes an index of `max_tokens` holds in memory: the tokens, and a hash and a position per
    token at each n-gram level."""
    return max_tokens * (4 + 16 * len(SuffixIndex.levels))


def model_key(path: Path | None, n_vocab: int) -> str:
    """Which model an index belongs to: the file's name and size and the vocabulary's size."""
    if path is None:
        return f"memory|{n_vocab}"
    return f"{Path(path).name}|{Path(path).stat().st_size}|{n_vocab}"


def load_index(file: Path, key: str, n_vocab: int, max_tokens: int = MAX_TOKENS) -> tuple[SuffixIndex, str | None]:
    """The stored index, or an empty one and why the stored one could not be used."""
    if not file.exists():
        return SuffixIndex(max_tokens), None
    try:
        with np.load(file, allow_pickle=False) as arrays:
            return SuffixIndex.from_arrays(arrays, key, n_vocab, max_tokens), None
    except Exception as e:  # a damaged archive raises whatever its reader meets first (zip, zlib, numpy)
        reason = str(e) or type(e).__name__
        return SuffixIndex(max_tokens), f"Ignored the drafting history in {file} ({reason}); starting a new one."


def file_stamp(file: Path) -> tuple[int, int] | None:
    """What tells one version of a stored index from another: its modification time and size."""
    try:
        st = os.stat(file)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


@contextlib.contextmanager
def file_lock(file: Path) -> Iterator[None]:
    """An exclusive lock beside `file` for the time of a read-merge-write (POSIX; elsewhere none)."""
    try:
        import fcntl
    except ImportError:  # Windows: saves are atomic, but two processes can still lose each other's requests
        yield
        return
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        handle = open(file.with_name(file.name + ".lock"), "a")
    except OSError:
        yield  # a read-only or full folder: the save reports its own error
        return
    with handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def save_index(index: SuffixIndex, file: Path, key: str) -> str | None:
    """Write atomically (a temporary file renamed over the old one), readable by the user only.
    Returns why it could not be written (a full disk, say), or None."""
    tmp = file.with_name(file.name + ".tmp")
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            np.savez(f, **index.to_arrays(key))  # type: ignore[arg-type]
        os.replace(tmp, file)
        return None
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        return f"Could not save the drafting history to {file}: {e.strerror or e}."
