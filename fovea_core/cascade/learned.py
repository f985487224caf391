"""The learned localiser: gist pixels + the question's MiniLM embedding -> where the answer is.

The seeds' "supervised Homunculus": importance learned from pages whose answer boxes are
known. Synthetic pages give them for free (:mod:`fovea_book.eval.documents`), so a small
network is trained there (:mod:`fovea_book.train`) and applied to any page's gist.

Input (:func:`gist_features`, ``[B, 7, h, w]`` on the gist's pixels): ink (the gist's luma
below the page's paper tone, scaled by its 99th percentile, so grey scans and white pages
look alike), the pixel's position on the page ``(x / W, y / H)``, its position within the
inked extent of the page (2nd-98th percentile of ink along each axis, so a receipt lying
on a larger sheet is found where it lies), a page mask and the page's log aspect ratio.

Network (:class:`GistLocaliserNet`, about 20 k parameters): a fully convolutional trunk of
residual 3 x 3 convolutions with dilations 1, 2, 4, 8 (receptive field 63 gist pixels) plus
each row's and column's mean feature broadcast back (global context along text lines and
columns) and the position channels, mixed into K non-negative detector maps; the
question embedding (384-d MiniLM [Reimers & Gurevych 2019], or the embedding of the empty
string for "no question") weights them linearly (a low-rank bilinear question x place
score, cheaper than FiLM [Perez et al. 2018] because the maps are computed once per page),
giving a logit per gist pixel. The softmax over the page's gist pixels is a probability map of the
answer's location; :func:`~fovea_core.cascade.core.gist_to_grid` moves its mass to the
level-0 patch grid.

Training target (:func:`answer_targets`): the answer boxes' area on each
gist pixel, normalised to sum 1 (the cross-entropy of a distribution over locations). Without a question, the union of every
answer on the page (a question-agnostic prior of where answers sit). A second output, a
map of the text height (log2, in gist pixels, so the prediction scales with the page's
resolution), is trained on the answers' font sizes (squared error of its mean over the
answer); averaged under the predicted location it tells the fovea which scale makes the
answer legible (:func:`~fovea_core.cascade.allocator.choose_level`).
"""

from __future__ import annotations

import functools
import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fovea_core.cascade.core import Gist, gist_to_grid
from fovea_core.paths import file_digest as file_sha256  # (SHA-256; a name of this module's API)
from fovea_core.paths import resource

__all__ = ["IN_CHANNELS", "EMBED_DIM", "gist_features", "paper_region", "PAPER_MIN", "PAPER_MAX",
           "GistLocaliserNet", "question_embedding", "weights_path", "load_model", "file_sha256",
           "LearnedLocaliser", "encode_gist", "answer_targets", "pool_target",
           "collate_pages", "augment_ink", "jitter_embedding", "batch_loss", "SIZE_WEIGHT",
           "EMBED_NOISE"]

IN_CHANNELS = 7
EMBED_DIM = 384
_LUMA = (0.299, 0.587, 0.114)


