"""A foveated drop-in for a ``transformers`` Qwen2-VL / Qwen2.5-VL / Qwen3-VL processor.

:class:`FoveatedProcessor` wraps the model's own processor. One call takes a page and a
prompt and returns what ``model.generate(**inputs)`` (or ``model(**inputs)``) needs::

    page --stock resize (smart_resize, the processor's min/max pixels)--> [1, 3, Hr, Wr]
         --fovea_core.foveate(budget=N, method, patch = merged cell = 2 * ViT patch)-->
           TokenSet [1, N] + patches [1, N, 3, 2p, 2p]   (each token sampled at its level)
    patches, in raster order of their merged cells --pixel_values--> [4N, 3 * 2 * p * p]
    prompt with the image placeholder repeated N times --tokenizer--> input_ids [1, S]
    TokenSet --mrope_positions--> position_ids [3, 1, S]       (chapter 15's rule)

**The vision tower sees only the N tokens.** Each token's patch (a ``2p x 2p`` pixel
square sampled from its mip level, so a peripheral token covers more of the page at the
same pixel count) is one 2 x 2 merge block; ``image_grid_thw`` lists it as an image of its
own (``[1, 2, 2]`` per token), so the vision tower runs on ``4N`` patches instead of the
page's full grid and returns exactly N merged tokens. Where the budget keeps every
merged cell at level 0 (``method="full"`` or ``budget=None``), the grid is the page's
``[1, 2 Hm, 2 Wm]`` and every output equals the stock processor's (input ids, pixel values,
grid, M-RoPE positions; tested). For fewer tokens the vision tower's own attention stays
inside each token: its 2-D RoPE has no slot for a token's place on the page, which the
language model receives through M-RoPE instead. (Chapter 15's other path, the vision tower
on the full grid and each token pooled from its footprint, needs the model itself:
:func:`fovea_book.qwen_pooled.foveated_inputs`.)

**How generate receives the positions.** ``transformers`` 5.x ``generate`` takes
``position_ids`` as a model keyword: a given ``[3, B, S]`` tensor is used for the prefill
as is (the model then skips its own ``get_rope_index``, which cannot describe a set of
tokens that is not a full grid) and extended by ``last + 1`` per generated token. The
prompt always ends with text (at least the vision-end token), whose three ids are equal,
so the extension equals the stock model's ``rope_deltas`` rule. A transformers whose
``generate`` does not accept ``position_ids`` for these models (4.x before the
``_prepare_position_ids_for_generation`` hook) would recompute them; this module is tested
on the installed 5.x only.

**Two fixations** (:meth:`FoveatedProcessor.two_fixations`, its four steps): the N tokens in
two looks, the second where the model itself says the answer is (its cost:
:class:`FixationCounts`).

*Box conventions.* Qwen2.5-VL grounds in absolute pixels of its input image, i.e. of the
page as ``smart_resize`` (here :meth:`~FoveatedProcessor.resized_page`) made it: its report
(Bai et al. 2025, arXiv 2502.13923, sec. 2.2.1) trains boxes in "coordinate values based on
the actual dimensions of the input images". Qwen3-VL grounds in coordinates relative to the
image, 0..1000: the Qwen3-VL cookbook (github.com/QwenLM/Qwen3-VL,
``cookbooks/2d_grounding.ipynb``) states that its default coordinate system "has been
changed from the absolute coordinates used in Qwen2.5-VL to relative coordinates ranging
from 0 to 1000" and converts with ``x / 1000 * width``, as done here (Alibaba Cloud's API
docs say 0..999: 0.1 % apart). Qwen2-VL, like Qwen-VL, writes
``<|box_start|>(x1,y1),(x2,y2)<|box_end|>`` in thousandths of the image as well (Qwen-VL's
README; ms-swift's grounding docs say the same of Qwen2-VL). :data:`GROUNDING_COORDS` holds
the choice per family; the parser reads every form (that one, JSON ``bbox_2d``, bare lists,
corner pairs) for every family, and only the scale follows the family. Not checked here
against a pretrained checkpoint (none can be downloaded): the random-weight tests
(``tests/test_vlm_two_fixations.py``) cover the mechanics, not whether the box is right.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from fovea_core.allocators.base import DEFAULT_BUDGET
from fovea_core.cascade.core import (LEVEL_TOLERANCE, SEEN_WEIGHT, STAGE_GIST, STAGE_SECOND,
                                     combine, discount_seen, select_tokens)
from fovea_core.foveation import DEFAULT_METHOD
from fovea_core.tokens import TokenSet
from fovea_core.vlm.positions import (QWEN_MERGE, QWEN_PATCH, merged_cell_px, merged_cells,
                                      merged_grid_shape, mrope_positions)
from fovea_core.vlm.qwen import PIXEL_NORM, family_of, pixel_values

__all__ = ["GROUNDING_FIRST_SHARE", "FROM_TEXT", "GROUNDING_COORDS", "GROUNDING_PROMPTS",
           "SUPPORTED_PROCESSORS", "FixationCounts", "FoveatedProcessor", "GroundingBox",
           "SecondFixationMap", "TwoFixations", "offline_tokenizer", "parse_grounding_box",
           "processor_family", "stock_processor"]

#: family -> the ``transformers`` processor class it wraps
SUPPORTED_PROCESSORS = {"qwen2-vl": "Qwen2VLProcessor", "qwen2.5-vl": "Qwen2_5_VLProcessor",
                        "qwen3-vl": "Qwen3VLProcessor"}

#: where each family's grounding replies put a box (module docstring, "Two fixations"):
#: ``"absolute"``, pixels of the resized input image (Qwen2.5-VL); ``"relative-1000"``,
#: thousandths of its width and height (Qwen2-VL, Qwen3-VL)
GROUNDING_COORDS = {"qwen2-vl": "relative-1000", "qwen2.5-vl": "absolute",
                    "qwen3-vl": "relative-1000"}
_JSON_PROMPT = ('Locate the text on this page that answers the question "{question}". '
                'Output its bounding box in JSON format: {"bbox_2d": [x1, y1, x2, y2]}.')
#: the grounding prompt per family (``{question}`` is replaced): Qwen2.5-VL and Qwen3-VL are
#: asked for the JSON ``bbox_2d`` form of their cookbooks, Qwen2-VL with its referring tokens
#: (it answers ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>``). Defaults, not tuned.
GROUNDING_PROMPTS = {
    "qwen2-vl": ('Find <|object_ref_start|>the text that answers the question "{question}"'
                 '<|object_ref_end|> and give its bounding box.'),
    "qwen2.5-vl": _JSON_PROMPT,
    "qwen3-vl": _JSON_PROMPT,
}
#: :meth:`FoveatedProcessor.two_fixations`' default share of N for fixation 1, the look the
#: model grounds its box on: half (a default, not tuned: no pretrained checkpoint can be run
#: here). Not the read-then-look cascade's fitted share,
#: :data:`fovea_core.cascade.reading.FIRST_SHARE`, which splits N around an OCR's reading
GROUNDING_FIRST_SHARE = 0.5
#: a box's smallest side in pixels of the resized page (smaller: degenerate)
MIN_BOX_PX = 1.0


class _FromText:
    """Type of :data:`FROM_TEXT`."""

    def __repr__(self) -> str:
        return "FROM_TEXT"


#: default of ``FoveatedProcessor.__call__(question=)``: the prompt is the question when it
#: holds no image placeholder, else there is none
FROM_TEXT = _FromText()


def _processor_classes() -> dict[str, type]:
    """Installed processor classes by family (one the installed transformers lacks is left out)."""
    import transformers

    out = {}
    for fam, name in SUPPORTED_PROCESSORS.items():
        try:
            out[fam] = getattr(transformers, name)
        except (AttributeError, ImportError):
            pass
    return out


def _supported_text() -> str:
    have = _processor_classes()
    return ", ".join(f"{name} ({fam}{'' if fam in have else ', not in this transformers'})"
                     for fam, name in SUPPORTED_PROCESSORS.items())


def processor_family(processor: Any) -> str:
    """``"qwen2-vl"``, ``"qwen2.5-vl"`` or ``"qwen3-vl"`` of a ``transformers`` processor.

    Raises:
        ValueError: ``processor`` is not one of :data:`SUPPORTED_PROCESSORS` (the message
            lists them).
    """
    # the most derived class first, should a later transformers derive one family's from another's
    for fam, cls in sorted(_processor_classes().items(), key=lambda kv: -len(kv[1].__mro__)):
        if isinstance(processor, cls):
            return fam
    raise ValueError(f"processor: a {type(processor).__name__} is not supported; "
                     f"FoveatedProcessor wraps one of {_supported_text()}")


def offline_tokenizer(config: Any):
    """A character-level tokenizer for random-weight Qwen-VL configs (the book's
    :mod:`fovea_book.qwen_models`).

    No tokenizer can be downloaded here, so tests and chapter 15 build one: printable ASCII
    (code ``c`` -> id ``c - 29``, ids 3..97), ``<unk>`` = 0 and Qwen's special tokens
    (``<|image_pad|>``, ``<|video_pad|>``, ``<|vision_start|>``, ``<|vision_end|>``,
    ``<|endoftext|>``) at the ids of ``config`` (a Qwen-VL config or model). Meaningless
    for a pretrained checkpoint: use its own tokenizer there.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    cfg = getattr(config, "config", config)
    family_of(cfg)                                             # raises for a non-Qwen-VL config
    specials = {"<|image_pad|>": cfg.image_token_id, "<|video_pad|>": cfg.video_token_id,
                "<|vision_start|>": cfg.vision_start_token_id,
                "<|vision_end|>": cfg.vision_end_token_id,
                "<|endoftext|>": cfg.text_config.eos_token_id}
    vocab = {"<unk>": 0, **{chr(c): c - 29 for c in range(32, 127)}}
    clash = sorted(set(vocab.values()) & set(specials.values()))
    if clash or max(specials.values()) >= cfg.text_config.vocab_size:
        raise ValueError(f"config: its special-token ids {specials} clash with the character "
                         f"ids 0..97 or exceed vocab_size {cfg.text_config.vocab_size}")
    vocab.update(specials)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()                              # decode joins the characters
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                   eos_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": list(specials)})
    return fast


