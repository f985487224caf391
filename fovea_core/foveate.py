"""One call from a page (and a question) to what a VLM should see: :func:`foveate`.

The book wires the stages in notebook cells (chapters 07 and 14.5); this module is the same
wiring as a single function, for a researcher's own pages::

    image --load_image--> [1, C, H, W] --build_pyramid--> Pyramid
          --score(scorer, question)--> [1, Gh, Gw]         (methods that read a score map)
          --allocate(method, budget, query=question)--> TokenSet (exactly N tokens)
    TokenSet --sample--> patches [1, N, C, p, p] --render--> view [C, H, W]

``method`` is any name of :data:`fovea_core.allocators.ALLOCATORS`; the default,
``"cascade"``, is the budgeted learned cascade of chapter 14.5 (a gist of the page, a
learned localiser that reads the gist and the question, a fovea; every token inside N).
Methods that rank a score map get ``scorer="saliency"`` without a question and the
query-aware ``"query_saliency"`` with one (an OCR of the half-resolution page, outside the
budget: chapter 07), unless ``scorer=`` says otherwise.

The cost record (:class:`Cost`) counts what the method spent in the currency of
``shared/PROTOCOL.md``: the N tokens the model receives plus the token equivalent of what
the scorer and the allocator read outside them, computed by the sweep's own functions
(:func:`fovea_core.eval.sweep.scorer_tokens`, :func:`~fovea_core.eval.sweep.alloc_read_tokens`),
so that a page foveated here is labelled as the book's tables label it.
"""

from __future__ import annotations

import inspect
import math
import sys
import time
import types
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fovea_core.pyramid import as_image_batch, build_pyramid
from fovea_core.tokens import TokenSet

__all__ = ["Cost", "Foveation", "FoveateWarning", "DEFAULT_METHOD", "LABELS", "foveate",
           "load_image", "method_names", "method_summary", "uses_question", "check_method",
           "plot_foveation"]

#: the method :func:`foveate` runs by default (chapter 14.5's budgeted learned cascade)
DEFAULT_METHOD = "cascade"
#: the cost labels of ``shared/PROTOCOL.md``, from cheapest to dearest
LABELS = ("budgeted", "side compute", "unbudgeted")
#: cascade localisers that do not read the question (:mod:`fovea_core.cascade.localisers`)
_QUESTION_BLIND_LOCALISERS = ("learned_prior", "uniform")


class FoveateWarning(UserWarning):
    """A question or option that the chosen method does not use."""


@dataclass(frozen=True)
class Cost:
    """What one foveation spent (``shared/PROTOCOL.md``, "Same currency").

    Attributes:
        tokens: visual tokens the model receives (N).
        scorer: the importance scorer whose map the method ranked (``"none"``: it reads no
            map, e.g. ``resize`` or the cascade, which looks through its own gist tokens).
        scorer_tokens: 16 x 16-pixel token equivalent of what the scorer read outside N.
        alloc_read_tokens: the same for what the allocator itself read besides the map.
        total_tokens: ``tokens + scorer_tokens + alloc_read_tokens``.
        side_pixels: pixels read outside the N tokens (0 for a budgeted method).
        side_ms: CPU milliseconds of that outside look (the scorer's call; 0 if none).
        side_flops: FLOPs of the outside look where the method declares them (the cascade's
            text detector, :func:`~fovea_core.cascade.side.detector_flops`; ``None``: not
            declared, as for the scorers).
        reads_text: the outside look recognises text (an OCR): unbudgeted whatever its size.
        label: ``"budgeted"`` (nothing read outside N), ``"side compute"`` (a look outside N
            that recognises no text: costs at most N tokens' worth of pixels, or a method
            registered as side compute, costed in FLOPs and milliseconds beside N) or
            ``"unbudgeted"``.
    """

    tokens: int
    scorer: str
    scorer_tokens: float
    alloc_read_tokens: float
    total_tokens: float
    side_pixels: int
    side_ms: float
    side_flops: float | None
    reads_text: bool
    label: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, eq=False)