def _percentile_extent(profile: torch.Tensor, lo: float = 0.02, hi: float = 0.98
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (fractional indices) of the ``lo`` and ``hi`` quantiles of a non-negative
    profile ``[B, n]`` (its cumulative mass), vectorised over the batch."""
    cum = profile.cumsum(1)
    tot = cum[:, -1:].clamp(min=1e-12)
    q = torch.tensor([lo, hi], dtype=cum.dtype).expand(cum.shape[0], 2) * tot
    idx = torch.searchsorted(cum.contiguous(), q.contiguous()).clamp(max=profile.shape[1] - 1)
    return idx[:, 0].to(profile.dtype), idx[:, 1].to(profile.dtype) + 1


def gist_features(g: Gist, region: torch.Tensor | None = None) -> torch.Tensor:
    """The network's input ``[B, 7, rows*p, cols*p]`` from a gist (see the module docstring).

    Channels: 0 ink in [0, 1]; 1-2 page position ``x / W``, ``y / H``; 3-4 position within
    the inked extent (0 at its 2nd percentile, 1 at its 98th); 5 page mask (1 on the page);
    6 ``log(H / W)``. Pixels off the page have ink 0.

    ``region``: ``[B, rows*p, cols*p]`` bool, a rectangle of gist pixels per image to treat
    as the page (:func:`paper_region`: the sheet of paper in a photograph). Pixels outside
    it are off the page; positions, the paper tone and the aspect ratio are the rectangle's,
    so the network sees the sheet as it saw its training pages, which filled their frame.
    ``None``: the whole page (the features the committed weights were trained on).
    """
    if region is not None:
        # an image whose region is its whole page reads exactly the plain features, so a
        # batch gives each image what it would get alone
        plain = gist_features(g)
        own = (region.bool() != g.inside()[None]).flatten(1).any(1)           # [B]
        if not bool(own.any()):
            return plain
        return torch.where(own[:, None, None, None], _region_features(g, region), plain)
    luma = _luma(g.image.float())                                             # [B, h, w]
    b = luma.shape[0]
    h, w = g.image_size
    ys, xs = g.pixel_centres()
    return _channels(luma, g.inside()[None].expand_as(luma), (ys / h).float()[None].expand(b, -1),
                     (xs / w).float()[None].expand(b, -1), torch.full((b,), float(np.log(h / w))))


def _channels(luma: torch.Tensor, on: torch.Tensor, yn: torch.Tensor, xn: torch.Tensor,
              aspect: torch.Tensor) -> torch.Tensor:
    """The seven input channels ``[B, 7, h, w]`` (:func:`gist_features`) from the gist's luma
    ``[B, h, w]``, each image's page mask ``on [B, h, w]`` (bool), the pixels' positions on
    that page ``yn [B, h]``, ``xn [B, w]`` and its ``log(H / W)`` ``aspect [B]``: ink below
    the paper tone (the page's median luma) scaled by its 99th percentile, and the position
    within the inked extent."""
    b, hp, wp = luma.shape
    off = ~on.flatten(1)
    paper = luma.flatten(1).masked_fill(off, float("nan")).nanmedian(dim=1).values   # [B]
    page = on.to(luma.dtype)
    dark = (paper[:, None, None] - luma).clamp(min=0) * page
    scale = torch.nanquantile(dark.flatten(1).masked_fill(off, float("nan")), 0.99,
                              dim=1).clamp(min=0.05)
    ink = (dark / scale[:, None, None]).clamp(0, 1)
    y0, y1 = _percentile_extent(ink.sum(2))
    x0, x1 = _percentile_extent(ink.sum(1))
    iy = torch.arange(hp, dtype=luma.dtype) + 0.5
    ix = torch.arange(wp, dtype=luma.dtype) + 0.5
    yr = (iy[None] - y0[:, None]) / (y1 - y0).clamp(min=1)[:, None]            # [B, h]
    xr = (ix[None] - x0[:, None]) / (x1 - x0).clamp(min=1)[:, None]            # [B, w]
    return torch.stack([ink, xn[:, None].expand(b, hp, wp), yn[:, :, None].expand(b, hp, wp),
                        xr[:, None].expand(b, hp, wp).clamp(-0.5, 1.5),
                        yr[:, :, None].expand(b, hp, wp).clamp(-0.5, 1.5), page,
                        aspect.to(luma.dtype)[:, None, None].expand(b, hp, wp)], 1)


def _luma(img: torch.Tensor) -> torch.Tensor:
    """``[B, h, w]`` luma of a ``[B, C, h, w]`` gist image (its one channel when grey)."""
    if img.shape[1] == 3:
        return (img * img.new_tensor(_LUMA).view(1, 3, 1, 1)).sum(1)
    return img[:, 0]


def _bounds(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y0, y1, x0, x1)`` ``[B]`` (exclusive ends) of the True pixels of ``mask [B, h, w]``
    (the whole image where a mask is empty)."""
    rows, cols = mask.any(2), mask.any(1)                                    # [B, h], [B, w]
    iy = torch.arange(mask.shape[1])
    ix = torch.arange(mask.shape[2])
    big = torch.iinfo(torch.int64).max
    y0 = torch.where(rows, iy, big).min(1).values
    y1 = torch.where(rows, iy + 1, 0).max(1).values
    x0 = torch.where(cols, ix, big).min(1).values
    x1 = torch.where(cols, ix + 1, 0).max(1).values
    empty = ~mask.flatten(1).any(1)
    return (torch.where(empty, 0, y0), torch.where(empty, mask.shape[1], y1),
            torch.where(empty, 0, x0), torch.where(empty, mask.shape[2], x1))


def _region_features(g: Gist, region: torch.Tensor) -> torch.Tensor:
    """:func:`gist_features` with ``region`` (``[B, h, w]`` bool) as each image's page."""
    img = g.image.float()
    luma = _luma(img)                                                         # [B, h, w]
    b, hp, wp = luma.shape
    if tuple(region.shape) != (b, hp, wp):
        raise ValueError(f"gist_features: region has shape {tuple(region.shape)}, the gist "
                         f"image is {(b, hp, wp)}")
    ins = region.bool() & g.inside()[None]                                    # [B, h, w]
    ins = torch.where(ins.flatten(1).any(1)[:, None, None], ins, g.inside()[None])
    y0, y1, x0, x1 = (v.to(luma.dtype) for v in _bounds(ins))                # gist pixels
    iy = torch.arange(hp, dtype=luma.dtype) + 0.5
    ix = torch.arange(wp, dtype=luma.dtype) + 0.5
    yn = (iy[None] - y0[:, None]) / (y1 - y0)[:, None]                        # [B, h]
    xn = (ix[None] - x0[:, None]) / (x1 - x0)[:, None]                        # [B, w]
    return _channels(luma, ins, yn, xn, torch.log((y1 - y0) / (x1 - x0)))


#: :func:`paper_region`'s limits: a bright component is taken as the sheet when its bounding
#: box covers at least ``PAPER_MIN`` and at most ``PAPER_MAX`` of the page (a scan's sheet
#: fills it: nothing to crop; a tiny bright blob is not a sheet)
PAPER_MIN, PAPER_MAX = 0.15, 0.85


def paper_region(g: Gist) -> torch.Tensor | None:
    """``[B, h, w]`` bool: the sheet of paper in each gist image, as a rectangle of gist
    pixels -- the bounding box of the largest bright connected component; ``None`` when no
    image of the batch has one (every page is its own sheet, as a scan is).

    Bright: luma above Otsu's threshold [Otsu 1979, "A threshold selection method from
    gray-level histograms"] of the page's gist pixels, closed with a 3 x 3 square (text
    lines do not cut the sheet); components by 8-connectivity (OpenCV). Where that box
    covers less than :data:`PAPER_MIN` or more than :data:`PAPER_MAX` of the page (a scan
    whose sheet fills the frame; no sheet found), the whole page. Reads only the gist's
    pixels (part of the budget). One OpenCV call per image of the batch (a few thousand
    pixels each).
    """
    import cv2

    luma = _luma(g.image.float())                                             # [B, h, w]
    inside = g.inside()
    lo = luma.flatten(1).min(1).values[:, None, None]
    hi = luma.flatten(1).max(1).values[:, None, None]
    u8 = ((luma - lo) / (hi - lo).clamp(min=1e-6) * 255).round().to(torch.uint8).numpy()
    ins = inside.numpy()
    page = float(ins.sum())
    kernel = np.ones((3, 3), np.uint8)
    out = np.repeat(ins[None], len(u8), 0)
    found = False
    for b, im in enumerate(u8):                              # images of the batch
        t, _ = cv2.threshold(im[ins], 0, 255, cv2.THRESH_BINARY + cv2.THRESH_OTSU)
        bright = cv2.morphologyEx(((im > t) & ins).astype(np.uint8), cv2.MORPH_CLOSE, kernel)
        n, lab, stats, _ = cv2.connectedComponentsWithStats(bright, connectivity=8)
        if n < 2:
            continue
        k = 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))
        x, y, w, h = (int(v) for v in stats[k, :4])
        box = np.zeros_like(ins)
        box[y:y + h, x:x + w] = True
        share = float((box & ins).sum()) / page
        if PAPER_MIN <= share <= PAPER_MAX:
            out[b] = box & ins
            found = True
    return torch.from_numpy(out) if found else None


