"""Where a sequence's indices sit once images placed with M-RoPE are in it.

With M-RoPE (Qwen2-VL and kin) an image takes fewer positions than it has rows: its rows are laid out on
a grid of max(width, height) positions. A sequence's positions are then its indices less what the images
before took fewer. `Grids` keeps, per sequence, the images placed that way (first index, rows, positions
taken) and converts between indices and positions; everything else in the engine counts indices.
"""

from __future__ import annotations

Placement = tuple[int, int, int]  # (first index, rows, positions taken)


class Grids:
    def __init__(self, n_seq: int) -> None:
        self._placed: list[list[Placement]] = [[] for _ in range(n_seq)]

    def place(self, seq: int, placement: Placement) -> None:
        """An image evaluated in `seq` whose rows took fewer positions than rows."""
        if placement not in self._placed[seq]:
            self._placed[seq].append(placement)

    def pos(self, seq: int, index: int) -> int:
        """The position of a sequence's index: the index, less what its images before it took fewer (an
        index inside one: that image's first position)."""
        shift = 0
        for first, rows, n_pos in self._placed[seq]:
            if index < first + rows:
                return first - shift if index > first else index - shift
            shift += rows - n_pos
        return index - shift

    def index(self, seq: int, pos: int) -> int:
        """The index a position count stands for (`llama_memory_seq_pos_max` + 1, a checkpoint's): the
        inverse of `pos`; one within an image's positions is after the whole image."""
        shift = 0
        for first, rows, n_pos in self._placed[seq]:
            origin = first - shift
            if pos <= origin:
                break
            if pos <= origin + n_pos:
                return first + rows
            shift += rows - n_pos
        return pos + shift

    def forget(self, seq: int, n_keep: int) -> int:
        """The images placed at or after `n_keep` forgotten; `n_keep` moved back to the start of an image it
        falls inside (its rows are kept or dropped together)."""
        for first, rows, _n_pos in self._placed[seq]:
            if first < n_keep < first + rows:
                n_keep = first
        self._placed[seq] = [p for p in self._placed[seq] if p[0] + p[1] <= n_keep]
        return n_keep

    def copy(self, src: int, dst: int) -> None:
        self._placed[dst] = list(self._placed[src])

    def empty(self, seq: int) -> None:
        self._placed[seq] = []

    def clear(self) -> None:
        self._placed = [[] for _ in self._placed]