class Foveation:
    """The result of :func:`foveate` for one page.

    Attributes:
        tokens: the :class:`~fovea_core.tokens.TokenSet` (batch of one, exactly ``budget``
            tokens; ``tokens.stage`` labels a cascade's gist (0) and fovea (1) tokens).
        patches: ``[1, N, C, p, p]`` float32, what each token carries
            (:func:`fovea_core.sample.sample`).
        view: ``[C, H, W]`` float32 in ``[0, 1]``, the reconstruction of what the model sees
            (:func:`fovea_core.sample.render` over the pyramid's coarsest level).
        cost: the :class:`Cost` record.
        method: the allocator's registry name.
        options: the keyword options the allocator received (besides budget and question).
        question: the question asked (``None``: none).
        question_used: whether ``method`` (with its scorer or localiser) read the question.
        scores: ``[1, Gh, Gw]`` the map the allocator ranked, or ``None`` for methods that
            read no score map.
    """

    tokens: TokenSet
    patches: torch.Tensor
    view: torch.Tensor
    cost: Cost
    method: str
    options: dict = field(default_factory=dict)
    question: str | None = None
    question_used: bool = False
    scores: torch.Tensor | None = None

    @property
    def budget(self) -> int:
        return self.tokens.budget

    def view_uint8(self) -> np.ndarray:
        """The reconstruction as an ``[H, W, C]`` uint8 array (``C`` = 1 or 3), for saving."""
        v = (self.view.clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        return v[..., 0] if v.shape[-1] == 1 else v

    def to_json(self) -> dict:
        """A JSON-ready dict: the method, its options, the question, the costs and one entry
        per token (``x, y`` in [0, 1]; ``cx, cy`` and ``side`` in base pixels; ``level``;
        ``score``; ``stage``, ``None`` when the method has no stages)."""
        t = self.tokens
        xy = t.centers[0].tolist()
        cpx = t.centers_px()[0].tolist()
        side = t.footprint()[0].tolist()
        stage = t.stage[0].tolist() if t.stage is not None else [None] * t.budget
        cols = zip(xy, cpx, t.levels[0].tolist(), side, t.scores[0].tolist(), stage)
        toks = [dict(x=a[0], y=a[1], cx=b[0], cy=b[1], level=lv, side=s, score=sc, stage=st)
                for a, b, lv, s, sc, st in cols]
        return dict(method=self.method, options={k: _jsonable(v) for k, v in self.options.items()},
                    question=self.question, question_used=self.question_used,
                    image_size=list(t.image_size), patch=t.patch, budget=t.budget,
                    cost=self.cost.as_dict(), fixations=t.fixations[0].tolist(), tokens=toks)


def _jsonable(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return repr(v)


# ----------------------------------------------------------------------------- images
def _pil_to_array(img) -> np.ndarray:
    """A PIL image as ``[H, W]`` (grey) or ``[H, W, 3]`` uint8/float: transparency is
    composited over white, palettes expanded, 16/32-bit grey scaled to [0, 1]."""
    from PIL import Image

    if img.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        arr = np.array(img, dtype=np.float64)
        top = 65535.0 if img.mode.startswith("I;16") or arr.max() > 255 else 255.0
        return np.clip(arr / top, 0, 1).astype(np.float32)
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        rgba = img.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.array(Image.alpha_composite(white, rgba).convert("RGB"))
    if img.mode in ("L", "1"):
        return np.array(img.convert("L"))
    return np.array(img.convert("RGB"))


def load_image(image: Any) -> torch.Tensor:
    """One page as ``[1, C, H, W]`` float32 in ``[0, 1]`` (``C`` = 1 or 3).

    ``image``: a path (``str`` or :class:`~pathlib.Path`) of an image file PIL reads, a PIL
    image, a numpy array ``[H, W]`` / ``[H, W, C]`` (uint8 or float in [0, 1]) or a torch
    tensor ``[C, H, W]`` / ``[1, C, H, W]`` (see :func:`fovea_core.as_image_batch`). A path
    and the PIL image read from it give the same tensor; transparency is composited over
    white.

    Raises:
        FileNotFoundError: the path does not exist.
        ValueError: (message starts with ``image``) a folder, a file PIL cannot read, a batch
            of more than one image, or an array :func:`~fovea_core.as_image_batch` rejects.
        TypeError: any other type.
    """
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - pillow is a dependency
        Image = None
    if isinstance(image, (str, Path)):
        path = Path(image)
        if not path.exists():
            raise FileNotFoundError(f"image: no such file: {path}")
        if path.is_dir():
            raise ValueError(f"image: {path} is a folder; pass one image file "
                             "(the command `python -m fovea_core foveate` runs over folders)")
        try:
            with Image.open(path) as img:
                img.load()
                arr = _pil_to_array(img)
        except (OSError, ValueError, SyntaxError) as err:  # PIL's unreadable/truncated files
            raise ValueError(f"image: {path} is not a readable image "
                             f"({type(err).__name__}: {err})") from None
    elif Image is not None and isinstance(image, Image.Image):
        arr = _pil_to_array(image)
    elif isinstance(image, (np.ndarray, torch.Tensor)):
        arr = image
    else:
        raise TypeError("image must be a path (str or Path), a PIL image, a numpy array "
                        f"[H, W(, C)] or a torch tensor [C, H, W]; got {type(image).__name__}")
    if isinstance(arr, np.ndarray) and not arr.flags.writeable:
        arr = arr.copy()                     # torch.from_numpy warns on read-only arrays
    x = as_image_batch(arr)
    if x.shape[0] != 1:
        raise ValueError(f"image: one page at a time, got a batch of {x.shape[0]} "
                         "(call foveate per page)")
    if x.shape[1] not in (1, 3):
        raise ValueError(f"image: the scorers and the cascade need 1 or 3 channels, got "
                         f"{x.shape[1]}")
    return x


# ----------------------------------------------------------------------------- methods
def _registry() -> tuple[dict, dict]:
    """``(ALLOCATORS, INFO)`` with every method registered, the cascade's included (it
    registers itself when :mod:`fovea_core.cascade` is imported)."""
    import fovea_core.cascade  # noqa: F401  (registers "cascade", "cascade_gist_query", ...)
    from fovea_core.allocators import ALLOCATORS, INFO

    return ALLOCATORS, INFO


def method_names() -> list[str]:
    """Every method :func:`foveate` runs: the registered allocators that return exactly N
    tokens for one page (kind ``"fixed"``), sorted, the default first."""
    _, INFO = _registry()

    names = sorted(n for n, info in INFO.items() if info["kind"] == "fixed")
    return [DEFAULT_METHOD] + [n for n in names if n != DEFAULT_METHOD]


def method_summary(name: str, width: int = 100) -> str:
    """One line on a method for ``--help``: the first sentence of the registered allocator's
    docstring (reST roles and literals stripped, at most ``width`` characters), plus the
    localiser a registered cascade variant binds."""
    import re

    ALLOCATORS, _ = _registry()

    fn = ALLOCATORS[name]
    try:                            # a registered variant: its function's doc + what it binds
        free = inspect.getclosurevars(fn).nonlocals
    except TypeError:
        free = {}
    bound = free.get("defaults") if isinstance(free.get("defaults"), Mapping) else {}
    bound = bound or _cascade_defaults(name)
    inner = free.get("fn") if callable(free.get("fn")) else fn
    doc = inspect.getdoc(inner) or inspect.getdoc(fn) or ""
    para = " ".join(doc.strip().split("\n\n")[0].split()) or "(no description)"
    para = re.sub(r":\w+:`~?([^`]+)`", r"\1", para).replace("``", "")
    m = re.search(r"(?<=\.)\s", para)
    line = para[:m.start()] if m else para
    if bound:
        line = f"{line.rstrip('.')} ({', '.join(f'{k}={v}' for k, v in bound.items())})."
    return line if len(line) <= width else line[:width - 3].rstrip() + "..."


def check_method(method: str) -> None:
    """Raise ``ValueError`` listing the accepted names if ``method`` is not one of them."""
    _, INFO = _registry()

    if not isinstance(method, str) or method not in INFO:
        raise ValueError(f"unknown method {method!r}; registered: {', '.join(method_names())}")
    if INFO[method]["kind"] != "fixed":
        raise ValueError(f"method {method!r} (kind {INFO[method]['kind']!r}) does not return N "
                         "tokens for one page; choose one of: " + ", ".join(method_names()))


def _cascade_defaults(method: str) -> dict:
    """The keywords a registered cascade variant binds
    (:data:`~fovea_core.cascade.allocator.REGISTERED`; ``{}``: not a registered cascade)."""
    _, INFO = _registry()
    if INFO[method]["family"] != "cascade":
        return {}
    from fovea_core.cascade.allocator import REGISTERED

    return dict(REGISTERED.get(method, {}))


def _default_localiser(method: str) -> Any:
    """The localiser a registered cascade variant binds (``None``: not a bound variant)."""
    return _cascade_defaults(method).get("localiser")


def _scorer_for(method: str, question: str | None, options: Mapping) -> str:
    _, INFO = _registry()

    if not INFO[method]["uses_scores"]:
        return "none"
    return options.get("scorer") or ("query_saliency" if question else "saliency")


def _query_scorers() -> tuple[str, ...]:
    """Scorers whose map depends on the question (:data:`fovea_core.importance.PAGE_PARTS`:
    per-question maps of an OCR read of the page)."""
    from fovea_core.importance import PAGE_PARTS

    return tuple(PAGE_PARTS)


def uses_question(method: str, **options: Any) -> bool:
    """Whether ``method`` (with ``options``) reads a question: a score-map method through a
    query-aware scorer (``scorer=``, default ``"query_saliency"`` when a question is given),
    a cascade through a localiser that reads it (every localiser but ``"learned_prior"``
    and ``"uniform"``); ``resize``, ``full`` and the other methods that ignore the map never."""
    _, INFO = _registry()

    check_method(method)
    info = INFO[method]
    if info["uses_scores"]:
        return _scorer_for(method, "?", options) in _query_scorers()
    if info["family"] == "cascade":
        loc = options.get("localiser", _default_localiser(method) or "learned")
        return callable(loc) or loc not in _QUESTION_BLIND_LOCALISERS
    return False


# ----------------------------------------------------------------------------- cost
def _cost(method: str, scorer: str, pyramid, budget: int, side_ms: float,
          side_cost=None) -> Cost:
    """The cost record, with the evaluator's rules: the scorer's reads count only for a
    method that ranks the map (``uses_scores``); what is read outside N is side compute for
    a method registered so (``side_compute``), else unbudgeted when it exceeds N. ``side``:
    the cascade side channel's :class:`~fovea_core.cascade.side.SideCost` (its FLOPs and
    milliseconds), if any."""
    from fovea_core.eval.evaluator import (alloc_read_tokens, scorer_tokens, side_compute,
                                           uses_scores)
    from fovea_core.allocators.registry import allocator_reads
    from fovea_core.importance import READS

    h, w = pyramid.image_size
    used = uses_scores(method)
    s_tok = scorer_tokens(scorer, (h, w)) if used else 0.0
    a_tok = alloc_read_tokens(method, pyramid)
    extra = s_tok + a_tok
    side_px = (int(READS[scorer](h, w)) if used else 0) + int(allocator_reads(method, pyramid))
    reads_text = used and scorer in _query_scorers()
    side = side_compute(method)
    unbudgeted = (not side and (bool(extra > budget) if math.isfinite(extra) else True))
    label = ("unbudgeted" if unbudgeted or reads_text else       # the evaluator's rule
             "side compute" if extra > 0 else "budgeted")
    return Cost(tokens=int(budget), scorer=scorer, scorer_tokens=float(s_tok),
                alloc_read_tokens=float(a_tok), total_tokens=float(budget + extra),
                side_pixels=side_px,
                side_ms=float(side_cost.cpu_ms if side_cost is not None else
                              side_ms if used and s_tok > 0 else 0.0),
                side_flops=None if side_cost is None else float(side_cost.flops),
                reads_text=bool(reads_text), label=label)


# ----------------------------------------------------------------------------- foveate
def _accepted_options(method: str) -> list[str]:
    """Keyword options the registered allocator's function names (for error messages)."""
    ALLOCATORS, INFO = _registry()

    fn = ALLOCATORS[method]
    if INFO[method]["family"] == "cascade":          # its registered wrapper takes **kw
        from fovea_core.cascade.allocator import cascade as fn
    else:                                            # a registered variant wraps its function
        fn = inspect.getclosurevars(fn).nonlocals.get("fn", fn)
    params = inspect.signature(fn).parameters
    skip = {"pyramid", "scores", "budget", "query", "kw", "kwargs", "params"}
    return sorted(k for k, p in params.items() if k not in skip
                  and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))


def foveate(image: Any, question: str | None = None, *, budget: int | None = 273,
            method: str = DEFAULT_METHOD, **method_options: Any) -> Foveation:
    """Foveate one page: exactly ``budget`` tokens, their patches, the view and the cost.

    Args:
        image: a path, a PIL image, a numpy array or a torch tensor (:func:`load_image`).
        question: the question about the page, or ``None``. Methods that read it: the
            cascade (its learned localiser embeds it) and the score-map methods with a
            query-aware scorer (default ``query_saliency`` when a question is given: an OCR
            outside the budget, labelled unbudgeted). A method that ignores it says so once
            (a :class:`FoveateWarning`).
        budget: N, an int in ``[1, Gh * Gw]`` (``Gh = ceil(H / patch)``); ``None``: every
            level-0 patch (``Gh * Gw``; the only budget ``method="full"`` accepts).
        method: a name of :func:`method_names` (``"cascade"``, ``"resize"``, ``"topk"``,
            ...); see ``python -m fovea_core foveate --help`` for one line on each.
        **method_options: ``scorer=`` (a :data:`fovea_core.importance.SCORERS` name, for
            methods that rank a score map), ``patch=`` (default 16), ``seed=``,
            ``fixation=(x, y)``, and the allocator's own keywords (e.g. ``gist_budget=`` or
            ``localiser=`` for the cascade, ``strata=`` for ``stratified``).

    Returns:
        A :class:`Foveation` (tokens ``[1, N]``, patches ``[1, N, C, p, p]``, view
        ``[C, H, W]``, cost).

    Raises:
        FileNotFoundError, TypeError, ValueError: a missing or unreadable image, an unknown
        method (the message lists the registered ones), a budget outside the page's range, an
        option the method does not take; each message names the argument.
    """
    from fovea_core.allocators import allocate

    _, INFO = _registry()
    from fovea_core.importance import SCORERS, score
    from fovea_core.sample import render, sample

    check_method(method)
    if question is not None and (not isinstance(question, str) or not question.strip()):
        raise ValueError(f"question must be a non-empty string or None, got {question!r}")
    opts = dict(method_options)
    patch = opts.pop("patch", 16)
    if isinstance(patch, bool) or not isinstance(patch, int) or patch < 1:
        raise ValueError(f"patch must be an int >= 1, got {patch!r}")
    scorer = opts.pop("scorer", None)
    if scorer is not None and not INFO[method]["uses_scores"] and scorer != "none":
        raise ValueError(f"method {method!r} reads no score map, so scorer={scorer!r} would have "
                         "no effect; leave scorer out (or pick a method that ranks a map)")
    if scorer is not None and scorer not in SCORERS:
        raise ValueError(f"unknown scorer {scorer!r}; choose one of {sorted(SCORERS)}")
    scorer = _scorer_for(method, question, {"scorer": scorer})
    if scorer in _query_scorers() and question is None:
        raise ValueError(f"scorer {scorer!r} is query-aware: pass a question (or another scorer)")
    q_used = question is not None and uses_question(method, scorer=scorer, **opts)
    if question is not None and not q_used:
        warnings.warn(f"method {method!r} does not read the question (it is ignored)",
                      FoveateWarning, stacklevel=2)

    x = load_image(image)
    _, _, h, w = x.shape
    gh, gw = math.ceil(h / patch), math.ceil(w / patch)
    if budget is None:
        budget = gh * gw
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)):
        raise ValueError(f"budget must be an int in [1, {gh * gw}] or None, got {budget!r}")
    budget = int(budget)
    if not 1 <= budget <= gh * gw:
        raise ValueError(f"budget must be in [1, {gh * gw}] for this {h}x{w} page "
                         f"({gh}x{gw} patches of {patch} px), got {budget}")
    if method == "full" and budget != gh * gw:
        raise ValueError(f"method 'full' keeps every patch: budget must be {gh * gw} for this "
                         f"{h}x{w} page (or None), got {budget}")

    pyr = build_pyramid(x, patch=patch)
    t0 = time.perf_counter()
    scores = score(scorer, pyr.base, query=question if scorer in _query_scorers() else None,
                   patch=patch)
    side_ms = (time.perf_counter() - t0) * 1e3
    call = dict(opts, patch=patch)
    if question is not None and q_used:
        call["query"] = question
    side = None                         # a cascade's side cost, from the run that allocated
    try:
        if INFO[method]["family"] == "cascade":
            from fovea_core.cascade.allocator import registered_parts

            parts = registered_parts(method, pyr, scores, budget, **call)
            tokens, side = parts.tokens, parts.side
        else:
            tokens = allocate(method, pyr, scores, budget, **call)
    except TypeError as err:
        if "unexpected keyword argument" not in str(err):
            raise
        bad = sorted(set(opts) - set(_accepted_options(method)))
        raise ValueError(f"method {method!r} does not take option(s) {bad or list(opts)}; it "
                         f"takes: {', '.join(_accepted_options(method))}") from None
    except ValueError as err:
        msg = str(err)
        raise ValueError(msg if msg.startswith(method) else f"{method}: {msg}") from None
    if not isinstance(tokens, TokenSet) or tokens.budget != budget:
        got = tokens.budget if isinstance(tokens, TokenSet) else type(tokens).__name__
        raise ValueError(f"method {method!r} with options {opts} returned {got} tokens, not "
                         f"budget = {budget} (e.g. multi_fixation's mode='per_fixation'); "
                         "foveate needs exactly N")
    patches = sample(pyr, tokens)
    view = render(tokens, patches, background=pyr)[0].clamp(0, 1)
    cost = _cost(method, scorer, pyr, budget, side_ms, side)
    return Foveation(tokens=tokens, patches=patches, view=view, cost=cost, method=method,
                     options=dict(opts, patch=patch, **({"scorer": scorer}
                                                        if scorer != "none" else {})),
                     question=question, question_used=q_used,
                     scores=scores if INFO[method]["uses_scores"] else None)


