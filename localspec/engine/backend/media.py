"""An image's place in a prompt: a prompt with images is a list of ints like any other, text tokens and, for
each image, one negative id per embedding row (no vocabulary has them), counting down from its first row's.
Equal images get equal ids (backend/vision.py keys them by content), so prefix reuse needs nothing more."""

from __future__ import annotations

from typing import Sequence

MEDIA_ROWS = 1 << 14                      # an image's ids' span: it may have one row fewer
MEDIA_KEYS = (1 << 31) // MEDIA_ROWS - 1  # images told apart at once (ids stay within int32)


def media_id(key: int, row: int) -> int:
    """The id of row `row` of image `key` in a prompt."""
    return -1 - (key * MEDIA_ROWS + row)


def media_row(token: int) -> tuple[int, int]:
    """(image key, row) of a media id."""
    return divmod(-1 - token, MEDIA_ROWS)


def media_runs(tokens: Sequence[int]) -> list[tuple[int, list[int]]]:
    """(index of its first token, run) of each run of text tokens and of each image's ids (vision.py):
    an image's ids count down by one from its first row's."""
    runs: list[tuple[int, list[int]]] = []
    for i, token in enumerate(tokens):
        previous = runs[-1][1][-1] if runs else None
        if previous is not None and (previous >= 0 and token >= 0 or previous < 0 and token == previous - 1):
            runs[-1][1].append(token)
        else:
            runs.append((i, [token]))
    return runs
