"""Drawing a token set over its page (matplotlib): the figure that ``foveate`` saves.

:func:`overlay_tokens` draws each token's footprint coloured by level; the book's own
figures (:mod:`fovea_book.plotting`) build on these. Functions draw onto axes you pass in and
never call ``plt.show``; they work with any backend, including Agg.
"""

from __future__ import annotations

import matplotlib as mpl
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from fovea_core.pyramid import Pyramid, as_image_batch
from fovea_core.tokens import TokenSet

LEVEL_CMAP = "viridis"


def _pick(x: torch.Tensor, index: int, name: str) -> torch.Tensor:
    if not -x.shape[0] <= index < x.shape[0]:
        raise ValueError(f"index must be in [0, {x.shape[0]}) for a batch of {x.shape[0]} "
                         f"{name}, got {index}")
    return x[index]


def to_display(image: np.ndarray | torch.Tensor | Pyramid, index: int = 0) -> np.ndarray:
    """One image of a batch as an ``[H, W, 3]`` (or ``[H, W]`` grey) float array in ``[0, 1]``."""
    x = image.base if isinstance(image, Pyramid) else as_image_batch(image)
    img = _pick(x, index, "images").clamp(0, 1).permute(1, 2, 0).cpu().numpy()
    return img[..., 0] if img.shape[-1] == 1 else img


def _show_image(ax: Axes, img: np.ndarray) -> None:
    ax.imshow(img, cmap="gray" if img.ndim == 2 else None, vmin=0, vmax=1,
              interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])


def box_vertices(boxes: np.ndarray) -> np.ndarray:
    """Corners ``[N, 4, 2]`` of boxes ``[N, 4]`` = (x0, y0, x1, y1), counter-clockwise."""
    x0, y0, x1, y1 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    return np.stack([np.stack([x0, y0], -1), np.stack([x1, y0], -1),
                     np.stack([x1, y1], -1), np.stack([x0, y1], -1)], axis=1)


def overlay_tokens(ax: Axes, image: np.ndarray | torch.Tensor | Pyramid, tokens: TokenSet,
                   index: int = 0, color_by: str = "level", show_centers: bool = True,
                   show_image: bool = True, linewidth: float = 0.8) -> list:
    """Draw the footprints (``TokenSet.boxes()``) of image ``index``'s tokens over the image.

    ``color_by="level"``: one :class:`~matplotlib.collections.PolyCollection` per mip level
    present (loop over levels, not tokens) with a legend entry "level l (side px)".
    ``color_by="score"``: one collection coloured by token score with a colorbar.
    With ``show_centers`` the centres are one scatter (one artist). The fixation(s) are
    marked with a red cross.

    Returns:
        The collections added, one per level (or one for scores); together they hold
        exactly ``N`` rectangles.
    """
    if color_by not in ("level", "score"):
        raise ValueError(f"color_by must be 'level' or 'score', got {color_by!r}")
    if not isinstance(tokens, TokenSet):
        raise ValueError(f"tokens must be a TokenSet, got {type(tokens).__name__}")
    img = to_display(image, index)
    if img.shape[:2] != tuple(tokens.image_size):
        raise ValueError(f"image is {img.shape[:2]} but tokens.image_size is {tokens.image_size}")
    if show_image:
        _show_image(ax, img)
    boxes = _pick(tokens.boxes(), index, "token sets").cpu().numpy()            # [N, 4]
    levels = _pick(tokens.levels, index, "token sets").cpu().numpy()            # [N]
    verts = box_vertices(boxes)                                                 # [N, 4, 2]
    added = []
    if color_by == "level":
        cmap = mpl.colormaps[LEVEL_CMAP]
        top = max(float(levels.max()), 1.0)
        handles = []
        for lv in np.unique(levels):                                  # few distinct levels
            sel = levels == lv
            color = cmap(0.9 * float(lv) / top)
            coll = PolyCollection(verts[sel], facecolors="none", edgecolors=[color],
                                   linewidth=linewidth, label=f"level {lv:.3g}")
            ax.add_collection(coll)
            added.append(coll)
            side = tokens.patch * 2.0**float(lv)
            handles.append(Patch(facecolor="none", edgecolor=color,
                                 label=f"level {lv:.3g} ({side:.0f}px): {int(sel.sum())}"))
        ax.legend(handles=handles, loc="upper right", fontsize="small", framealpha=0.8)
    else:
        scores = _pick(tokens.scores, index, "token sets").cpu().numpy()
        coll = PolyCollection(verts, facecolors="none", cmap="magma", linewidth=linewidth)
        coll.set_array(scores)
        coll.set_edgecolor(coll.to_rgba(scores))
        ax.add_collection(coll)
        added.append(coll)
        ax.figure.colorbar(coll, ax=ax, fraction=0.046, pad=0.02, label="token score")
    if show_centers:
        c = _pick(tokens.centers_px(), index, "token sets").cpu().numpy()
        ax.scatter(c[:, 0], c[:, 1], s=3, c="white", edgecolors="black", linewidths=0.3,
                   zorder=3)
    fix = _pick(tokens.fixations, index, "token sets").cpu().numpy() * np.array(
        [tokens.image_size[1], tokens.image_size[0]])
    ax.add_line(Line2D(fix[:, 0], fix[:, 1], marker="x", color="red", markersize=8,
                       markeredgewidth=2, linestyle="none", zorder=4))
    h, w = tokens.image_size
    ax.set_xlim(0, w)
    ax.set_ylim(h, 0)
    ax.set_title(f"{tokens.budget} tokens")
    return added