# ----------------------------------------------------------------------------- figure
def plot_foveation(f: Foveation, image: Any, *, title: str | None = None, width: float = 4.0):
    """A figure of the page with the tokens by level (:func:`fovea_core.plotting.overlay_tokens`),
    by stage (when the method has stages, e.g. the cascade's gist and fovea) and the view.

    ``image`` is the page (anything :func:`load_image` takes). Returns a
    :class:`matplotlib.figure.Figure` drawn without pyplot (safe in worker processes).
    """
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from fovea_core.plotting import _show_image, box_vertices, overlay_tokens, to_display

    x = image if isinstance(image, torch.Tensor) and image.ndim == 4 else load_image(image)
    t = f.tokens
    staged = t.stage is not None and int(t.stage.unique().numel()) > 1
    n = 3 if staged else 2
    h, w = t.image_size
    fig = Figure(figsize=(width * n, width * h / w + 0.8), layout="constrained")
    axes = fig.subplots(1, n, squeeze=False)[0]
    overlay_tokens(axes[0], x, t, show_centers=t.budget <= 400)
    axes[0].set_title(f"{t.budget} tokens by level")
    if staged:
        _show_image(axes[1], to_display(x))
        verts = box_vertices(t.boxes()[0].numpy())
        stage = t.stage[0].numpy()
        colors = ("tab:blue", "tab:red", "tab:green", "tab:orange", "tab:purple")
        handles = []
        for k, s in enumerate(np.unique(stage)):                 # few stages, not tokens
            sel = stage == s
            c = colors[k % len(colors)]
            axes[1].add_collection(PolyCollection(verts[sel], facecolors="none",
                                                  edgecolors=[c], linewidth=0.6))
            name = {0: "gist", 1: "fovea"}.get(int(s), f"stage {int(s)}") \
                if f.method.startswith("cascade") else f"stage {int(s)}"
            handles.append(Patch(facecolor="none", edgecolor=c, label=f"{name}: {int(sel.sum())}"))
        axes[1].legend(handles=handles, loc="upper right", fontsize="small", framealpha=0.8)
        axes[1].set_xlim(0, w)
        axes[1].set_ylim(h, 0)
        axes[1].set_title("tokens by stage")
    _show_image(axes[-1], to_display(f.view[None]))
    axes[-1].set_title(f"what the model sees ({f.cost.label})")
    q = f" | {f.question}" if f.question else ""
    fig.suptitle(title or f"{f.method}, N = {t.budget}{q}", fontsize="medium")
    return fig