class GistLocaliserNet(nn.Module):
    """Gist features ``[B, 7, h, w]`` + question embeddings -> logits ``[Q, h, w]``.

    ``forward(x, mask, q, page)``: ``mask [B, h, w]`` bool (the page's pixels), ``q [Q, 384]``
    question embeddings, ``page [Q]`` the index of each question's page in the batch.

    The page's features are turned into ``maps`` non-negative *detector maps* ``m_k``
    (1 x 1 convolution of the trunk's features, ReLU); the question selects among them:
    ``logit_q = sum_k a_k(q) m_k + b_q`` with ``a = W q`` (a linear read-out of the MiniLM
    embedding, :math:`[K]`). A low-rank bilinear form between question and place: a question
    about a total raises the maps that fire on bottom-right amounts, one about a company
    those that fire on large top lines. Logits off the page are ``-inf``.

    ``position=False``: the network never sees where on the page a pixel lies -- the
    position channels (1-4) and the aspect ratio (6) are zeroed before the stem, so the maps
    come from the ink, the page mask and the row and column context alone (a layout prior
    such as "the date is near the top" cannot be learned; a test of whether the map's
    failure on photographs and crops is that prior). Its weights have the same shapes; the
    record's ``arch`` says which net they belong to.
    """

    #: the input channels a position-free net zeroes (page and extent positions, aspect)
    POSITION_CHANNELS = (1, 2, 3, 4, 6)

    def __init__(self, width: int = 16, maps: int = 32, position: bool = True):
        super().__init__()
        c = width
        self.position = bool(position)
        keep = torch.ones(IN_CHANNELS)
        if not self.position:
            keep[list(self.POSITION_CHANNELS)] = 0.0
        self.register_buffer("keep", keep.view(1, IN_CHANNELS, 1, 1), persistent=False)
        self.stem = nn.Conv2d(IN_CHANNELS, c, 3, padding=1)
        self.trunk = nn.ModuleList([nn.Conv2d(c, c, 3, padding=d, dilation=d) for d in (1, 2, 4, 8)])
        self.mix = nn.Sequential(nn.Conv2d(3 * c + 5, 2 * c, 1), nn.ReLU(),
                                 nn.Conv2d(2 * c, maps, 1), nn.ReLU())
        self.size = nn.Conv2d(3 * c + 5, 1, 1)
        self.select = nn.Linear(EMBED_DIM, maps)

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Question-independent detector maps ``[B, K, ceil(h/2), ceil(w/2)]`` (>= 0) and the
        text-size map ``[B, ceil(h/2), ceil(w/2)]`` (log2 of the text height in gist pixels).

        Everything runs at half the gist's resolution (2 x 2 mean pooling of the input;
        one output pixel = 2 x 2 gist pixels, about one level-0 cell on a 1024 px page at
        G = 64): the stem, the dilated trunk (receptive field 31 output pixels), then the
        row and column means of the trunk's features over the page (global context) and
        the position channels are mixed into the maps.
        """
        x = F.avg_pool2d(x * self.keep, 2, ceil_mode=True).contiguous(
            memory_format=torch.channels_last)
        f = F.relu(self.stem(x))
        for conv in self.trunk:
            f = f + F.relu(conv(f))
        m = x[:, 5:6]                                                  # page share per pixel
        row = (f * m).sum(3, keepdim=True) / m.sum(3, keepdim=True).clamp(min=1e-3)
        col = (f * m).sum(2, keepdim=True) / m.sum(2, keepdim=True).clamp(min=1e-3)
        g = torch.cat([f, row.expand_as(f), col.expand_as(f), x[:, 1:6]], 1)
        return self.mix(g), self.size(g)[:, 0]

    def forward(self, x: torch.Tensor, mask: torch.Tensor, q: torch.Tensor,
                page: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits [Q, ceil(h/2), ceil(w/2)], size map [B, ceil(h/2), ceil(w/2)])``; logits
        are ``-inf`` where no gist pixel is on the page (``mask [B, h, w]``)."""
        m, size = self.encode(x)                                       # [B, K, h2, w2]
        a = self.select(q)                                             # [Q, K]
        logit = torch.einsum("qk,qkhw->qhw", a, m[page])
        keep = F.max_pool2d(mask[:, None].float(), 2, ceil_mode=True)[:, 0] > 0
        return logit.masked_fill(~keep[page], float("-inf")), size

    def extra_repr(self) -> str:
        return "" if self.position else "position=False"


