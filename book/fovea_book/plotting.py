"""Figures used by the notebooks: token overlays, score heatmaps, foveated reconstructions.

All functions draw with matplotlib onto axes you pass in (or a figure they return) and
never call ``plt.show``; they work with any backend, including Agg.
"""

from __future__ import annotations

import matplotlib as mpl
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure

from fovea_core.pyramid import Pyramid
from fovea_core.draw import (LEVEL_CMAP, _pick, _show_image, box_vertices,  # noqa: F401
                             overlay_tokens, to_display)
from fovea_core.tokens import TokenSet


def level_colors(num_levels: int, cmap: str = LEVEL_CMAP) -> np.ndarray:
    """``[num_levels, 4]`` RGBA colours, one per mip level (level 0 first)."""
    return mpl.colormaps[cmap](np.linspace(0.0, 0.9, max(num_levels, 1)))


def show_reconstruction(ax: Axes, recon: torch.Tensor | np.ndarray, index: int = 0,
                        title: str = "foveated reconstruction"):
    """Show a reconstruction from :func:`fovea_core.sample.render` (``[B, C, H, W]``)."""
    img = to_display(recon, index)
    _show_image(ax, img)
    ax.set_title(title)
    return ax.images[-1]


def show_scores(ax: Axes, scores: torch.Tensor, image: np.ndarray | torch.Tensor | Pyramid |
                None = None, index: int = 0, alpha: float = 0.6, cmap: str = "inferno",
                colorbar: bool = True, title: str = "importance"):
    """Heatmap of a score map ``[B, Gh, Gw]`` (or ``[Gh, Gw]``), over the image if given.

    With an image, the grid is stretched over the base pixels (each cell covers
    ``patch x patch`` px; the right/bottom partial cells are drawn to the image edge).
    """
    s = torch.as_tensor(scores)
    if s.ndim == 2:
        s = s[None]
    if s.ndim != 3:
        raise ValueError(f"scores must be [B, Gh, Gw] or [Gh, Gw], got {tuple(s.shape)}")
    grid = _pick(s, index, "score maps").float().cpu().numpy()
    extent = None
    if image is not None:
        img = to_display(image, index)
        _show_image(ax, img)
        extent = (0, img.shape[1], img.shape[0], 0)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    im = ax.imshow(grid, cmap=cmap, alpha=alpha if image is not None else 1.0, extent=extent,
                   interpolation="nearest")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, fraction=0.046, pad=0.02)
    ax.set_title(title)
    return im


def token_panel(image: np.ndarray | torch.Tensor | Pyramid, tokens: TokenSet,
                recon: torch.Tensor | None = None, scores: torch.Tensor | None = None,
                index: int = 0, width: float = 4.0) -> Figure:
    """Side-by-side figure: image + token overlay, score map (if given), reconstruction (if given)."""
    n = 1 + (scores is not None) + (recon is not None)
    h, w = tokens.image_size
    fig, axes = plt.subplots(1, n, figsize=(width * n, width * h / w + 0.6), squeeze=False,
                             layout="constrained")
    axes = axes[0]
    overlay_tokens(axes[0], image, tokens, index=index)
    k = 1
    if scores is not None:
        show_scores(axes[k], scores, image, index=index)
        k += 1
    if recon is not None:
        show_reconstruction(axes[k], recon, index=index)
    return fig


def token_sets_figure(image: np.ndarray | torch.Tensor | Pyramid, panels: dict[str, TokenSet],
                      box: tuple[float, float, float, float] | None = None,
                      width: float = 5.5) -> Figure:
    """One panel per ``{title: TokenSet}``, the tokens over ``image`` coloured by level
    (:func:`overlay_tokens`), with ``box`` (x0, y0, x1, y1 base pixels; e.g. an answer)
    outlined in green on each."""
    if not panels:
        raise ValueError("token_sets_figure: panels is empty")
    first = next(iter(panels.values()))
    h, w = first.image_size
    fig, axes = plt.subplots(1, len(panels), figsize=(width * len(panels), width * h / w + 0.8),
                             squeeze=False, layout="constrained")
    for ax, (title, tokens) in zip(axes[0], panels.items()):
        overlay_tokens(ax, image, tokens, show_centers=False, linewidth=0.5)
        ax.set_title(title)
        if box is not None:
            _answer_box(ax, box)
        ax.set_axis_off()
    return fig


