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
:func:`fovea_core.vlm.qwen.foveated_inputs`.)

**How generate receives the positions.** ``transformers`` 5.x ``generate`` takes
``position_ids`` as a model keyword: a given ``[3, B, S]`` tensor is used for the prefill
as is (the model then skips its own ``get_rope_index``, which cannot describe a set of
tokens that is not a full grid) and extended by ``last + 1`` per generated token. The
prompt always ends with text (at least the vision-end token), whose three ids are equal,
so the extension equals the stock model's ``rope_deltas`` rule. A transformers whose
``generate`` does not accept ``position_ids`` for these models (4.x before the
``_prepare_position_ids_for_generation`` hook) would recompute them; this module is tested
on the installed 5.x only.
"""

from __future__ import annotations

from typing import Any

import torch

from fovea_core.vlm.positions import (QWEN_MERGE, QWEN_PATCH, merged_cell_px, merged_grid_shape,
                                      mrope_positions)
from fovea_core.vlm.qwen import PIXEL_NORM, family_of, pixel_values

__all__ = ["FROM_TEXT", "FoveatedProcessor", "SUPPORTED_PROCESSORS", "offline_tokenizer",
           "processor_family", "stock_processor"]

#: family -> the ``transformers`` processor class it wraps
SUPPORTED_PROCESSORS = {"qwen2-vl": "Qwen2VLProcessor", "qwen2.5-vl": "Qwen2_5_VLProcessor",
                        "qwen3-vl": "Qwen3VLProcessor"}


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
    """A character-level tokenizer for the random-weight configs of :mod:`fovea_core.vlm.qwen`.

    No tokenizer can be downloaded here, so tests and chapter 15 build one: printable ASCII
    (code ``c`` -> id ``c - 29``, ids 3..97), ``<unk>`` = 0 and Qwen's special tokens
    (``<|image_pad|>``, ``<|video_pad|>``, ``<|vision_start|>``, ``<|vision_end|>``,
    ``<|endoftext|>``) at the ids of ``config`` (a Qwen-VL config or model). Meaningless
    for a pretrained checkpoint: use its own tokenizer there.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
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

    Example::

        fp = FoveatedProcessor(AutoProcessor.from_pretrained("Qwen/Qwen2-VL-2B-Instruct"))
        inputs = fp("page.png", "What is the total?", budget=273)
        out = model.generate(**inputs, max_new_tokens=32)
        inputs.foveation        # the fovea_core.Foveation: tokens, patches, view, cost
    """

    def __init__(self, processor: Any):
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
    def from_model(cls, config_or_model: Any, tokenizer: Any = None) -> FoveatedProcessor:
        """Wrap :func:`stock_processor` of a Qwen-VL config or model (``tokenizer``: its
        tokenizer, or ``None`` for :func:`offline_tokenizer`, random-weight configs only)."""
        return cls(stock_processor(config_or_model, tokenizer))

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
        if not isinstance(text, str):
            raise TypeError("text must be a str (one prompt for one page), got "
                            f"{type(text).__name__}")
        k = text.count(self.image_token)
        if k > 1:
            raise ValueError(f"text holds {k} image placeholders {self.image_token!r}; "
                             "FoveatedProcessor takes one page per call")
        if k == 0:
            return f"{self.vision_start}{self.image_token}{self.vision_end}{text}", False
        return text, True

    # ------------------------------------------------------------------------- call
    def __call__(self, images: Any, text: str, *, budget: int | None = 273,
                 method: str = "cascade", question: str | None | _FromText = FROM_TEXT,
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
            method: a :func:`fovea_core.foveation.method_names` method (default the cascade).
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
        from transformers import BatchFeature

        from fovea_core.foveation import foveate

        if "patch" in method_options:
            raise ValueError(f"patch is fixed to the merged cell ({self.cell_px} px for "
                             f"{self.family}); leave it out")
        prompt, templated = self._prompt(text)
        if isinstance(question, _FromText):
            question = text if not templated and text.strip() else None
        page = self.resized_page(images)
        hr, wr = page.shape[-2:]
        hm, wm = hr // self.cell_px, wr // self.cell_px
        try:
            fov = foveate(page, question, budget=budget, method=method, patch=self.cell_px,
                          **method_options)
        except ValueError as err:
            msg = str(err)
            if msg.startswith("budget"):
                raise ValueError(f"{msg} (the processor resizes this page to {hr}x{wr} px: "
                                 f"{hm}x{wm} = {hm * wm} merged tokens of {self.cell_px} px)"
                                 ) from None
            raise
        tokens = fov.tokens
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
        f = self.cell_px
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

    def __repr__(self) -> str:
        return f"FoveatedProcessor({type(self.processor).__name__}, family={self.family!r})"