# ----------------------------------------------------------------------------- embeddings
def question_embedding(queries: list[str | None]) -> torch.Tensor:
    """MiniLM embeddings ``[Q, 384]`` (unit norm); ``None`` is embedded as the empty string,
    the network's "no question" input."""
    from fovea_core.importance.query import embed

    return torch.from_numpy(embed([q if q else "" for q in queries]).copy())


# ----------------------------------------------------------------------------- weights
def weights_path(name: str = "gist_localiser") -> Path:
    """``fovea_core/weights/<name>.pt``: the committed weights, shipped in the package."""
    return resource("weights", f"{name}.pt")


@functools.lru_cache(maxsize=4)
def load_model(path: str | None = None, *, verify: bool = True) -> GistLocaliserNet:
    """The trained network from ``path`` (default :func:`weights_path`), in eval mode.

    With ``verify``, the weights' SHA-256 must equal the one recorded in the JSON beside
    them (``<name>.json``, written by the training script), else ``ValueError``: the book
    must not silently run on other weights than the ones its text describes.
    """
    p = Path(path) if path else weights_path()
    committed = p.resolve() == weights_path().resolve()
    if not p.exists() and not committed:
        raise FileNotFoundError(f"no localiser weights at {p}")
    if not p.exists():
        raise FileNotFoundError(f"no localiser weights at {p}; restore the committed ones "
                                "(`git checkout fovea_core/weights/gist_localiser.*`, or reinstall fovea_core) or retrain "
                                "them with `python -m fovea_book.train "
                                "--replace-committed` (without that flag it writes "
                                "_build/models/)")
    meta_path = p.with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if verify:
        want = meta.get("sha256")
        have = file_sha256(p)
        if want != have and not committed:
            raise ValueError(f"localiser weights {p} have SHA-256 {have[:12]}..., "
                             + (f"the record {meta_path.name} says {str(want)[:12]}..."
                                if meta_path.exists() else f"and no record {meta_path.name} "
                                "beside them vouches for them")
                             + "; use the .pt and .json written together (by "
                             "fovea_core.adapt or the book's training), or write them again")
        if want != have:
            raise ValueError(f"localiser weights {p} have SHA-256 {have[:12]}..., the record "
                             f"{meta_path.name} says {str(want)[:12]}...; restore the "
                             "committed files (`git checkout fovea_core/weights/gist_localiser.*`, or reinstall fovea_core) "
                             "or retrain both with `python -m fovea_book.train "
                             "--replace-committed`")
    state = torch.load(p, map_location="cpu", weights_only=True)
    arch = meta.get("arch", {})
    net = GistLocaliserNet(**arch)
    net.load_state_dict({k: v.float() for k, v in state.items()})
    net.eval()
    return net