#: edge colour of each cascade stage's tokens in :func:`cascade_stages_figure`
STAGE_COLORS = {0: "tab:blue", 1: "tab:red"}


def _answer_box(ax: Axes, box: tuple[float, float, float, float], pad: float = 4.0) -> None:
    """Outline ``box`` (x0, y0, x1, y1 base pixels) in green, ``pad`` px outside it."""
    x0, y0, x1, y1 = box
    ax.add_patch(plt.Rectangle((x0 - pad, y0 - pad), x1 - x0 + 2 * pad, y1 - y0 + 2 * pad,
                               fill=False, ec="lime", lw=1.2))


def cascade_stages_figure(pyramid: Pyramid, parts, *,
                          box: tuple[float, float, float, float] | None = None,
                          width: float = 12.0) -> Figure:
    """The budgeted cascade's stages on one page, four panels in a row.

    (a) the gist image (all the cascade knows about the page's pixels), (b) the localiser's
    map ``parts.scores`` over the page, (c) the tokens by stage (gist blue, fovea red; one
    :class:`~matplotlib.collections.PolyCollection` per stage) and (d) the reconstruction
    the reader reads (:func:`fovea_core.sample.render` of the tokens sampled from
    ``pyramid``). ``box`` (e.g. the answer's union box) is outlined in green on (b)-(d).

    Args:
        pyramid: the page's pyramid (batch of one), the one ``parts`` was computed on.
        parts: :class:`~fovea_core.cascade.allocator.CascadeParts` of one cascade call.
        box: ``(x0, y0, x1, y1)`` in base pixels, or None.
        width: the figure's width in inches (the height follows the page's aspect).
    """
    tok, g = parts.tokens, parts.gist
    page, recon = _page_and_reading(pyramid, tok)
    h, w = page.shape[:2]
    fig, axes = plt.subplots(1, 4, figsize=(width, width * h / w / 4 + 0.8),
                             layout="constrained")
    axes[0].imshow(g.image[0].clamp(0, 1).permute(1, 2, 0).cpu().numpy(),
                   interpolation="nearest")
    axes[0].set_title(f"(a) gist: {g.budget} tokens")
    axes[1].imshow(page, alpha=0.45)
    axes[1].imshow(parts.scores[0].float().cpu().numpy(), extent=(0, w, h, 0), cmap="magma",
                   alpha=0.6)
    axes[1].set_title("(b) where the answer is")
    axes[2].imshow(page, alpha=0.6)
    stage = _outline_stages(axes[2], tok, STAGE_COLORS)
    axes[2].set_title(f"(c) gist (blue) + fovea (red): {g.budget} + {int((stage == 1).sum())}")
    axes[3].imshow(recon)
    axes[3].set_title("(d) what the reader reads")
    _finish(axes, box)
    return fig


def _page_and_reading(pyramid: Pyramid, tok: TokenSet) -> tuple[np.ndarray, np.ndarray]:
    """``(page, reading)``: the page as displayed and what the reader reads from ``tok``
    (:func:`fovea_core.sample.render` of its tokens over the page's coarse level), both
    ``[H, W, C]`` arrays; ``tok`` must cover ``pyramid``'s page."""
    from fovea_core.sample import render, sample

    if tuple(tok.image_size) != tuple(pyramid.base.shape[-2:]):
        raise ValueError(f"parts.tokens cover a {tuple(tok.image_size)} page but pyramid is "
                         f"{tuple(pyramid.base.shape[-2:])}: pass the pyramid the cascade ran on")
    recon = render(tok, sample(pyramid, tok), background=pyramid)[0]             # [C, H, W]
    return to_display(pyramid), recon.clamp(0, 1).permute(1, 2, 0).cpu().numpy()


def _outline_stages(ax: Axes, tok: TokenSet, colours: dict[int, str]) -> np.ndarray:
    """Outline image 0's token footprints on ``ax``, one
    :class:`~matplotlib.collections.PolyCollection` per stage of ``colours`` (``{stage:
    colour}``, in its order); returns the stages ``[N]``."""
    verts = box_vertices(tok.boxes()[0].cpu().numpy())                          # [N, 4, 2]
    stage = tok.stage[0].cpu().numpy()
    for s, c in colours.items():
        ax.add_collection(PolyCollection(verts[stage == s], facecolors="none", edgecolors=c,
                                         linewidth=0.5))
    return stage


