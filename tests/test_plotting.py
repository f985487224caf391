"""fovea_book.plotting: overlays, heatmaps and panels draw what they claim (Agg backend)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402

from fovea_core import TokenSet  # noqa: E402
from fovea_book.plotting import (box_vertices, level_colors, overlay_tokens,  # noqa: E402
                                 show_reconstruction, show_scores, token_panel,
                                 token_sets_figure)

H, W, P = 96, 128, 16


def tokens(b=2):
    """Per image: 6 level-0, 3 level-1 and 1 level-2 tokens (N = 10)."""
    rows = torch.tensor([0, 0, 1, 1, 2, 5, 0, 1, 2, 0]).repeat(b, 1)
    cols = torch.tensor([0, 1, 0, 1, 7, 7, 3, 3, 2, 1]).repeat(b, 1)
    levels = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 2]).repeat(b, 1)
    scores = torch.linspace(0, 1, 10).repeat(b, 1)
    return TokenSet.from_grid(rows, cols, levels, image_size=(H, W), patch=P, scores=scores,
                              fixations=torch.tensor([[0.25, 0.5]] * b))


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def image(b=2):
    return torch.rand(b, 3, H, W, generator=torch.Generator().manual_seed(0))


def test_box_vertices_are_the_box_corners():
    v = box_vertices(np.array([[1.0, 2.0, 5.0, 7.0]]))
    assert v.shape == (1, 4, 2)
    assert {tuple(p) for p in v[0]} == {(1, 2), (5, 2), (5, 7), (1, 7)}


def test_overlay_by_level_draws_one_collection_per_level_and_n_boxes(ax):
    t = tokens()
    colls = overlay_tokens(ax, image(), t, index=1)
    assert len(colls) == 3 and all(isinstance(c, PolyCollection) for c in colls)
    assert [len(c.get_paths()) for c in colls] == [6, 3, 1]
    assert sum(len(c.get_paths()) for c in colls) == t.budget
    # Every drawn polygon has the footprint of its level: 16, 32, 64 px sides.
    for c, side in zip(colls, (16, 32, 64)):
        ext = np.array([p.vertices.max(0) - p.vertices.min(0) for p in c.get_paths()])
        np.testing.assert_allclose(ext, side)
    # Drawn rectangles are exactly TokenSet.boxes() of the chosen image.
    drawn = np.concatenate([[np.r_[p.vertices.min(0), p.vertices.max(0)] for p in c.get_paths()]
                            for c in colls])
    want = t.boxes()[1][torch.argsort(t.levels[1], stable=True)].numpy()
    np.testing.assert_allclose(drawn, want, atol=1e-4)
    # Colours differ by level and come from the level colormap; legend has 3 entries.
    edge = [tuple(c.get_edgecolor()[0]) for c in colls]
    assert len(set(edge)) == 3
    np.testing.assert_allclose(edge[2], level_colors(3)[2])
    assert [t_.get_text() for t_ in ax.get_legend().get_texts()] == [
        "level 0 (16px): 6", "level 1 (32px): 3", "level 2 (64px): 1"]
    # One scatter with the N centres; one fixation marker at (0.25 W, 0.5 H).
    offsets = ax.collections[-1].get_offsets()
    assert offsets.shape == (10, 2)
    np.testing.assert_allclose(offsets, t.centers_px()[1].numpy(), atol=1e-4)
    line = ax.lines[-1]
    np.testing.assert_allclose([line.get_xdata()[0], line.get_ydata()[0]], [0.25 * W, 0.5 * H])
    assert ax.images[0].get_array().shape == (H, W, 3)


def test_overlay_by_score_uses_a_colorbar(ax):
    t = tokens()
    colls = overlay_tokens(ax, image(), t, color_by="score", show_centers=False)
    assert len(colls) == 1 and len(colls[0].get_paths()) == 10
    np.testing.assert_allclose(colls[0].get_array(), t.scores[0].numpy())
    assert len(ax.figure.axes) == 2                      # the image axes + its colorbar
    assert all(not isinstance(c, matplotlib.collections.PathCollection) for c in ax.collections)


@pytest.mark.parametrize("kwargs, message", [
    (dict(color_by="size"), "color_by"),
    (dict(index=5), "index"),
])
def test_overlay_bad_arguments(ax, kwargs, message):
    with pytest.raises(ValueError, match=message):
        overlay_tokens(ax, image(), tokens(), **kwargs)


def test_overlay_rejects_mismatched_image(ax):
    with pytest.raises(ValueError, match="image_size"):
        overlay_tokens(ax, torch.rand(2, 3, 64, 64), tokens())


def test_show_scores_over_image_covers_the_image(ax):
    s = torch.rand(2, 6, 8)
    im = show_scores(ax, s, image(), index=1)
    assert im.get_array().shape == (6, 8)
    np.testing.assert_allclose(im.get_array(), s[1].numpy())
    assert tuple(im.get_extent()) == (0, W, H, 0)
    assert len(ax.images) == 2 and len(ax.figure.axes) == 2


def test_show_scores_alone_and_bad_shape(ax):
    im = show_scores(ax, torch.rand(6, 8), colorbar=False)
    assert im.get_array().shape == (6, 8) and len(ax.figure.axes) == 1
    with pytest.raises(ValueError, match="scores"):
        show_scores(ax, torch.rand(6))


def test_show_reconstruction_grey_and_colour(ax):
    im = show_reconstruction(ax, torch.full((1, 1, H, W), 0.5))
    assert im.get_array().shape == (H, W)
    im = show_reconstruction(ax, torch.rand(2, 3, H, W), index=1)
    assert im.get_array().shape == (H, W, 3)


@pytest.mark.parametrize("with_scores, with_recon, n_panels", [
    (False, False, 1), (True, False, 2), (True, True, 3)])
def test_token_panel_layout(with_scores, with_recon, n_panels):
    fig = token_panel(image(), tokens(), recon=torch.rand(2, 3, H, W) if with_recon else None,
                      scores=torch.rand(2, 6, 8) if with_scores else None)
    try:
        main = [a for a in fig.axes if a.get_label() != "<colorbar>"]
        assert len(main) == n_panels
        assert sum(len(c.get_paths()) for c in main[0].collections
                   if isinstance(c, PolyCollection)) == 10
        fig.canvas.draw()                                # renders without error
        assert np.asarray(fig.canvas.buffer_rgba()).std() > 0
    finally:
        plt.close(fig)


def test_token_sets_figure_draws_one_panel_per_token_set_with_the_box():
    t = tokens(1)
    fig = token_sets_figure(image(1), {"a": t, "b": t}, box=(8, 8, 40, 24))
    try:
        assert [a.get_title() for a in fig.axes] == ["a", "b"]
        for a in fig.axes:
            assert sum(len(c.get_paths()) for c in a.collections
                       if isinstance(c, PolyCollection)) == 10
            green = [p for p in a.patches if p.get_edgecolor()[:3] == (0.0, 1.0, 0.0)]
            assert len(green) == 1 and green[0].get_x() == 4
    finally:
        plt.close(fig)
    with pytest.raises(ValueError, match="empty"):
        token_sets_figure(image(1), {})


def test_resize_curve_figure_draws_the_curve_and_the_methods():
    import pandas as pd

    from fovea_book.plotting import resize_curve_figure

    view = pd.DataFrame([dict(dataset=d, method="resize", budget=n, kept=k, flops=1e9 * n)
                         for d in ("a", "b") for n, k in ((273, 0.2), (1024, 0.6))]
                        + [dict(dataset="a", method="cascade", budget=273, kept=0.5, flops=3e11)])
    fig = resize_curve_figure(view, {"a": 0.8, "b": 0.8})
    axes = fig.axes
    assert len(axes) == 4
    curve = axes[0].lines[0]
    assert list(curve.get_xdata()) == [273, 1024]
    assert list(curve.get_ydata()) == pytest.approx([25.0, 75.0])        # kept / ceiling, %
    assert any(list(ln.get_ydata()) == pytest.approx([62.5]) for ln in axes[0].lines[1:])


def test_cascade_stages_figure_draws_each_stage_and_the_answer():
    from fovea_core import build_pyramid
    from fovea_book.eval.localisation import OracleLocaliser
    from fovea_core.cascade import cascade_parts
    from fovea_book.eval.documents import make_document
    from fovea_book.plotting import STAGE_COLORS, cascade_stages_figure

    doc = make_document(41)
    q = doc.questions[0]
    pyr = build_pyramid(doc.image)
    parts = cascade_parts(pyr, 273, query=q.question, gist_budget=64,
                          localiser=OracleLocaliser([doc]))
    fig = cascade_stages_figure(pyr, parts, box=q.union_box)
    try:
        axes = fig.axes
        assert len(axes) == 4
        h, w = doc.size
        assert fig.get_size_inches() == pytest.approx((12, 12 * h / w / 4 + 0.8))
        stage = parts.tokens.stage[0].numpy()
        colls = [c for c in axes[2].collections if isinstance(c, PolyCollection)]
        assert [len(c.get_paths()) for c in colls] == [int((stage == s).sum())
                                                       for s in STAGE_COLORS]
        assert sum(len(c.get_paths()) for c in colls) == 273
        # the drawn footprints are the stage's TokenSet boxes
        drawn = np.array([np.r_[p.vertices.min(0), p.vertices.max(0)]
                          for p in colls[1].get_paths()])
        np.testing.assert_allclose(drawn, parts.tokens.boxes()[0].numpy()[stage == 1])
        n_f = int((stage == 1).sum())
        assert axes[2].get_title() == f"(c) gist (blue) + fovea (red): {parts.gist.budget} + {n_f}"
        assert axes[0].get_title() == f"(a) gist: {parts.gist.budget} tokens"
        # the answer box on panels b-d, none on the gist
        x0, y0, x1, y1 = q.union_box
        for ax in axes[1:]:
            (rect,) = ax.patches
            assert rect.get_xy() == pytest.approx((x0 - 4, y0 - 4))
            assert rect.get_width() == pytest.approx(x1 - x0 + 8)
        assert not axes[0].patches
        # the reconstruction is the page's size
        assert axes[3].images[0].get_array().shape[:2] == (h, w)
    finally:
        plt.close(fig)
    other = build_pyramid(make_document(42, layout="receipt").image)
    with pytest.raises(ValueError, match="pyramid"):
        cascade_stages_figure(other, parts)


def test_gist_split_figure_draws_a_line_per_localiser_and_resize():
    import pandas as pd

    from fovea_book.plotting import gist_split_figure

    rows = [dict(dataset=ds, allocator=f"cascade | {loc} | G={g}", localiser=loc, G=float(g),
                 kept=k + g / 1000, kept_lo=k - 0.1, kept_hi=k + 0.1)
            for ds in ("a", "b") for loc, k in (("learned", 0.5), ("oracle", 0.8))
            for g in (64, 32, 128)]
    rows += [dict(dataset=ds, allocator="resize", localiser=np.nan, G=np.nan, kept=0.3,
                  kept_lo=0.2, kept_hi=0.4) for ds in ("a", "b")]
    fig = gist_split_figure(pd.DataFrame(rows), 273)
    try:
        assert len(fig.axes) == 2
        ax = fig.axes[0]
        learned, oracle, rz, one = ax.lines
        assert list(learned.get_xdata()) == [32, 64, 128]                 # sorted by G
        assert list(oracle.get_ydata()) == pytest.approx([0.832, 0.864, 0.928])
        assert list(rz.get_ydata()) == [0.3, 0.3] and list(one.get_ydata()) == [1, 1]
        assert rz.get_label() == "resize (all 273 on the page)" and ax.get_title() == "a"
    finally:
        plt.close(fig)


def test_two_fixations_figure_draws_each_stage_the_lines_read_and_the_answer():
    from fovea_core import build_pyramid
    from fovea_core.cascade.reading import STAGE_SECOND, reading_parts
    from fovea_book.eval.documents import make_document
    from fovea_book.plotting import two_fixations_figure

    doc = make_document(3, layout="receipt")
    q = next(q for q in doc.questions if q.field == "date")
    pyr = build_pyramid(doc.image)
    parts = reading_parts(pyr, 273, query=q.question, gist_budget=64)
    fig = two_fixations_figure(pyr, parts, box=q.union_box)
    try:
        axes = fig.axes
        assert len(axes) == 3
        rd = parts.readings[0]
        # panel (a): one rectangle per line read, one per match
        assert len(axes[0].patches) == len(rd.lines.texts) + len(rd.matches)
        stage = parts.tokens.stage[0].numpy()
        colls = [c for c in axes[1].collections if isinstance(c, PolyCollection)]
        assert [len(c.get_paths()) for c in colls] == [int((stage == s).sum())
                                                       for s in (0, 1, STAGE_SECOND)]
        assert sum(len(c.get_paths()) for c in colls) == 273
        assert str(int((stage == STAGE_SECOND).sum())) in axes[1].get_title()
        assert any(p.get_edgecolor()[:3] == pytest.approx((0.0, 1.0, 0.0)) for p in axes[2].patches)
        # panel (b): the page, and the read map over it where the reading matched
        assert len(axes[1].images) == 1 + (float(parts.read_maps[0].max()) > 0)
    finally:
        plt.close(fig)
    other = build_pyramid(make_document(4, layout="receipt").image)
    with pytest.raises(ValueError, match="pyramid"):
        two_fixations_figure(other, parts)


def test_answer_geometry_figure_shades_each_rect_by_its_weight():
    import math

    from fovea_core.cascade.reading import AnswerGeometry, Rect
    from fovea_book.plotting import answer_geometry_figure

    g = AnswerGeometry((Rect("right", 0.0, 2.0, 0.0, 1.0, 1.0),
                        Rect("left", 0.0, 4.0, 1.0, 2.0, 0.25),
                        Rect("right", 2.0, math.inf, 0.0, 1.0, 0.5)))
    fig = answer_geometry_figure(g, key_width=4.0)
    try:
        ax = fig.axes[0]
        shaded = [p for p in ax.patches if p.get_fill()]
        assert len(shaded) == 3 and len(ax.patches) == 4          # and the key's outline
        by_x = {round(p.get_x(), 6): p for p in shaded}
        # the row rect starts at the key's right end (x = 4); darker where the weight is higher
        assert set(by_x) == {4.0, 0.0, 6.0}
        darkness = {x: sum(p.get_facecolor()[:3]) for x, p in by_x.items()}
        assert darkness[4.0] < darkness[6.0] < darkness[0.0]
        assert by_x[6.0].get_width() == pytest.approx(58.0)      # the page's edge, cut at 60
    finally:
        plt.close(fig)


def _saving_inputs():
    import pandas as pd

    curve = pd.DataFrame([dict(dataset=d, budget=n, kept=k, lo=k - 0.1, hi=k + 0.05, n_docs=9)
                          for d in ("a", "b", "c") for n, k in ((273, 0.4), (1024, 0.8))])
    points = pd.DataFrame([dict(dataset=d, method=m, kept=k, lo=k - 0.1, hi=k + 0.1)
                           for d in ("a", "b", "c") for m, k in (("m1", 0.5), ("m2", 0.6))])
    ceilings = pd.DataFrame([dict(dataset="a", kept=0.7, n_star=700.0, censored=None,
                                  text="2.6x [1.9, 3.4]"),
                             dict(dataset="b", kept=0.9, n_star=float("nan"), censored="above",
                                  text=">= 3.8x")])
    return curve, points, ceilings


def test_kept_against_tokens_figure_draws_curve_points_ceiling_and_the_saving():
    from fovea_book.plotting import kept_against_tokens_figure

    curve, points, ceilings = _saving_inputs()
    fig = kept_against_tokens_figure(curve, points, ceilings, titles={"c": "forms", "a": "pages"})
    try:
        axes = fig.axes
        assert len(axes) == 4 and not axes[3].get_visible()      # 3 panels in a 2 x 2 grid
        # the titles' order first, then the curve's: c, a, b
        titles = [ax.get_title() for ax in axes[:3]]
        assert titles == ["forms (n = 9)", "pages (n = 9)", "b (n = 9)"]
        axes = [axes[1], axes[2], axes[0]]                        # a, b, c as below
        a = axes[0]
        assert a.get_xscale() == "log"
        line = a.lines[0]
        assert list(line.get_xdata()) == [273, 1024]
        assert list(line.get_ydata()) == pytest.approx([40.0, 80.0])   # kept, % of the page
        band = a.collections[0].get_paths()[0].vertices
        assert band[:, 1].min() == pytest.approx(30.0) and band[:, 1].max() == pytest.approx(85.0)
        # the methods at N: centred on N, one marker each, with their CI
        xs = [ln.get_xdata()[0] for ln in a.lines if ln.get_marker() in ("o", "s")
              and len(ln.get_xdata()) == 1]
        assert len(xs) == 2 and np.sqrt(xs[0] * xs[1]) == pytest.approx(273)
        ys = sorted(ln.get_ydata()[0] for ln in a.lines if len(ln.get_xdata()) == 1
                    and ln.get_marker() in ("o", "s"))
        assert ys == pytest.approx([50.0, 60.0])
        # the ceiling, the arrow from N to N*, and the factor read off the picture
        dashed = [ln for ln in a.lines if ln.get_linestyle() == "--"]
        assert [list(ln.get_ydata()) for ln in dashed] == [[70.0, 70.0]]
        arrow = [t for t in a.texts if hasattr(t, "xy") and t.arrow_patch is not None]
        assert len(arrow) == 1 and arrow[0].xy == pytest.approx((700.0, 70.0))
        assert arrow[0].xyann == pytest.approx((273, 70.0))
        words = " ".join(t.get_text() for t in a.texts)
        assert "N* = 700" in words and "2.6x [1.9, 3.4]" in words
        # censored: the arrow runs off the curve's end, the bound is printed
        b_words = " ".join(t.get_text() for t in axes[1].texts)
        assert "never reaches" in b_words and ">= 3.8x" in b_words
        # a collection with no ceiling row: no dashed line, no arrow
        assert not [ln for ln in axes[2].lines if ln.get_linestyle() == "--"]
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert labels[:3] == ["resize (95 % CI)", "m1", "m2"]
        assert "answer's box given (oracle cascade)" in labels
    finally:
        plt.close(fig)


def test_kept_against_tokens_figure_bad_arguments():
    from fovea_book.plotting import kept_against_tokens_figure

    curve, points, ceilings = _saving_inputs()
    with pytest.raises(ValueError, match="curve has no rows"):
        kept_against_tokens_figure(curve.iloc[:0], points, ceilings)
    with pytest.raises(ValueError, match="spread"):
        kept_against_tokens_figure(curve, points, ceilings, spread=0.5)
    many = points.assign(method=[f"m{i}" for i in range(len(points))])
    many = many.loc[many.index.repeat(2)].assign(method=lambda t: [f"x{i}" for i in range(len(t))])
    with pytest.raises(ValueError, match="methods"):
        kept_against_tokens_figure(curve, many, ceilings)