# ----------------------------------------------------------------------------- files
#: the files :func:`save_foveation` writes per page, as suffixes of the page's stem
OUTPUT_SUFFIXES = {"view": ".foveated.png", "figure": ".tokens.png", "json": ".foveation.json"}


def save_foveation(f: Foveation, image: Any, out_dir: str | Path, stem: str, *,
                   source: str | None = None, dpi: int = 110) -> dict[str, Path]:
    """Write one page's reconstruction (PNG), its token figure (:func:`plot_foveation`, PNG)
    and its JSON (:meth:`Foveation.to_json` plus ``source``) into ``out_dir`` as
    ``<stem>`` + :data:`OUTPUT_SUFFIXES`.

    All or nothing: each file is written under a temporary name and renamed at the end; if
    any step fails, the temporary files are removed and no file of the page appears.
    Returns ``{"view" | "figure" | "json": path}``.
    """
    import json
    import os

    from PIL import Image

    out_dir = Path(out_dir)
    final = {k: out_dir / f"{stem}{suf}" for k, suf in OUTPUT_SUFFIXES.items()}
    tmp = {k: p.with_name(f".{p.name}.tmp{os.getpid()}") for k, p in final.items()}
    try:
        Image.fromarray(f.view_uint8()).save(tmp["view"], format="PNG")
        fig = plot_foveation(f, image)
        fig.savefig(tmp["figure"], format="png", dpi=dpi)
        record = dict(f.to_json(), source=source)
        tokens = record.pop("tokens")                   # one line per token, the rest indented
        head = json.dumps(record, indent=1)[:-2]
        body = ",\n  ".join(json.dumps(t) for t in tokens)
        tmp["json"].write_text(f'{head},\n "tokens": [\n  {body}\n ]\n}}\n')
        for k in ("view", "figure", "json"):            # the JSON last: it marks a whole page
            os.replace(tmp[k], final[k])
    except BaseException:
        for p in tmp.values():
            p.unlink(missing_ok=True)
        raise
    return final