def _finish(axes, box: tuple[float, float, float, float] | None) -> None:
    """No axes on any panel; the answer's ``box`` (if any) outlined on all but the first."""
    for ax in axes:
        ax.set_axis_off()
    if box is not None:
        for ax in axes[1:]:
            _answer_box(ax, box)


def two_fixations_figure(pyramid: Pyramid, parts, *,
                         box: tuple[float, float, float, float] | None = None,
                         width: float = 12.0) -> Figure:
    """The read-then-look cascade on one page, three panels in a row.

    (a) fixation 1's view (:func:`~fovea_core.cascade.reading.first_view`: what the gist and
    the first fovea show, all the reader read) with the lines it read (grey boxes) and the
    ones that matched the question (orange, with what they matched); (b) the tokens by stage
    over the page (gist blue, first fovea red, second fixation orange) over the map the
    matches made (:attr:`~fovea_core.cascade.reading.ReadingParts.read_maps`, orange shade:
    where the answer lies relative to what was read); (c) what the reader reads in the end
    (all N tokens).
    ``box`` (the answer's union box) is outlined in green on (b) and (c).

    Args:
        pyramid: the page's pyramid (batch of one), the one ``parts`` was computed on.
        parts: :class:`~fovea_core.cascade.reading.ReadingParts` of one call.
        box: ``(x0, y0, x1, y1)`` in base pixels, or None.
        width: the figure's width in inches.
    """
    from fovea_core.cascade.reading import STAGE_SECOND, first_view

    tok, rd = parts.tokens, parts.readings[0]
    page, recon = _page_and_reading(pyramid, tok)
    h, w = page.shape[:2]
    view1 = first_view(pyramid, parts.first.tokens)[0].permute(1, 2, 0).cpu().numpy()
    fig, axes = plt.subplots(1, 3, figsize=(width, width * h / w / 3 + 0.9),
                             layout="constrained")
    axes[0].imshow(view1)
    for x0, y0, x1, y1 in np.asarray(rd.lines.boxes).reshape(-1, 4):
        axes[0].add_patch(plt.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, ec="0.5",
                                        lw=0.6))
    for m in rd.matches:
        x0, y0, x1, y1 = m.span
        axes[0].add_patch(plt.Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, ec="orange",
                                        lw=1.5))
        axes[0].annotate(m.cue, (x0, y0), color="orange", fontsize=7, va="bottom")
    axes[0].set_title(f"(a) fixation 1:\n{len(rd.lines.texts)} lines read, "
                      f"{len(rd.matches)} matched")
    axes[1].imshow(page, alpha=0.6)
    rmap = parts.read_maps[0].cpu().numpy()
    if rmap.max() > 0:
        gh, gw = rmap.shape
        axes[1].imshow(np.ma.masked_equal(rmap / rmap.max(), 0.0), cmap="Oranges", alpha=0.5,
                       vmin=0.0, vmax=1.0, extent=(0, gw * tok.patch, gh * tok.patch, 0),
                       interpolation="nearest")
        axes[1].set(xlim=(0, w), ylim=(h, 0))
    stage = _outline_stages(axes[1], tok, {**STAGE_COLORS, STAGE_SECOND: "orange"})
    path = "where the reading pointed" if rd.path == "read" else f"the map ({rd.reason})"
    axes[1].set_title(f"(b) fixation 2 ({int((stage == STAGE_SECOND).sum())} tokens): {path}")
    axes[2].imshow(recon)
    axes[2].set_title(f"(c) what the reader reads:\n{tok.centers.shape[1]} tokens in all")
    _finish(axes, box)
    return fig