def stock_processor(config_or_model: Any, tokenizer: Any = None):
    """The family's unmodified ``transformers`` processor for a Qwen-VL config or model.

    Image processor: ``Qwen2VLImageProcessorPil`` (the PIL one; the torchvision one is not
    needed) with the family's patch size and normalisation and transformers' default
    min / max pixels. Tokenizer: ``tokenizer`` or, if ``None``, :func:`offline_tokenizer`.
    The video processor is left out (``None``; images only), which the processor's
    constructor would otherwise refuse without torchvision.
    """
    from transformers import Qwen2VLImageProcessorPil

    _check_config_or_model(config_or_model)
    try:
        family = family_of(config_or_model)
    except ValueError as err:
        raise ValueError(f"config_or_model: {err}; supported: {_supported_text()}") from None
    classes = _processor_classes()
    if family not in classes:
        raise ValueError(f"config_or_model: this transformers has no "
                         f"{SUPPORTED_PROCESSORS[family]}")
    mean, std = PIXEL_NORM[family]
    image_processor = Qwen2VLImageProcessorPil(patch_size=QWEN_PATCH[family],
                                               merge_size=QWEN_MERGE, temporal_patch_size=2,
                                               image_mean=list(mean), image_std=list(std))
    tok = tokenizer if tokenizer is not None else offline_tokenizer(config_or_model)
    return _images_only(classes[family])(image_processor=image_processor, tokenizer=tok,
                                         video_processor=None)


def _check_config_or_model(config_or_model: Any) -> None:
    """``TypeError`` naming the argument unless it is a config (``model_type``) or a model
    holding one (``.config.model_type``): e.g. a model's name passed as a string."""
    cfg = getattr(config_or_model, "config", config_or_model)
    if not isinstance(getattr(cfg, "model_type", None), str):
        raise TypeError(
            "config_or_model must be a Qwen-VL config or model (a transformers "
            "Qwen2VLConfig / ...ForConditionalGeneration, e.g. "
            "the book's fovea_book.qwen_models.build_qwen('qwen2-vl-tiny')), got "
            f"{type(config_or_model).__name__} {config_or_model!r:.60}; for a checkpoint's "
            "name, wrap its processor: FoveatedProcessor(AutoProcessor.from_pretrained(name))")