_ENCODED: OrderedDict = OrderedDict()


def encode_gist(g: Gist, net: GistLocaliserNet | None = None, region: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``net.encode(gist_features(g, region))`` (the question-independent detector maps and
    size map; default net: the committed weights), cached per gist, network and region, so
    that the questions about one page encode it once."""
    net = net if net is not None else load_model()
    key = (id(net), g.key, g.rows, g.cols, g.level, g.image_size,
           None if region is None else region.numpy().tobytes())
    if g.key and key in _ENCODED:
        return _ENCODED[key]
    with torch.no_grad():
        out = net.encode(gist_features(g, region))
    if g.key:
        _ENCODED[key] = out
        while len(_ENCODED) > 32:
            _ENCODED.popitem(last=False)
    return out


class LearnedLocaliser:
    """Localiser (b) backed by :class:`GistLocaliserNet`: ``loc(gist, query) -> [B, Gh, Gw]``.

    The output is the answer-location probability moved to the level-0 patch grid (mass
    per cell, sums to 1 per image). ``query=None`` asks the network's question-agnostic
    prior (trained with the empty question). Reads nothing but the gist and the question.

    ``paper=True`` finds the sheet of paper in the gist first (:func:`paper_region`) and
    localises on it as if it were the page (:func:`gist_features`' ``region``); nothing off
    the sheet gets mass. A scan whose sheet fills the frame is read as without it.
    """

    def __init__(self, path: str | None = None, *, verify: bool = True,
                 net: GistLocaliserNet | None = None, paper: bool = False):
        self.net = net if net is not None else load_model(path, verify=verify)
        self.paper = bool(paper)

    def predict(self, g: Gist, query: str | None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(p [B, ceil(h/2), ceil(w/2)], text_px [B])``: the answer-location probability on
        2 x 2 blocks of gist pixels, and the expected text height of the answer in base
        pixels (the size map averaged under ``p``, times the gist's pixel)."""
        region = paper_region(g) if self.paper else None          # None: no sheet found
        maps, size = encode_gist(g, self.net, region)
        b = maps.shape[0]
        q = question_embedding([query] * b)
        with torch.no_grad():
            logit = torch.einsum("bk,bkhw->bhw", self.net.select(q), maps)
        on = (g.inside()[None] if region is None else region & g.inside()[None]).float()
        keep = F.max_pool2d(on[:, None], 2, ceil_mode=True)[:, 0] > 0           # [B or 1, ., .]
        logit = logit.masked_fill(~keep, float("-inf"))
        p = torch.softmax(logit.flatten(1), 1).view_as(logit)
        text_px = torch.exp2((p * size).flatten(1).sum(1)) * g.pixel
        return p, text_px

    def __call__(self, g: Gist, query: str | None) -> torch.Tensor:
        return gist_to_grid(self.predict(g, query)[0], g, mode="mass", scale=2)

    def text_px(self, g: Gist, query: str | None) -> torch.Tensor:
        """Expected text height of the answer ``[B]`` in base pixels."""
        return self.predict(g, query)[1]


# ----------------------------------------------------------------------------- training
#: weight of the text-size loss (squared error in octaves) beside the location loss
SIZE_WEIGHT = 0.5
#: standard deviation of the Gaussian noise added to each embedding coordinate in training
EMBED_NOISE = 0.01


def pool_target(t: torch.Tensor) -> torch.Tensor:
    """Sum a target ``[..., h, w]`` over 2 x 2 blocks (the network's output pixels)."""
    return F.avg_pool2d(t[:, None] if t.ndim == 3 else t[None, None], 2, ceil_mode=True,
                        divisor_override=1).squeeze(-3).reshape(*t.shape[:-2], *(
                            (t.shape[-2] + 1) // 2, (t.shape[-1] + 1) // 2))


def answer_targets(ys: torch.Tensor, xs: torch.Tensor, half: float, inside: torch.Tensor,
                   boxes) -> torch.Tensor:
    """The localiser's training target, one map per question: ``[Q, h, w]`` float32.

    Each map is the area (base px^2) of the question's answer boxes on each gist pixel --
    the overlap of the pixel's square ``[c - half, c + half]`` with each box, separable in
    y and x and summed over the boxes -- zero off the page, normalised to sum 1 (a
    distribution over locations, the cross-entropy's target; all zeros when the boxes
    miss the page). This is the one definition: the book's ``fovea_book.train.target_map``
    (one question on a :class:`~fovea_core.cascade.core.Gist`), the training batches
    (:func:`collate_pages`) and the adaptation (:func:`fovea_core.adapt`) call it, and the
    committed weights were trained on exactly these values (``tests/test_cascade_train.py``).

    Parameters
    ----------
    ys, xs : Tensor
        ``[h]`` and ``[w]`` base-pixel centres of the gist pixels (float64,
        :meth:`~fovea_core.cascade.core.Gist.pixel_centres`).
    half : float
        Half a gist pixel in base px (``gist.pixel / 2``), > 0.
    inside : Tensor
        ``[h, w]`` bool, gist pixels on the page (:meth:`~fovea_core.cascade.core.Gist.inside`).
    boxes : sequence of array-like
        Per question, its answer boxes ``[K, 4]`` ``(x0, y0, x1, y1)`` in base px.
    """
    if not half > 0:
        raise ValueError(f"answer_targets: half must be > 0 (half a gist pixel), got {half!r}")
    if inside.shape != (len(ys), len(xs)):
        raise ValueError(f"answer_targets: inside has shape {tuple(inside.shape)}, the pixel "
                         f"centres give ({len(ys)}, {len(xs)})")
    if len(boxes) == 0:
        raise ValueError("answer_targets: boxes is empty (give one [K, 4] array per question)")
    out = []
    for b in boxes:                                     # a handful of questions per page
        bt = torch.as_tensor(np.asarray(b, dtype=np.float64).reshape(-1, 4))
        oy = (torch.minimum(ys[None] + half, bt[:, 3:4]) -
              torch.maximum(ys[None] - half, bt[:, 1:2])).clamp(min=0)   # [K, h]
        ox = (torch.minimum(xs[None] + half, bt[:, 2:3]) -
              torch.maximum(xs[None] - half, bt[:, 0:1])).clamp(min=0)   # [K, w]
        t = torch.einsum("ky,kx->yx", oy, ox) * inside
        out.append(t / t.sum().clamp(min=1e-12))
    return torch.stack(out).float()


def jitter_embedding(v: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A question embedding ``[384]`` as training sees it: plus Gaussian noise of standard
    deviation :data:`EMBED_NOISE` per coordinate (drawn from ``gen``), renormalised, so the
    network does not learn a handful of exact sentence vectors."""
    v = v + EMBED_NOISE * torch.randn(v.shape, generator=gen)
    return v / v.norm().clamp(min=1e-6)


def augment_ink(x: torch.Tensor, mask: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """The training augmentation of a batch's ink channel, in place on ``x [B, 7, H, W]``
    (``mask [B, H, W]`` bool, the pages' pixels): per page a random gamma
    (``exp(0.25 z)``) and gain (``exp(0.15 z)``), plus Gaussian noise of 0.03 per pixel,
    clipped to ``[0, 1]`` and zero off the page. Draws from ``gen`` in that order; returns
    ``x``."""
    b, _, hmax, wmax = x.shape
    gamma = torch.exp(torch.randn(b, 1, 1, generator=gen) * 0.25)
    gain = torch.exp(torch.randn(b, 1, 1, generator=gen) * 0.15)
    noise = torch.randn(b, hmax, wmax, generator=gen) * 0.03
    ink = (x[:, 0].clamp(min=0) ** gamma * gain + noise).clamp(0, 1)
    x[:, 0] = ink * mask
    return x


def collate_pages(samples, q: torch.Tensor, *, augment: torch.Generator | None = None):
    """Pad pages to one training batch.

    ``samples``: pages with ``x [7, h, w]`` (gist features), ``inside [h, w]`` bool,
    ``ys [h]``, ``xs [w]`` (gist pixel centres, base px), ``half`` (half a gist pixel),
    ``boxes`` (per question ``[K, 4]`` base px), ``sizes`` (per question, log2 text height
    in gist pixels) and ``queries`` (one entry per question); ``q [Q, 384]``: the question
    embeddings, page by page in order. With ``augment`` (a generator) the ink channel is
    augmented (:func:`augment_ink`).

    Returns ``(x [B, 7, H, W], mask [B, H, W], q [Q, 384], page [Q], target [Q, H, W],
    size [Q])`` (``H``, ``W`` the largest page's; ``page``: each question's page index).
    """
    hmax = max(s.x.shape[1] for s in samples)
    wmax = max(s.x.shape[2] for s in samples)
    b = len(samples)
    x = torch.zeros(b, 7, hmax, wmax)
    mask = torch.zeros(b, hmax, wmax, dtype=torch.bool)
    tg, page, size = [], [], []
    for i, s in enumerate(samples):                     # pages of one batch
        h, w = s.x.shape[1:]
        x[i, :, :h, :w] = s.x.float()
        mask[i, :h, :w] = s.inside
        t = answer_targets(s.ys, s.xs, s.half, s.inside, s.boxes)
        tg.append(F.pad(t, (0, wmax - w, 0, hmax - h)))
        page += [i] * len(s.queries)
        size += s.sizes
    if q.shape[0] != len(page):
        raise ValueError(f"collate_pages: q has {q.shape[0]} embeddings for {len(page)} questions")
    if augment is not None:
        augment_ink(x, mask, augment)
    return x, mask, q, torch.tensor(page), torch.cat(tg), torch.tensor(size)


def batch_loss(net: GistLocaliserNet, batch, *, parts: bool = False):
    """Mean cross-entropy ``-sum_pixels target * log_softmax(logits)`` over the questions,
    plus :data:`SIZE_WEIGHT` x the squared error (octaves) of the size map averaged over the
    answer's pixels. ``batch``: :func:`collate_pages`' tuple. ``parts``: return ``(total,
    location, size)``."""
    x, mask, q, page, target, size = batch
    logit, smap = net(x, mask, q, page)
    logp = torch.log_softmax(logit.flatten(1), 1)
    t = pool_target(target).flatten(1)
    loc = -(t * torch.where(t > 0, logp, torch.zeros_like(logp))).sum(1).mean()
    pred = (t * smap[page].flatten(1)).sum(1)
    err = ((pred - size) ** 2).mean()
    total = loc + SIZE_WEIGHT * err
    return (total, loc, err) if parts else total
