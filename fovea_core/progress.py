"""One progress bar for the commands and the adaptation: :func:`progress_bar`."""

from __future__ import annotations

import sys
from collections.abc import Callable

__all__ = ["progress_bar"]


def progress_bar(total: int, desc: str = "pages"
                 ) -> tuple[Callable[..., None], Callable[[str], None], Callable[[], None]]:
    """``(update, write, close)`` for ``total`` pages: a tqdm bar on stderr (hidden when
    stderr is not a terminal) or, without tqdm, a plain ``[k/total]`` counter; ``write``
    prints a line on stderr above the bar."""
    try:
        from tqdm.auto import tqdm
    except ImportError:                                            # pragma: no cover
        tqdm = None
    if tqdm is not None:
        bar = tqdm(total=total, desc=desc, unit="page", disable=None, file=sys.stderr)
        return bar.update, lambda s: bar.write(s, file=sys.stderr), bar.close
    state = {"k": 0}

    def update(n: int = 1) -> None:
        state["k"] += n
        print(f"[{state['k']}/{total}]", file=sys.stderr, flush=True)
    return update, lambda s: print(s, file=sys.stderr), lambda: None