def _check_model(model: Any, family: str) -> None:
    """``model`` can answer for this processor: it has ``generate`` (``TypeError`` naming
    ``model`` otherwise, e.g. ``None``) and, where it carries a config, it is of the
    processor's family (``ValueError``: a Qwen2.5-VL model with a Qwen2-VL processor would
    get another patch size and read its boxes in the wrong coordinates)."""
    if model is None or not callable(getattr(model, "generate", None)):
        raise TypeError(f"model must be a Qwen-VL ...ForConditionalGeneration of this "
                        f"processor's family ({family}), with generate(); got "
                        f"{type(model).__name__}")
    cfg = getattr(model, "config", None)
    if isinstance(getattr(cfg, "model_type", None), str):
        try:
            got = family_of(cfg)
        except ValueError as err:
            raise ValueError(f"model: {err}; two_fixations needs a {family} model") from None
        if got != family:
            raise ValueError(f"model: a {got} model with a {family} processor (its patch size, "
                             f"normalisation and box coordinates, {GROUNDING_COORDS[family]}, "
                             f"are {family}'s); wrap the model's own processor: "
                             f"FoveatedProcessor.from_model(model)")


def _images_only(cls: type) -> type:
    """``cls`` accepting ``video_processor=None`` (images only)."""

    class ImagesOnly(cls):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = cls.__name__
    return ImagesOnly


