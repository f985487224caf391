"""Random-weight Qwen2-VL / Qwen2.5-VL / Qwen3-VL models for the book's checks and benchmarks.

Nothing can be downloaded here, so chapter 15, the benchmarks and the tests build the
models from configs with random weights: exact for shapes, position ids, logits invariants
and latency; meaningless for accuracy. :data:`MODEL_NAMES` lists the configs (tiny ones for
tests, a CPU benchmark size, and three published sizes typed in from their checkpoints'
``config.json``); :func:`build_qwen` builds one. :func:`reference_forward` is the
unmodified model call on the full image, the reference the foveated bridge
(:mod:`fovea_book.qwen_pooled`) is checked against; :func:`lm_prefill_flops` and
:func:`lm_parameter_count` count a language model's prefill FLOPs and parameters from its
config, for the chapters' compute axis.
"""

from __future__ import annotations

import torch

from fovea_core.vlm.positions import QWEN_MERGE, QWEN_PATCH
from fovea_book.qwen_pooled import _ids
from fovea_core.vlm.qwen import family_of, pixel_values

__all__ = ["MODEL_NAMES", "build_qwen", "has_family", "lm_parameter_count", "lm_prefill_flops",
           "qwen_config", "reference_forward", "reference_input_ids"]

# Token ids of the tiny/mid configs (vocab is small there; real configs keep Qwen's ids).
_SMALL_IDS = {"image_token_id": 251, "video_token_id": 252, "vision_start_token_id": 253,
              "vision_end_token_id": 254}


def _text(family: str, **kw) -> dict:
    if kw.get("vocab_size", 0) < 151643:  # small vocab: keep bos/eos inside it
        kw.update(bos_token_id=1, eos_token_id=2)
    rope = {"rope_type": "default", "rope_theta": kw.pop("rope_theta", 1e6),
            "mrope_section": kw.pop("mrope_section")}
    if family == "qwen3-vl":
        rope["mrope_interleaved"] = True
    return {**kw, "rope_parameters": rope}


# name -> (family, text_config kwargs, vision_config kwargs, top-level kwargs).
# Realistic sizes are typed in from the public Hugging Face ``config.json`` of the checkpoint
# named (not downloaded here; the built models have 2.21 B, 8.29 B and 2.13 B parameters, the
# published sizes); tiny / mid are ours.
_SPECS: dict[str, tuple[str, dict, dict, dict]] = {
    "qwen2-vl-tiny": ("qwen2-vl", _text("qwen2-vl", vocab_size=256, hidden_size=64,
                      intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, mrope_section=[2, 3, 3]),
                      dict(depth=2, embed_dim=32, num_heads=2, hidden_size=64), _SMALL_IDS),
    "qwen2.5-vl-tiny": ("qwen2.5-vl", _text("qwen2.5-vl", vocab_size=256, hidden_size=64,
                        intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, mrope_section=[2, 3, 3]),
                        dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                             out_hidden_size=64, window_size=56, fullatt_block_indexes=[1]),
                        _SMALL_IDS),
    "qwen3-vl-tiny": ("qwen3-vl", _text("qwen3-vl", vocab_size=256, hidden_size=64,
                      intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, mrope_section=[4, 2, 2]),
                      dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2,
                           out_hidden_size=64, num_position_embeddings=64,
                           deepstack_visual_indexes=[0, 1]), _SMALL_IDS),
    # CPU benchmark model: ~25 M LM parameters (8 layers of width 512).
    "qwen2-vl-mid": ("qwen2-vl", _text("qwen2-vl", vocab_size=8192, hidden_size=512,
                     intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                     num_key_value_heads=2, mrope_section=[8, 12, 12]),
                     dict(depth=2, embed_dim=128, num_heads=4, hidden_size=512), _SMALL_IDS),
    # Qwen/Qwen2-VL-2B-Instruct
    "qwen2-vl-2b": ("qwen2-vl", _text("qwen2-vl", vocab_size=151936, hidden_size=1536,
                    intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                    num_key_value_heads=2, mrope_section=[16, 24, 24]),
                    dict(depth=32, embed_dim=1280, num_heads=16, hidden_size=1536),
                    {"tie_word_embeddings": True}),
    # Qwen/Qwen2.5-VL-7B-Instruct
    "qwen2.5-vl-7b": ("qwen2.5-vl", _text("qwen2.5-vl", vocab_size=152064, hidden_size=3584,
                      intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                      num_key_value_heads=4, mrope_section=[16, 24, 24]),
                      dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16,
                           out_hidden_size=3584, window_size=112,
                           fullatt_block_indexes=[7, 15, 23, 31]), {}),
    # Qwen/Qwen3-VL-2B-Instruct
    "qwen3-vl-2b": ("qwen3-vl", _text("qwen3-vl", vocab_size=151936, hidden_size=2048,
                    intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                    num_key_value_heads=8, head_dim=128, rope_theta=5e6,
                    mrope_section=[24, 20, 20]),
                    dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16,
                         out_hidden_size=2048, num_position_embeddings=2304,
                         deepstack_visual_indexes=[5, 11, 17]), {"tie_word_embeddings": True}),
}
MODEL_NAMES = tuple(_SPECS)