def answer_geometry_figure(geometry, *, key_width: float = 4.0, width: float = 7.0) -> Figure:
    """Where the read-then-look cascade looks for an answer relative to a key it read
    (:class:`~fovea_core.cascade.reading.AnswerGeometry`), in the key's line heights.

    The key is drawn as a black box ``key_width`` line heights wide at the origin (one line
    high, y downwards as on a page); each rect is shaded by its weight (rects measured from
    the key's right end are shifted by ``key_width``); rects reaching to the page's edge are
    cut at the axes' limits.
    """
    from matplotlib.colors import Normalize

    rects = geometry.rects
    fig, ax = plt.subplots(figsize=(width, width * 0.45), layout="constrained")
    cmap, norm = plt.get_cmap("Oranges"), Normalize(0.0, max(r.weight for r in rects))
    lim = [0.0, 0.0, 0.0, 0.0]
    for r in sorted(rects, key=lambda r: r.weight):
        dx = key_width if r.anchor == "right" else 0.0
        x0, x1 = r.x0 + dx, (min(r.x1, 60.0) + dx)
        ax.add_patch(plt.Rectangle((x0, r.y0), x1 - x0, r.y1 - r.y0, color=cmap(norm(r.weight)),
                                   lw=0))
        lim = [min(lim[0], x0), max(lim[1], x1), min(lim[2], r.y0), max(lim[3], r.y1)]
    ax.add_patch(plt.Rectangle((0, 0), key_width, 1, fill=False, ec="black", lw=1.5))
    ax.annotate("key", (key_width / 2, 0.5), ha="center", va="center", fontsize=8)
    ax.set(xlim=(lim[0] - 1, lim[1] + 1), ylim=(lim[3] + 0.5, lim[2] - 0.5),
           xlabel="x (line heights from the key's left end)",
           ylabel="y (line heights from\nthe top of the key's line)", aspect="equal")
    fig.colorbar(plt.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax, shrink=0.8,
                 label="weight (answers per unit area,\nof the largest)")
    return fig


def gist_split_figure(summary, budget: int = 273) -> Figure:
    """Kept against the gist's budget G, per dataset: one line with its 95 % band per
    localiser (``learned`` solid, ``oracle`` dashed) and ``resize`` as a grey level.

    Args:
        summary: rows of :func:`fovea_book.eval.cascade.gist_split_summary`
            (``dataset, allocator, localiser, G, kept, kept_lo, kept_hi``), with a
            ``resize`` row per dataset.
        budget: the N every method had (the axis labels).
    """
    sets = summary.dataset.nunique()
    fig, axes = plt.subplots(1, sets, figsize=(5 * sets, 3.6), layout="constrained",
                             squeeze=False)
    for ax, (ds, g) in zip(axes[0], summary.groupby("dataset")):
        for loc, style in (("learned", "-o"), ("oracle", "--s")):
            c = g[g.localiser == loc].sort_values("G")
            ax.plot(c.G, c.kept, style, ms=4, label=f"cascade, {loc}")
            ax.fill_between(c.G, c.kept_lo, c.kept_hi, alpha=0.15)
        rz = g[g.allocator == "resize"].iloc[0]
        ax.axhline(rz.kept, color="0.4", lw=1, label=f"resize (all {budget} on the page)")
        ax.axhline(1, color="k", lw=0.8, ls="--")
        ax.set(xlabel=f"gist tokens G (of N = {budget})", ylabel="kept", title=ds,
               ylim=(0, 1.05))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return fig


def resize_curve_figure(view, ceilings: dict[str, float], *, budget: int = 273) -> Figure:
    """The resize curve and the methods at their budget, per dataset: kept (mean ANLS over
    the full page's, ``ceilings[dataset]``) against visual tokens (top row, log axis) and
    against the prefill FLOPs of a 2B-class VLM plus side compute (bottom row).

    Args:
        view: :func:`fovea_book.eval.curve.compute_view` rows (``dataset, method, budget,
            kept, flops``); the method ``"resize"`` is drawn as the curve, every other
            method as a marker.
        ceilings: the full page's mean ANLS per dataset.
        budget: the methods' N (a dotted line).
    """
    sets = [d for d in dict.fromkeys(view.dataset) if d in ceilings]
    fig, axes = plt.subplots(2, len(sets), figsize=(4.2 * len(sets), 6.4), squeeze=False,
                             layout="constrained")
    others = [m for m in dict.fromkeys(view.method) if m != "resize"]
    marks = dict(zip(others, "osD^v<>"))
    for j, ds in enumerate(sets):
        v = view[view.dataset == ds]
        c = max(ceilings[ds], 1e-12)
        cur = v[v.method == "resize"].sort_values("budget")
        for ax, x in ((axes[0, j], "budget"), (axes[1, j], "flops")):
            ax.plot(cur[x], 100 * cur.kept / c, "-o", color="0.35", ms=3, label="resize")
            for m in others:
                p = v[v.method == m]
                ax.plot(p[x], 100 * p.kept / c, marks[m], ms=7, label=m, ls="none")
            ax.set_xscale("log")
            ax.axhline(100, color="0.7", lw=0.8, ls="--")
            ax.set_ylabel("kept (% of the full page)")
            ax.grid(alpha=0.3)
        axes[0, j].axvline(budget, color="0.6", lw=0.8, ls=":")
        axes[0, j].set_title(ds, fontsize=10)
        axes[0, j].set_xlabel("visual tokens N")
        axes[1, j].set_xlabel("prefill FLOPs (2B-class VLM) + side compute")
    axes[0, -1].legend(fontsize=7, loc="lower right")
    return fig