def _one_line(err: BaseException) -> str:
    msg = str(err).strip().splitlines()
    return f"{type(err).__name__}: {msg[0] if msg else ''}".rstrip(": ")


def worker_init() -> None:
    """Initialiser of the command's worker processes: one torch thread each (the pool has
    one process per core)."""
    torch.set_num_threads(1)


def run_page(job: Mapping) -> dict:
    """Foveate one file and save it (the command's unit of work; picklable for a process
    pool). ``job``: ``path, stem, out_dir, question, budget, method, options``. Returns
    ``{"path", "status": "done" | "skipped" | "failed", "message", "seconds"}``: *skipped*
    when the file is not a readable image, *failed* when foveating or writing it raised
    (the message is the error's first line; no file of the page is left behind)."""
    t0 = time.perf_counter()
    out = dict(path=str(job["path"]), status="done", message="", seconds=0.0)
    try:
        x = load_image(job["path"])
    except (ValueError, FileNotFoundError, TypeError) as err:
        out.update(status="skipped", message=_one_line(err))
    else:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FoveateWarning)   # the command says it once
                f = foveate(x, job.get("question"), budget=job.get("budget"),
                            method=job["method"], **dict(job.get("options") or {}))
                save_foveation(f, x, job["out_dir"], job["stem"], source=str(job["path"]))
            out["message"] = (f"{f.budget} tokens, {f.cost.label}, "
                              f"{f.cost.total_tokens:g} tokens in all")
        except Exception as err:  # noqa: BLE001 - one line per page, never a traceback
            out.update(status="failed", message=_one_line(err))
    out["seconds"] = time.perf_counter() - t0
    return out


class _CallableModule(types.ModuleType):
    """This module, callable as :func:`foveate`: ``fovea_core.foveate`` names both the
    function (exported by the package) and this submodule, and Python's import system binds
    the package attribute to the submodule whenever ``fovea_core.foveate.<name>`` is
    imported; either way ``fovea_core.foveate(image, ...)`` runs :func:`foveate`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Foveation:
        return foveate(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