class FoveatedProcessor:
    """A Qwen-VL processor whose call returns the inputs of a foveated page (module docstring).

    Args:
        processor: a ``transformers`` ``Qwen2VLProcessor``, ``Qwen2_5_VLProcessor`` or
            ``Qwen3VLProcessor`` (e.g. ``AutoProcessor.from_pretrained(...)``, or
            :func:`stock_processor`). Its image processor must keep Qwen's patch and merge
            sizes and the family's normalisation.
        localiser: the localiser that replaces the committed learned one in every cascade
            that would use it, unless a call names its own: a path to weights written by
            :func:`fovea_core.adapt` (a ``.pt`` file, its record beside it, verified here),
            a localiser's name, or ``None`` (the committed weights).

    Example::

        fp = FoveatedProcessor(AutoProcessor.from_pretrained("Qwen/Qwen2-VL-2B-Instruct"))
        inputs = fp("page.png", "What is the total?", budget=273)
        out = model.generate(**inputs, max_new_tokens=32)
        inputs.foveation        # the fovea_core.Foveation: tokens, patches, view, cost
    """

    def __init__(self, processor: Any, *, localiser: Any = None):
        if localiser is not None:
            from fovea_core.cascade.localisers import get_localiser

            get_localiser(localiser)              # a missing or unvouched file: ValueError now
        self.localiser = localiser
        self.family = processor_family(processor)
        self.processor = processor
        ip = processor.image_processor
        want = {"patch_size": QWEN_PATCH[self.family], "merge_size": QWEN_MERGE,
                "temporal_patch_size": 2}
        got = {k: getattr(ip, k, None) for k in want}
        if got != want:
            raise ValueError(f"processor: its image processor has {got}; FoveatedProcessor needs "
                             f"the {self.family} sizes {want}")
        mean, std = PIXEL_NORM[self.family]
        if not (torch.allclose(torch.tensor(list(ip.image_mean), dtype=torch.float64),
                               torch.tensor(mean, dtype=torch.float64))
                and torch.allclose(torch.tensor(list(ip.image_std), dtype=torch.float64),
                                   torch.tensor(std, dtype=torch.float64))):
            raise ValueError(f"processor: image_mean / image_std {ip.image_mean} / "
                             f"{ip.image_std} differ from the {self.family} normalisation "
                             f"{mean} / {std}")
        self.image_token = processor.image_token
        self.image_token_id = int(processor.image_token_id)
        self.vision_start = getattr(processor, "vision_start_token", "<|vision_start|>")
        self.vision_end = getattr(processor, "vision_end_token", "<|vision_end|>")

    @classmethod
    def from_model(cls, config_or_model: Any, tokenizer: Any = None, *,
                   localiser: Any = None) -> FoveatedProcessor:
        """Wrap :func:`stock_processor` of a Qwen-VL config or model (``tokenizer``: its
        tokenizer, or ``None`` for :func:`offline_tokenizer`, random-weight configs only;
        ``localiser``: as the constructor's)."""
        return cls(stock_processor(config_or_model, tokenizer), localiser=localiser)

    def _with_localiser(self, method: str, options: dict) -> dict:
        """``options`` with this processor's ``localiser`` in place of the committed
        learned localiser, for a cascade that would use that one and was given none (a
        cascade bound to another localiser, e.g. ``cascade_prior``, keeps its own)."""
        from fovea_core.foveation import _registry

        info = _registry()[1].get(method)
        if self.localiser is None or "localiser" in options or info is None \
                or info["params"].get("localiser") != "learned":
            return options
        return {**options, "localiser": self.localiser}

    @property
    def cell_px(self) -> int:
        """Side in pixels of one merged token (28 for Qwen2/2.5-VL, 32 for Qwen3-VL)."""
        return merged_cell_px(self.family)

    # ------------------------------------------------------------------------- page
    def resized_page(self, images: Any) -> torch.Tensor:
        """The page as the stock processor resizes it: ``[1, 3, Hr, Wr]`` float32 in [0, 1].

        ``images``: a path, PIL image, numpy array or tensor
        (:func:`fovea_core.foveation.load_image`).
        ``(Hr, Wr)`` follows ``smart_resize`` with the image processor's min / max pixels
        (:func:`~fovea_core.vlm.positions.merged_grid_shape`); a page already of that size
        is kept bit for bit, another is resized on the page's 8-bit RGB pixels by the PIL
        image processor's own ``resize`` (bit-equal with the stock call), or, for another image
        processor (e.g. the torchvision one), by PIL with its ``resample`` filter.
        """
        import numpy as np

        from fovea_core.foveation import load_image

        x = load_image(images)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)                       # the processors convert to RGB
        _, _, h, w = x.shape
        ip = self.processor.image_processor
        hm, wm = merged_grid_shape((h, w), self.family, min_pixels=ip.size.shortest_edge,
                                   max_pixels=ip.size.longest_edge)
        if (hm * self.cell_px, wm * self.cell_px) == (h, w) or not ip.do_resize:
            return x.contiguous().float()
        u8 = (x[0].clamp(0, 1) * 255).round().to(torch.uint8).numpy()        # [3, H, W]
        from transformers import Qwen2VLImageProcessorPil

        if isinstance(ip, Qwen2VLImageProcessorPil):
            out = ip.resize(u8, size=ip.size, resample=ip.resample, factor=self.cell_px)
        else:          # e.g. the torchvision processor: PIL with its filter (close, not bit-equal)
            from PIL import Image

            filt = Image.Resampling(int(ip.resample)) if getattr(ip, "resample", None) is not None \
                else Image.Resampling.BICUBIC
            out = np.asarray(Image.fromarray(u8.transpose(1, 2, 0)).resize(
                (wm * self.cell_px, hm * self.cell_px), resample=filt)).transpose(2, 0, 1)
        return torch.from_numpy(np.ascontiguousarray(out)).float()[None] / 255

    def _prompt(self, text: str) -> tuple[str, bool]:
        from fovea_core.foveation import check_text

        if not isinstance(text, str):
            raise TypeError("text must be a str (one prompt for one page), got "
                            f"{type(text).__name__}")
        check_text(text, "text")
        k = text.count(self.image_token)
        if k > 1:
            raise ValueError(f"text holds {k} image placeholders {self.image_token!r}; "
                             "FoveatedProcessor takes one page per call")
        if k == 0:
            return f"{self.vision_start}{self.image_token}{self.vision_end}{text}", False
        return text, True

    # ------------------------------------------------------------------------- call
    def __call__(self, images: Any, text: str, *, budget: int | None = DEFAULT_BUDGET,
                 method: str = DEFAULT_METHOD, question: str | None | _FromText = FROM_TEXT,
                 **method_options: Any):
        """Inputs of ``model.generate`` / ``model`` for one foveated page.

        Args:
            images: one page: a path, PIL image, numpy array ``[H, W(, C)]`` or tensor
                ``[C, H, W]`` (:func:`fovea_core.foveation.load_image`).
            text: the prompt. Without the image placeholder (``<|image_pad|>``) it is taken
                as the question and the image goes first
                (``<|vision_start|><|image_pad|><|vision_end|>`` + text); with one placeholder
                (e.g. from ``apply_chat_template``) it is used as is.
            budget: N, merged tokens the model receives, in ``[1, Hm * Wm]`` of the resized
                page; ``None``: every merged cell.
            method: a :func:`fovea_core.foveation.method_names` method (default
                :func:`fovea_core.foveate`'s, :data:`~fovea_core.foveation.DEFAULT_METHOD`).
            question: what the method reads as the question (a str), or ``None`` for none;
                default (:data:`FROM_TEXT`): ``text`` when it has no placeholder, else none.
            **method_options: passed to :func:`fovea_core.foveate` (``scorer=``,
                ``fixation=``, the allocator's keywords); not ``patch`` (the merged cell).

        Returns:
            A ``transformers.BatchFeature`` with ``input_ids [1, S]`` (N image tokens),
            ``attention_mask [1, S]``, ``mm_token_type_ids [1, S]``, ``pixel_values [4N, 3 *
            2 * p * p]``, ``image_grid_thw [G, 3]`` (``G = N`` one-token images, or ``G = 1``
            full grid) and ``position_ids [3, 1, S]`` (M-RoPE, int64); its attribute
            ``foveation`` is the :class:`fovea_core.foveation.Foveation` (not a key, so
            ``**inputs`` passes only model inputs).

        Raises:
            FileNotFoundError, TypeError, ValueError: an unreadable or missing page (message
            starts with ``image``), a budget outside ``[1, Hm * Wm]``, an unknown method or
            option, a prompt with several placeholders.
        """
        self._check_options(method_options)
        prompt, templated = self._prompt(text)
        if isinstance(question, _FromText):
            question = text if not templated and text.strip() else None
        method_options = self._with_localiser(method, method_options)
        fov = self._foveate(self.resized_page(images), question, budget, method, method_options)
        return self.encode(fov, prompt)

    def _check_options(self, options: dict) -> None:
        """``ValueError`` for a ``patch`` among a method's options: it is the merged cell."""
        if "patch" in options:
            raise ValueError(f"patch is fixed to the merged cell ({self.cell_px} px for "
                             f"{self.family}); leave it out")

    def _foveate(self, page: torch.Tensor, question: str | None, budget: int | None,
                 method: str, options: dict):
        """:func:`fovea_core.foveate` of the resized page at the merged cell (a budget error
        names the page's merged grid)."""
        from fovea_core.foveation import foveate

        hr, wr = page.shape[-2:]
        hm, wm = hr // self.cell_px, wr // self.cell_px
        try:
            return foveate(page, question, budget=budget, method=method, patch=self.cell_px,
                           **options)
        except ValueError as err:
            msg = str(err)
            grid = (f"the processor resizes this page to {hr}x{wr} px: {hm}x{wm} = {hm * wm} "
                    f"merged tokens of {self.cell_px} px")
            if msg.startswith("budget"):
                raise ValueError(f"{msg} ({grid})") from None
            if "no budget fits" in msg:          # the patch is the merged cell: not a choice
                head, _, tail = msg.partition("; use a larger page or a smaller patch")
                raise ValueError(f"{head}{tail} ({grid}; the patch is fixed to the merged "
                                 f"cell): use a larger page, or a method that fits any page, "
                                 f"e.g. method='resize'") from None
            raise

    def encode(self, foveation, text: str):
        """Inputs of ``model.generate`` / ``model`` for a foveation already made.

        The second half of :meth:`__call__` (which is :meth:`resized_page`, then
        :func:`fovea_core.foveate` at ``patch =`` :attr:`cell_px`, then this), for a
        :class:`~fovea_core.foveation.Foveation` made elsewhere, e.g. the union of two
        fixations (:meth:`two_fixations`). Its tokens must lie on the page as
        :meth:`resized_page` gives it (``image_size = (Hm * f, Wm * f)``, ``patch = f``) and
        its patches be ``[1, N, C, f, f]``; ``text`` is as in :meth:`__call__`. Returns the
        same ``BatchFeature`` (``.foveation`` is ``foveation``).
        """
        from transformers import BatchFeature

        prompt, _ = self._prompt(text)
        fov = foveation
        tokens = fov.tokens
        f = self.cell_px
        hr, wr = tokens.image_size
        if tokens.patch != f or hr % f or wr % f or tokens.batch_size != 1:
            raise ValueError(f"foveation: its tokens are on a {hr}x{wr} page at patch "
                             f"{tokens.patch} (batch {tokens.batch_size}); encode needs one page "
                             f"as resized_page gives it (sides multiples of {f}) at patch {f}")
        if tuple(fov.patches.shape[:2]) != (1, tokens.budget) or fov.patches.shape[-1] != f:
            raise ValueError(f"foveation: patches {tuple(fov.patches.shape)} do not match "
                             f"{tokens.budget} tokens of {f} px")
        hm, wm = hr // f, wr // f
        n = tokens.budget

        # text: the placeholder repeated N times, as the stock processor repeats it Hm*Wm times
        enc = self.processor.tokenizer(prompt.replace(self.image_token, self.image_token * n),
                                       return_tensors="pt")
        ids = enc["input_ids"]
        is_img = ids[0] == self.image_token_id
        where = is_img.nonzero()[:, 0]
        if len(where) != n or (n and int(where[-1] - where[0]) != n - 1):
            raise ValueError(f"processor: its tokenizer turned {n} placeholders into "
                             f"{len(where)} image tokens (not one run of {n})")
        before = int(where[0])
        after = ids.shape[1] - before - n
        pos = mrope_positions(tokens, (hm, wm), text_before=before, text_after=after)

        # pixels: each token's 2p x 2p patch in the sequence's (raster) order, one merge block each
        patches = fov.patches[0, pos.order[0]]                            # [N, 3, 2p, 2p]
        if patches.shape[1] == 1:
            patches = patches.expand(-1, 3, -1, -1)
        strip = patches.permute(1, 2, 0, 3).reshape(1, 3, f, n * f)        # tokens side by side
        pv, _ = pixel_values(strip, self.family, grid_hw=(1, n))           # [4N, 3*2*p*p]
        full = (n == hm * wm and bool((tokens.levels == 0).all())
                and bool((tokens.footprint() == f).all())
                and torch.equal(pos.cells[0, :, 0] * wm + pos.cells[0, :, 1],
                                torch.arange(n, device=pos.cells.device)))
        m = QWEN_MERGE
        thw = (torch.tensor([[1, hm * m, wm * m]]) if full
               else torch.tensor([[1, m, m]]).expand(n, 3).contiguous())
        out = BatchFeature({"input_ids": ids, "attention_mask": enc["attention_mask"],
                            "mm_token_type_ids": is_img[None].to(torch.int64),
                            "pixel_values": pv, "image_grid_thw": thw,
                            "position_ids": pos.position_ids})
        out.foveation = fov
        return out

    # ------------------------------------------------------------------------- two fixations
    def two_fixations(self, model: Any, images: Any, question: str, *,
                      budget: int = DEFAULT_BUDGET,
                      first_budget: int | None = None, method: str = "cascade",
                      max_new_tokens: int = 64, grounding_prompt: str | None = None,
                      answer_prompt: str = "{question}", chat: bool | None = None,
                      seen_weight: float = SEEN_WEIGHT, generate_kwargs: dict | None = None,
                      **method_options: Any) -> TwoFixations:
        """Two fixations of one page: look, ask the model where the answer is, look there.

        1. **Fixation 1**: the cascade (``method``) at ``N1 = first_budget`` tokens (default
           ``round(GROUNDING_FIRST_SHARE * N)``, half: a default, not tuned), encoded with the
           grounding prompt (:data:`GROUNDING_PROMPTS`; ``{question}`` is replaced), and
           ``model.generate`` (greedy, ``max_new_tokens``) for the model's box.
        2. **The box**: :func:`parse_grounding_box` of the reply, in the family's convention
           (:data:`GROUNDING_COORDS`). No usable box (garbage, no box, NaN, a degenerate box,
           one outside the page): fixation 2 falls back to the cascade's own localiser
           (``localiser=`` of ``method_options``, else the one ``method`` binds).
        3. **Fixation 2**: ``N2 = N - N1`` fovea tokens placed by the same cascade with the
           localiser :class:`SecondFixationMap` (the box's area share per cell, or the
           fallback's map, less what fixation 1's finest tokens already read: the one rule
           of :func:`~fovea_core.cascade.core.discount_seen`, their cells keeping
           ``seen_weight`` of their mass, so fixation 2 reads what fixation 1 did not read
           finely).
           It is run with fixation 1's gist (``gist_budget`` = the gist's ``G1`` tokens; the
           same tokens, checked) and only its ``N2`` fovea tokens are kept: the gist is
           already among fixation 1's tokens.
        4. **Answer inputs**: one image block holding both fixations' tokens (exactly
           ``N`` image tokens, raster order of their cells; fixation 2's tokens carry
           ``TokenSet.stage`` 2) with ``answer_prompt``. A token's M-RoPE ids depend only on
           its cell and the image's start (:func:`~fovea_core.vlm.positions.mrope_positions`),
           so each fixation's tokens keep the ids they have in a prompt of their own.

        Cost: two prefills (no KV cache is shared: the prompts differ) and the reply's
        decode, in :attr:`TwoFixations.counts` (:class:`FixationCounts`).

        Args:
            model: a Qwen-VL ``...ForConditionalGeneration`` of this processor's family
                (checked before anything runs: a model of another family is refused).
            images: one page (:meth:`__call__`).
            question: the question (a non-empty str); both fixations' cascades read it.
            budget: N, image tokens of the answer prompt (``N1 + N2``), an int >= 2 and at
                most the resized page's ``Hm * Wm`` merged cells, large enough that ``N1``
                lies in the cascade's range for the page (its gist plus at least one fovea
                token, :func:`~fovea_core.cascade.allocator.budget_range`) and ``N2 >= 1``;
                the message of a budget outside gives the page's range.
            first_budget: ``N1`` in ``[1, N - 1]`` and in the cascade's range for the page;
                ``None``: ``round(GROUNDING_FIRST_SHARE * N)``.
            method: a registered one-fixation cascade (``"cascade"``, ``"cascade_text"``,
                ...); not the read-then-look ones (``"cascade_read"``, ``"cascade_glance"``),
                which make their own second look and whose first stage is not a gist that
                fixation 2 can share.
            max_new_tokens: the grounding reply's length limit.
            grounding_prompt, answer_prompt: prompts with ``{question}`` (replaced, no other
                braces read); ``None`` grounding prompt: the family's default.
            chat: wrap each prompt in the processor's chat template (one user turn: the image,
                then the prompt; generation prompt added); ``None``: when it has one.
            seen_weight: weight in ``[0, 1]`` kept in fixation 2's map by a cell that fixation
                1's finest tokens cover (1: no discount; default
                :data:`~fovea_core.cascade.core.SEEN_WEIGHT`, the read-then-look cascade's
                too: none). Near copies that remain are counted in ``counts.repeated``.
            generate_kwargs: more keywords of the grounding call's ``model.generate`` (e.g.
                ``output_logits=True, return_dict_in_generate=True``).
            **method_options: the cascade's keywords, for both fixations (not ``patch``;
                fixation 2's ``localiser`` and ``gist_budget`` are set as above).

        Returns:
            :class:`TwoFixations`: ``inputs`` (``input_ids [1, S2]`` with N image tokens,
            ``pixel_values [4N, 3 * 2 * p * p]``, ``image_grid_thw [N, 3]``, ``position_ids
            [3, 1, S2]``, ...; ``inputs.foveation`` the union), ``first_inputs`` (the same for
            the grounding prompt, ``N1`` image tokens), both foveations, the reply, the parsed
            box and the token counts.

        Raises:
            TypeError: ``model`` is not a model (e.g. ``None``).
            ValueError: a model of another family, a bad question, budget, first_budget,
                method, seen_weight or option; all before fixation 1 runs.
        """
        from dataclasses import replace

        from fovea_core.cascade.allocator import budget_range, cascade_parts
        from fovea_core.foveation import check_text
        from fovea_core.methods import INFO

        _check_model(model, self.family)
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"question must be a non-empty str, got {question!r}")
        check_text(question, "question")
        one_look = [m for m, e in INFO.items() if e["runner"] is cascade_parts]
        if method not in one_look:
            why = (f"; {method!r} reads the page and looks again on its own, and its first "
                   "stage is not a gist the second fixation can share"
                   if method in INFO and INFO[method]["runner"] is not None else "")
            raise ValueError(f"method must be a registered cascade of one fixation "
                             f"({', '.join(one_look)}), got {method!r}{why}")
        self._check_options(method_options)
        method_options = self._with_localiser(method, method_options)
        n = _int_in("budget", budget, 2, None)
        n1 = _int_in("first_budget", max(1, round(GROUNDING_FIRST_SHARE * n))
                     if first_budget is None
                     else first_budget, 1, n - 1)
        n2 = n - n1
        _int_in("max_new_tokens", max_new_tokens, 1, None)
        if isinstance(seen_weight, bool) or not isinstance(seen_weight, (int, float)) or \
                not 0 <= float(seen_weight) <= 1:
            raise ValueError(f"seen_weight must be in [0, 1], got {seen_weight!r}")
        if grounding_prompt is None:
            grounding_prompt = GROUNDING_PROMPTS[self.family]
        ground_text = self._chat(grounding_prompt.replace("{question}", question), chat)
        answer_text = self._chat(answer_prompt.replace("{question}", question), chat)

        page = self.resized_page(images)
        hr, wr = page.shape[-2:]
        f = self.cell_px
        cells = (hr // f) * (wr // f)
        gb = method_options.get("gist_budget")
        low, high = budget_range((hr, wr), patch=f,
                                 gist_budget=int(gb) if isinstance(gb, int) else None)
        low, high = int(low), int(high)
        # the smallest N whose N1 is in the cascade's range and leaves N2 >= 1
        split = (lambda m: max(1, round(GROUNDING_FIRST_SHARE * m))) if first_budget is None \
            else (lambda m: n1)
        n_min = next((m for m in (2 * low - 1, 2 * low, 2 * low + 1, n1 + 1)
                      if 2 <= m <= cells and low <= split(m) <= min(high, m - 1)), None)
        grid = (f"the processor resizes this page to {hr}x{wr} px: {hr // f}x{wr // f} = "
                f"{cells} merged tokens of {f} px")
        if n_min is None:
            raise ValueError(f"budget: no budget gives two fixations on this page ({grid}; "
                             f"fixation 1's cascade needs {low} to {high} tokens and "
                             f"fixation 2 at least one); use a larger page")
        if n > cells or n < n_min:
            n1_is = f"round({GROUNDING_FIRST_SHARE:g} N)" if first_budget is None else n1
            raise ValueError(f"budget must be in [{n_min}, {cells}] on this page ({grid}; "
                             f"fixation 1, N1 = {n1_is} tokens, is a cascade, which needs {low} "
                             f"to {high}, its gist plus at least one fovea token; fixation 2 at "
                             f"least one), got {n}")
        if not low <= n1 <= high:
            raise ValueError(f"first_budget must be in [{low}, {min(high, n - 1)}] on this page "
                             f"({grid}; the cascade needs its gist plus at least one fovea "
                             f"token, and fixation 2 at least one of N = {n}), got {n1}")

        # ---- fixation 1 and the grounding call
        fov1 = self._foveate(page, question, n1, method, dict(method_options))
        stage1 = fov1.tokens.stage
        if stage1 is None:
            raise RuntimeError(f"method {method!r} returned tokens without stages")
        gist1 = stage1[0] == STAGE_GIST
        g1 = int(gist1.sum())
        first_inputs = self.encode(fov1, ground_text)
        gen = {"max_new_tokens": int(max_new_tokens), "do_sample": False,
               **(generate_kwargs or {})}
        dev = getattr(model, "device", None)
        feed = {k: v.to(dev) if dev is not None else v for k, v in first_inputs.items()}
        with torch.no_grad():
            output = model.generate(**feed, **gen)
        _forget_rope_deltas(model)
        seq = output.sequences if hasattr(output, "sequences") else output
        new = seq[0, first_inputs["input_ids"].shape[1]:].cpu()
        reply = self.processor.tokenizer.decode(new, skip_special_tokens=False)
        box = parse_grounding_box(reply, (hr, wr), GROUNDING_COORDS[self.family])

        # ---- fixation 2: the box's cells (or the cascade's own map), fixation 1's gist
        fallback = method_options.get("localiser", INFO[method]["params"].get("localiser",
                                                                            "learned"))
        loc = SecondFixationMap(box.box, fallback, select_tokens(fov1.tokens, ~gist1),
                                seen_weight)
        both = self._foveate(page, question, n2 + g1, method,
                             {**method_options, "localiser": loc, "gist_budget": g1})
        gist2 = both.tokens.stage[0] == STAGE_GIST
        if not (int(gist2.sum()) == g1 and torch.equal(both.tokens.centers[:, gist2],
                                                       fov1.tokens.centers[:, gist1])
                and torch.equal(both.tokens.levels[:, gist2], fov1.tokens.levels[:, gist1])):
            raise RuntimeError("two_fixations: the second cascade's gist differs from the first's")
        t2, p2 = select_tokens(both.tokens, ~gist2), both.patches[:, ~gist2]
        fov2 = replace(both, tokens=t2, patches=p2,          # views are rendered when asked for
                       cost=replace(both.cost, tokens=n2,
                                    total_tokens=both.cost.total_tokens - g1))

        # ---- the answer: both fixations in one image block
        t2u = replace(t2, stage=torch.full_like(t2.stage, STAGE_SECOND))
        t1 = fov1.tokens
        tu = combine([t1, t2u], fixation=torch.cat([t1.fixations, t2u.fixations], 1))
        pu = torch.cat([fov1.patches, p2], 1)
        union = replace(fov1, tokens=tu, patches=pu,
                        cost=_union_cost(fov1.cost, both.cost, n),
                        options={**fov1.options, "first_budget": n1, "second_localiser": loc})
        inputs = self.encode(union, answer_text)
        repeated = _repeated(t1, t2, (hr // f, wr // f))
        counts = FixationCounts(first=n1, second=n2, total=n, repeated=repeated,
                                prefill_image_tokens=n1 + n,
                                prefill_tokens=int(first_inputs["input_ids"].shape[1]
                                                   + inputs["input_ids"].shape[1]),
                                reply_tokens=int(new.numel()))
        return TwoFixations(inputs=inputs, first_inputs=first_inputs, first=fov1, second=fov2,
                            reply=reply, grounding=box, counts=counts, output=output)

    def _chat(self, text: str, chat: bool | None) -> str:
        """``text`` as one user turn (the image, then ``text``) of the processor's chat
        template with the generation prompt; ``chat=None``: only if it has a template."""
        template = getattr(self.processor, "chat_template", None)
        if chat is None:
            chat = bool(template)
        if not chat:
            return text
        if not template:
            raise ValueError("chat=True but the processor has no chat template")
        turn = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        return self.processor.apply_chat_template(turn, tokenize=False,
                                                  add_generation_prompt=True)

    def __repr__(self) -> str:
        return f"FoveatedProcessor({type(self.processor).__name__}, family={self.family!r})"


# ----------------------------------------------------------------------------- two fixations

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf(?:inity)?)"
_N = rf"\s*({_NUM})\s*"
#: the forms a reply may give a box in, in the order they are tried
_BOX_FORMS = (
    ("box tokens", re.compile(rf"<\|box_start\|>\s*\({_N},{_N}\)\s*,?\s*\({_N},{_N}\)\s*"
                              r"<\|box_end\|>", re.IGNORECASE)),
    ("bbox_2d", re.compile(rf"bbox_2d[\"']?\s*:\s*\[{_N},{_N},{_N},{_N}\]", re.IGNORECASE)),
    ("corner pairs", re.compile(rf"\({_N},{_N}\)\s*,?\s*\({_N},{_N}\)", re.IGNORECASE)),
    ("list", re.compile(rf"\[{_N},{_N},{_N},{_N}\]", re.IGNORECASE)),
)


@dataclass(frozen=True)
class GroundingBox:
    """What :func:`parse_grounding_box` made of a reply.

    Attributes:
        box: ``(x1, y1, x2, y2)`` in pixels of the resized page (``x1 < x2``, ``y1 < y2``,
            clipped to the page), or ``None``: no usable box.
        reason: ``None`` with a box; else why none: ``"no box in the reply"``,
            ``"not finite"`` (NaN / inf), ``"degenerate"`` (a side under
            :data:`MIN_BOX_PX`), ``"outside the page"`` (less than that left after clipping).
        raw: the four numbers of the box used (or of the first one tried), as written.
        form: the form they were written in (``"box tokens"``, ``"bbox_2d"``,
            ``"corner pairs"``, ``"list"``), or ``None``.
    """

    box: tuple[float, float, float, float] | None
    reason: str | None
    raw: tuple[float, float, float, float] | None = None
    form: str | None = None


def parse_grounding_box(reply: str | None, image_size: tuple[int, int],
                        coords: str = "absolute") -> GroundingBox:
    """The first usable box of a grounding reply, in pixels of the resized page.

    Forms tried, in this order (each anywhere in the reply, case-insensitive, numbers with
    signs, decimals, exponents): Qwen's ``<|box_start|>(x1,y1),(x2,y2)<|box_end|>``; JSON
    ``"bbox_2d": [x1, y1, x2, y2]`` (alone or in a list of objects); ``(x1,y1),(x2,y2)``;
    a bare ``[x1, y1, x2, y2]``. Each candidate is converted from ``coords``
    (``"absolute"``: pixels of the ``(H, W) = image_size`` page; ``"relative-1000"``:
    ``x * W / 1000``, ``y * H / 1000``), its corners put in order (a box written
    bottom-right first is the same box), and clipped to the page. The first candidate with
    four finite numbers, both sides at least :data:`MIN_BOX_PX` and that much left on the
    page wins; otherwise the reason of the first candidate (or ``"no box in the reply"``).
    Never raises for a reply, whatever it holds (``None`` counts as empty).
    """
    if coords not in ("absolute", "relative-1000"):
        raise ValueError(f"coords must be 'absolute' or 'relative-1000', got {coords!r}")
    h, w = (float(v) for v in image_size)
    text = reply if isinstance(reply, str) else ""
    first = None
    for form, pattern in _BOX_FORMS:
        for m in pattern.finditer(text):
            raw = tuple(float(g) for g in m.groups())
            box, why = _check_box(raw, h, w, coords)
            if box is not None:
                return GroundingBox(box, None, raw, form)
            first = first or GroundingBox(None, why, raw, form)
    return first or GroundingBox(None, "no box in the reply")


def _check_box(raw: tuple[float, ...], h: float, w: float, coords: str):
    if not all(math.isfinite(v) for v in raw):
        return None, "not finite"
    sx, sy = (w / 1000, h / 1000) if coords == "relative-1000" else (1.0, 1.0)
    x1, x2 = sorted((raw[0] * sx, raw[2] * sx))
    y1, y2 = sorted((raw[1] * sy, raw[3] * sy))
    if x2 - x1 < MIN_BOX_PX or y2 - y1 < MIN_BOX_PX:
        return None, "degenerate"
    x1, y1, x2, y2 = max(x1, 0.0), max(y1, 0.0), min(x2, w), min(y2, h)
    if x2 - x1 < MIN_BOX_PX or y2 - y1 < MIN_BOX_PX:
        return None, "outside the page"
    return (x1, y1, x2, y2), None


class SecondFixationMap:
    """Fixation 2's localiser: a callable ``(gist, question) -> [B, Gh, Gw]`` for the cascade.

    With a ``box`` (pixels of the page): the share of each level-0 cell's area inside it
    (:func:`~fovea_core.cascade.localisers.answer_mass`, as the book's
    :class:`~fovea_book.eval.localisation.OracleLocaliser` maps answer boxes); the question
    is not read.
    Without (``None``): the ``fallback`` localiser's map (a name of
    :data:`~fovea_core.cascade.localisers.LOCALISERS` or a callable). Either is discounted
    by the one rule for what an earlier fixation read
    (:func:`~fovea_core.cascade.core.discount_seen`): the cells under those of the ``seen``
    tokens (fixation 1's fovea, in :meth:`FoveatedProcessor.two_fixations`) whose level is
    within :data:`~fovea_core.cascade.core.LEVEL_TOLERANCE` of ``level`` or finer keep
    ``seen_weight`` of their mass (default none; 1: the map as it is). ``level``: the level
    fixation 2 is expected to read at; ``None``, the seen tokens' finest (fixation 2, a
    cascade on the same gist, chooses its level from the same text heights).
    """

    def __init__(self, box, fallback="learned", seen: TokenSet | None = None,
                 seen_weight: float = SEEN_WEIGHT, level: float | None = None):
        self.box = None if box is None else tuple(float(v) for v in box)
        self.fallback = fallback
        self.seen = seen
        self.seen_weight = float(seen_weight)
        self.level = level

    def __repr__(self) -> str:
        where = (f"box=({', '.join(f'{v:.1f}' for v in self.box)})" if self.box is not None
                 else f"fallback={self.fallback!r}")
        return f"SecondFixationMap({where}, seen_weight={self.seen_weight:g})"

    def __call__(self, g, query: str | None) -> torch.Tensor:
        from fovea_core.cascade.localisers import answer_mass, get_localiser

        h, w = g.image_size
        grid = (math.ceil(h / g.patch), math.ceil(w / g.patch))
        b = g.tokens.batch_size
        if self.box is not None:
            m = answer_mass([self.box], g.image_size, g.patch)[None].expand(b, *grid)
        else:
            m = get_localiser(self.fallback)(g, query).float()
        if self.seen is not None and self.seen.budget:
            lv = float(self.seen.levels.min()) if self.level is None else float(self.level)
            m = discount_seen(m, self.seen, lv, patch=g.patch, weight=self.seen_weight)
        return m.contiguous()


@dataclass(frozen=True)
class FixationCounts:
    """Token counts of :meth:`FoveatedProcessor.two_fixations`.

    Attributes:
        first: ``N1``, fixation 1's tokens (gist and fovea).
        second: ``N2 = N - N1``, fixation 2's (fovea only).
        total: ``N = N1 + N2``, the image tokens of the answer prompt (compare with a
            single fixation, e.g. ``resize``, at this N).
        repeated: fixation 2's tokens on the merged cell of one of fixation 1's (the same
            M-RoPE ids) at a level within a quarter octave of it: near copies.
        prefill_image_tokens: ``N1 + N``, image tokens through the vision tower and the LM
            prefill over both calls (fixation 1's are read twice).
        prefill_tokens: LM prefill tokens of both calls, text included.
        reply_tokens: tokens the grounding call generated.
    """

    first: int
    second: int
    total: int
    repeated: int
    prefill_image_tokens: int
    prefill_tokens: int
    reply_tokens: int


@dataclass(frozen=True, eq=False)
class TwoFixations:
    """The result of :meth:`FoveatedProcessor.two_fixations`.

    Attributes:
        inputs: the answer prompt's ``BatchFeature`` for ``model.generate(**inputs)``: N
            image tokens of both fixations; ``inputs.foveation`` is their union (a
            :class:`~fovea_core.foveation.Foveation`, ``tokens.stage`` 0 / 1 / 2 for
            fixation 1's gist, its fovea and fixation 2). Its ``cost`` counts what the
            allocators read (both calls); the grounding call's model compute is in
            ``counts``.
        first_inputs: the grounding prompt's ``BatchFeature`` (``N1`` image tokens).
        first: fixation 1's Foveation (``N1`` tokens).
        second: fixation 2's Foveation (its ``N2`` fovea tokens; the gist it shared with
            fixation 1 left out, and from its cost).
        reply: the grounding reply as decoded (special tokens kept).
        grounding: the :class:`GroundingBox` parsed from it.
        counts: :class:`FixationCounts`.
        output: what the grounding call's ``model.generate`` returned.
    """

    inputs: Any
    first_inputs: Any
    first: Any
    second: Any
    reply: str
    grounding: GroundingBox
    counts: FixationCounts
    output: Any

    @property
    def box(self) -> tuple[float, float, float, float] | None:
        """The box fixation 2 read (pixels of the resized page), or ``None``."""
        return self.grounding.box

    @property
    def path(self) -> str:
        """``"box"`` (fixation 2 read the model's box) or ``"fallback"`` (the cascade's map)."""
        return "box" if self.grounding.box is not None else "fallback"

    @property
    def fallback_reason(self) -> str | None:
        """Why there was no box (:attr:`GroundingBox.reason`), or ``None``."""
        return self.grounding.reason


def _int_in(name: str, value: Any, low: int, high: int | None) -> int:
    import numpy as np

    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or \
            value < low or (high is not None and value > high):
        where = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an int {where}, got {value!r}")
    return int(value)


def _repeated(t1: TokenSet, t2: TokenSet, grid_hw: tuple[int, int]) -> int:
    """Tokens of ``t2`` on the merged cell of a ``t1`` token (so with its M-RoPE ids) at a
    level within :data:`~fovea_core.cascade.core.LEVEL_TOLERANCE` of it: near copies of a
    token the model already has."""
    c1 = merged_cells(t1, grid_hw)[0]
    c2 = merged_cells(t2, grid_hw)[0]
    same = (c2[:, None] == c1[None]).all(-1)                                  # [N2, N1]
    near = (t2.levels[0][:, None] - t1.levels[0][None]).abs() <= LEVEL_TOLERANCE
    return int((same & near).any(1).sum())


def _forget_rope_deltas(model: Any) -> None:
    """Drop the ``rope_deltas`` a Qwen-VL model keeps from its last generate (the next
    call then starts from its own inputs)."""
    inner = getattr(model, "model", None)
    if inner is not None and hasattr(inner, "rope_deltas"):
        inner.rope_deltas = None


def _union_cost(c1, c2, n: int):
    """The cost record of both fixations' tokens: N tokens, what both allocators read."""
    from fovea_core.cost import COST_LABELS
    from fovea_core.foveation import Cost

    extra = c1.scorer_tokens + c1.alloc_read_tokens + c2.scorer_tokens + c2.alloc_read_tokens
    flops = (None if c1.side_flops is None and c2.side_flops is None
             else (c1.side_flops or 0.0) + (c2.side_flops or 0.0))
    return Cost(tokens=n, scorer=c1.scorer, scorer_tokens=c1.scorer_tokens + c2.scorer_tokens,
                alloc_read_tokens=c1.alloc_read_tokens + c2.alloc_read_tokens,
                total_tokens=float(n + extra), side_pixels=c1.side_pixels + c2.side_pixels,
                side_ms=c1.side_ms + c2.side_ms, side_flops=flops,
                reads_text=c1.reads_text or c2.reads_text,
                label=max(c1.label, c2.label, key=COST_LABELS.index))