#: markers of the methods at N in :func:`kept_against_tokens_figure`, in the order given
POINT_MARKERS = "osD^v<>P"


def kept_against_tokens_figure(curve, points, ceilings, *, budget: int = 273,
                               titles: dict[str, str] | None = None, ncols: int = 2,
                               spread: float = 1.035) -> Figure:
    """Kept against visual tokens, one panel per collection: the ``resize`` curve (a line
    with its 95 % CI band), each method at its budget N (a marker with its CI; markers
    spread by ``spread``-fold steps around N on the log axis so their bars do not cover
    each other), the ceiling (a dashed line: the cascade told the answer's box) and, where
    the curve reaches the ceiling at ``N*``, an arrow from N to ``N*`` labelled with the
    token-saving factor ``N* / N``, read off the picture.

    Args:
        curve: :func:`fovea_book.eval.curve.curve_kept` rows ``dataset, budget, kept, lo, hi,
            n_docs`` (shares of the full page's reading, 0..1); its datasets are the panels.
        points: rows ``dataset, method, kept, lo, hi`` (e.g.
            :func:`fovea_book.eval.realsets.kept_table`), each drawn at ``budget``; one
            marker per method (the legend names it; at most ``len(POINT_MARKERS)``).
        ceilings: rows ``dataset, kept, n_star, censored, text``: the ceiling's kept share,
            the budget ``N*`` at which ``resize`` reads as well (NaN where censored),
            ``censored`` (``None``, ``"above"``: the curve never reaches it, ``"below"``:
            ``resize`` already does at the curve's first budget) and the factor's text
            (:func:`fovea_book.eval.curve.saving_table`'s ``text``). A dataset without a
            row gets no ceiling.
        budget: the methods' N.
        titles: panel titles by dataset, in the order the panels are drawn (the datasets it
            does not name follow in the curve's order, titled by their name).
        ncols: panels per row.
        spread: the step between neighbouring markers at N (a factor > 1 on the token axis).

    Returns:
        The figure: ``ceil(D / ncols) x ncols`` axes (``D`` datasets; unused ones hidden),
        one legend below them.
    """
    present = list(dict.fromkeys(curve.dataset))
    sets = [d for d in (titles or {}) if d in present] + [d for d in present
                                                          if d not in (titles or {})]
    if not sets:
        raise ValueError("curve has no rows: nothing to draw")
    methods = list(dict.fromkeys(points.method))
    if len(methods) > len(POINT_MARKERS):
        raise ValueError(f"points has {len(methods)} methods; at most {len(POINT_MARKERS)} "
                         "can be told apart")
    if not spread >= 1:
        raise ValueError(f"spread must be a factor >= 1, got {spread}")
    ncols = max(1, min(int(ncols), len(sets)))
    nrows = -(-len(sets) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.5 * nrows + 0.6),
                             squeeze=False, layout="constrained")
    ceil = ceilings.set_index("dataset") if len(ceilings) else None
    offsets = {m: spread ** (i - (len(methods) - 1) / 2) for i, m in enumerate(methods)}
    handles: dict[str, object] = {}
    box = dict(fc="white", ec="none", alpha=0.85, pad=1.5)
    for ax, ds in zip(axes.flat, sets):
        c = curve[curve.dataset == ds].sort_values("budget")
        ax.set_xscale("log")
        ax.set_xlim(budget / spread ** len(methods) / 1.05, float(c.budget.max()) * 1.3)
        ax.fill_between(c.budget, 100 * c.lo, 100 * c.hi, color="0.3", alpha=0.18, lw=0)
        handles["resize (95 % CI)"], = ax.plot(c.budget, 100 * c.kept, "-o", color="0.25", ms=3)
        top = max(100.0, *(100 * c.hi))
        for m, p in points[points.dataset == ds].groupby("method", sort=False):
            k, lo, hi = (100 * float(p[v].iloc[0]) for v in ("kept", "lo", "hi"))
            handles[m] = ax.errorbar(budget * offsets[m], k, yerr=[[k - lo], [hi - k]],
                                     fmt=POINT_MARKERS[methods.index(m)], ms=7, capsize=3,
                                     color=f"C{methods.index(m)}")
            top = max(top, hi)
        handles["full page"] = ax.axhline(100, color="0.6", lw=0.8)
        if ceil is not None and ds in ceil.index:
            r = ceil.loc[ds]
            y = 100 * float(r.kept)
            handles["answer's box given (oracle cascade)"] = ax.axhline(
                y, color="C3", ls="--", lw=1.2)
            cens = r.censored if isinstance(r.censored, str) else None
            end = {"above": float(c.budget.max()) * 1.15, "below": None}.get(
                cens, float(r.n_star))
            if end is not None and np.isfinite(end):
                ax.annotate("", xy=(end, y), xytext=(budget, y),
                            arrowprops=dict(arrowstyle="->", color="C3", lw=1.5))
                if cens is None:
                    ax.vlines(end, 0, y, color="C3", ls=":", lw=1)
                    words = f"resize reaches it at N* = {end:.0f}\nN* / N = {r.text}"
                else:
                    words = f"resize never reaches it\nN* / N {r.text}"
                lo_x, hi_x = ax.get_xlim()          # the words on the side with room
                left = cens is not None or np.log(end / lo_x) > 0.6 * np.log(hi_x / lo_x)
                ax.text(end, y - 4, words, color="C3", fontsize=8, va="top",
                        ha="right" if left else "left", bbox=box)
            else:
                ax.text(budget, y - 4, f"resize reads as well at N (N* / N {r.text})",
                        color="C3", fontsize=8, va="top", bbox=box)
        n = int(c.n_docs.max()) if "n_docs" in c and len(c) else 0
        ax.set_title(f"{(titles or {}).get(ds, ds)} (n = {n})", fontsize=10)
        ticks = sorted({int(b) for b in c.budget} | {int(budget)})
        ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=8)
        ax.minorticks_off()
        ax.set_ylim(0, top + 5)
        ax.set(xlabel="visual tokens N", ylabel="kept (% of the full page)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(sets):]:
        ax.set_visible(False)
    fig.legend(list(handles.values()), list(handles), loc="outside lower center",
               ncol=min(3, len(handles)), fontsize=8, frameon=False)
    return fig


def shift_search_figure(checks) -> Figure:
    """Chapter 03's shift figure: per transform of ``checks`` (a
    :class:`fovea_book.eval.logpolar_checks.ShiftChecks`; rows: zoom, rotation) the
    transformed image, its log-polar image, and the mismatch with the original log-polar
    image against the shift, with the predicted shift dashed."""
    fig, axes = plt.subplots(2, 3, figsize=(11, 6), gridspec_kw={"width_ratios": [1, 0.7, 1.1]})
    for r, c in enumerate((checks.zoom, checks.rotation)):
        axes[r, 0].imshow(np.clip(c.moved, 0, 1))
        axes[r, 0].set_title(f"{c.name} about the fixation", fontsize=9)
        axes[r, 0].axis("off")
        axes[r, 1].imshow(np.clip(c.logpolar, 0, 1), aspect="auto")
        axes[r, 1].set(title=f"log-polar of the {c.name}", xlabel="log radius", ylabel="angle")
        axes[r, 2].plot(c.shifts, c.mismatch, ".-", ms=3)
        axes[r, 2].axvline(c.expected, color="C3", ls="--",
                           label=f"predicted shift {c.expected:.2f}")
        axes[r, 2].set(xlabel=("column" if c.name == "zoom" else "row") + " shift",
                       ylabel="mean |difference|")
        axes[r, 2].legend(fontsize=8)
    fig.tight_layout()
    return fig


def cumulative_rgc_figure(radii_deg: np.ndarray, cells: np.ndarray, *, fibres_mean: float,
                          fibres_sd: float) -> Figure:
    """Chapter 01's cumulative ganglion-cell count inside a disc of growing radius
    (``cells`` per ``radii_deg``), against the optic-nerve fibre count's mean +- SD band."""
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    ax.plot(radii_deg, np.asarray(cells) / 1e6, "k-o", ms=3, label="Watson eq. 4, integrated")
    ax.axhspan((fibres_mean - fibres_sd) / 1e6, (fibres_mean + fibres_sd) / 1e6, color="C0",
               alpha=0.2, label="optic-nerve fibres, mean ± SD (Jonas 1990)")
    ax.set(xlabel="disc radius (deg)", ylabel="ganglion cells (millions)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def timing_bars(median_ms, labels, colors, *, target_ms: float, target_label: str) -> Figure:
    """Horizontal bars of median timings (ms, log axis; ``labels`` top to bottom, one colour
    each) with a dashed line at ``target_ms``. With no timings (``median_ms`` None) the
    figure is left empty (a chapter without a record still glues its figure)."""
    fig, ax = plt.subplots(figsize=(9, 3.6))
    if median_ms is not None:
        if len(median_ms) != len(labels) or len(colors) != len(labels):
            raise ValueError(f"median_ms ({len(median_ms)}), labels ({len(labels)}) and colors "
                             f"({len(colors)}) must have the same length")
        ax.barh(labels, median_ms, color=colors)
        ax.axvline(target_ms, color="k", ls="--", lw=1, label=target_label)
        ax.set_xscale("log")
        ax.set_xlabel("milliseconds (median of interleaved rounds)")
        ax.invert_yaxis()
        ax.legend()
    fig.tight_layout()
    return fig


#: line styles of :func:`page_cost_figure`'s reference series
_PAGE_REFS = {"stock": ("k", "-", "o", "stock Qwen2VLImageProcessorPil"),
              "decode": ("0.55", ":", "", "decode (PIL, full size)"),
              "draft": ("0.55", "-.", "", "JPEG draft decode")}


def page_cost_figure(rows, *, fmt: str = "jpeg", width: float = 11.0) -> Figure:
    """Time against megapixels (log-log), one panel per page kind, for the files of format
    ``fmt``: one line per method from the file to its N tokens (solid, coloured) and to the
    model's inputs through the processor (dashed, same colour), the stock processor (black)
    and the decode references (grey). ``rows``: :func:`fovea_book.bench.pages.curve_rows` of
    a ``pages`` record (dicts with ``kind``, ``format``, ``mp``, ``series``, ``path``,
    ``method``, ``median_ms``). With no rows the figure says that nothing was measured (a
    chapter without a record still glues its figure)."""
    rows = [r for r in rows if r["format"] == fmt]
    kinds = list(dict.fromkeys(r["kind"] for r in rows)) or ["(none)"]
    fig, axes = plt.subplots(1, len(kinds), figsize=(width, 4.0), squeeze=False,
                             sharey=True)
    if not rows:
        ax = axes[0, 0]
        ax.text(0.5, 0.5, "no page-size benchmark record", ha="center", va="center",
                transform=ax.transAxes)
        ax.set(xticks=[], yticks=[])
        fig.tight_layout()
        return fig
    methods = list(dict.fromkeys(r["method"] for r in rows if r["method"]))
    colours = {m: f"C{i}" for i, m in enumerate(methods)}
    for ax, kind in zip(axes[0], kinds):
        mine = [r for r in rows if r["kind"] == kind]
        for series in dict.fromkeys(r["series"] for r in mine):
            pts = sorted((r["mp"], r["median_ms"] / 1e3, r) for r in mine if r["series"] == series)
            mp, s = [p[0] for p in pts], [p[1] for p in pts]
            r0 = pts[0][2]
            if r0["method"]:
                tokens = r0["path"] == "tokens"
                ax.plot(mp, s, "o-" if tokens else "s--", color=colours[r0["method"]], ms=4,
                        label=f"{r0['method']}: " + ("file to tokens" if tokens
                                                     else "file to model inputs"))
            else:
                c, ls, mk, label = _PAGE_REFS.get(series, ("0.3", "-", "", series))
                ax.plot(mp, s, color=c, ls=ls, marker=mk or None, ms=4, label=label)
        ax.set(xscale="log", yscale="log", xlabel="page size (megapixels)",
               title=f"{kind}s ({fmt.upper()})")
    axes[0, 0].set_ylabel("seconds (median of rounds, one core)")
    axes[0, -1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.tight_layout()
    return fig