def _classes(family: str):
    """(config class, model class, text-model class) of a family, from the installed transformers."""
    if family == "qwen2-vl":
        from transformers import Qwen2VLConfig as C, Qwen2VLForConditionalGeneration as M
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLTextModel as T
    elif family == "qwen2.5-vl":
        from transformers import Qwen2_5_VLConfig as C, Qwen2_5_VLForConditionalGeneration as M
        from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLTextModel as T
    elif family == "qwen3-vl":
        try:
            from transformers import Qwen3VLConfig as C, Qwen3VLForConditionalGeneration as M
            from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel as T
        except ImportError as err:  # older transformers
            raise ImportError("this transformers has no Qwen3-VL classes (needs >= 4.57)") from err
    else:
        raise ValueError(f"family must be one of {sorted(QWEN_PATCH)}, got {family!r}")
    return C, M, T


def has_family(family: str) -> bool:
    """Whether the installed ``transformers`` provides the classes of ``family``."""
    try:
        _classes(family)
        return True
    except ImportError:
        return False


def qwen_config(name: str, *, attn_implementation: str = "sdpa"):
    """The ``transformers`` config of a named model (``MODEL_NAMES``)."""
    if name not in _SPECS:
        raise ValueError(f"name must be one of {MODEL_NAMES}, got {name!r}")
    family, text, vision, top = _SPECS[name]
    cfg_cls = _classes(family)[0]
    cfg = cfg_cls(text_config=dict(text, rope_parameters=dict(text["rope_parameters"])),
                  vision_config=dict(vision), **top)
    cfg._attn_implementation = attn_implementation
    cfg.text_config._attn_implementation = attn_implementation
    cfg.vision_config._attn_implementation = attn_implementation
    return cfg


def build_qwen(name: str, *, seed: int = 0, dtype: torch.dtype = torch.float32,
               device: str | torch.device = "cpu", text_only: bool = False) -> torch.nn.Module:
    """A random-weight model of ``name`` in eval mode (``...ForConditionalGeneration``).

    ``text_only=True`` builds just the language model (``...TextModel``; no vision tower, no
    LM head), e.g. for prefill timing of a 7B config on a GPU. Parameters are created
    directly in ``dtype`` on ``device``.
    """
    cfg = qwen_config(name)
    _, model_cls, text_cls = _classes(_SPECS[name][0])
    torch.manual_seed(seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = text_cls(cfg.text_config) if text_only else model_cls(cfg)
    finally:
        torch.set_default_dtype(old)
    return model.eval()


# ----------------------------------------------------------------------------- the reference call
def reference_input_ids(model: torch.nn.Module, grid_hw: tuple[int, int],
                        text_before: torch.Tensor | None, text_after: torch.Tensor | None,
                        batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids [B, S]`` and ``mm_token_type_ids [B, S]`` of the unmodified full-image prompt."""
    tb, ta = _ids(text_before, batch), _ids(text_after, batch)
    img = torch.full((batch, grid_hw[0] * grid_hw[1]), model.config.image_token_id)
    ids = torch.cat([tb, img, ta], dim=1)
    mm = torch.zeros_like(ids, dtype=torch.int32)
    mm[:, tb.shape[1]:tb.shape[1] + img.shape[1]] = 1
    return ids, mm


@torch.no_grad()
def reference_forward(model: torch.nn.Module, images: torch.Tensor,
                      text_before: torch.Tensor | None = None,
                      text_after: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The unmodified model call on the full image: ``(logits [B,S,V], position_ids [3,B,S])``.

    Position ids come from ``model.model.get_rope_index``; the logits from
    ``model(input_ids, pixel_values=..., image_grid_thw=..., mm_token_type_ids=...)``.
    """
    family = family_of(model)
    pv, thw = pixel_values(images, family)
    hm, wm = int(thw[0, 1]) // QWEN_MERGE, int(thw[0, 2]) // QWEN_MERGE
    ids, mm = reference_input_ids(model, (hm, wm), text_before, text_after, images.shape[0])
    pos, _ = model.model.get_rope_index(ids, mm, image_grid_thw=thw)
    model.model.rope_deltas = None
    out = model(input_ids=ids, pixel_values=pv, image_grid_thw=thw, mm_token_type_ids=mm,
                use_cache=False)
    model.model.rope_deltas = None
    return out.logits, pos


# ----------------------------------------------------------------------------- FLOPs and parameters
def lm_prefill_flops(text_config, seq_len: int, *, batch: int = 1, causal: bool = True,
                     logits_to_keep: int = 1) -> dict:
    """Matmul FLOPs of one language-model prefill, from the config (1 multiply-add = 2 FLOPs).

    With ``d`` hidden size, ``L`` layers, ``h`` / ``g`` query / key-value heads of size
    ``e``, ``f`` MLP width, ``V`` vocabulary, ``S`` tokens and ``P`` attended pairs
    (``S (S + 1) / 2`` causal, ``S^2`` dense), per sequence::

        linear    = L * 2 S (d h e + 2 d g e + h e d + 3 d f)      # q, k, v, o, SwiGLU MLP
        attention = L * 4 P h e                                     # Q K^T and A V
        head      = 2 * logits_to_keep * d * V                      # LM head on kept positions

    Norms, RoPE, softmax and the embedding lookup (O(S d) or O(P h)) are not counted.
    Returns ``{"linear", "attention", "head", "total"}`` for ``batch`` sequences.
    """
    if seq_len < 1 or batch < 1:
        raise ValueError(f"seq_len and batch must be >= 1, got {seq_len}, {batch}")
    c = text_config
    d, L, h, f, V = c.hidden_size, c.num_hidden_layers, c.num_attention_heads, \
        c.intermediate_size, c.vocab_size
    g = c.num_key_value_heads or h
    e = getattr(c, "head_dim", None) or d // h
    s = seq_len
    pairs = s * (s + 1) / 2 if causal else s * s
    linear = L * 2 * s * (d * h * e + 2 * d * g * e + h * e * d + 3 * d * f)
    attention = L * 4 * pairs * h * e
    head = 2 * min(logits_to_keep or s, s) * d * V
    out = {"linear": linear, "attention": attention, "head": head}
    out = {k: float(v * batch) for k, v in out.items()}
    out["total"] = sum(out.values())
    return out


def lm_parameter_count(text_config) -> int:
    """Parameters of the decoder stack (embeddings and LM head excluded), from the config."""
    c = text_config
    d, h, f = c.hidden_size, c.num_attention_heads, c.intermediate_size
    g = c.num_key_value_heads or h
    e = getattr(c, "head_dim", None) or d // h
    return int(c.num_hidden_layers * (d * h * e + 2 * d * g * e + h * e * d + 3 * d * f))
