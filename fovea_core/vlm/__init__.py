"""Into a real VLM: M-RoPE position ids for a TokenSet and the bridge into Qwen-VL models.

``positions`` is pure torch (no transformers import); ``qwen`` imports transformers lazily
in its model builders. ``fovea_core.vlm.processor`` (``FoveatedProcessor``: a page and a
prompt to the inputs of ``model.generate`` for a foveated page) is a user entry point built on
:func:`fovea_core.foveate` (the top layer), so this package does not import it: use
``from fovea_core.vlm.processor import FoveatedProcessor``.
"""

from fovea_core.vlm.positions import (MRopePositions, footprint_weights, full_grid_tokens,
                                      merged_cell_px, merged_cells, merged_grid_shape,
                                      mrope_positions, rope2d_angles, token_scale)

__all__ = ["MRopePositions", "footprint_weights", "full_grid_tokens",
           "merged_cell_px", "merged_cells", "merged_grid_shape", "mrope_positions",
           "rope2d_angles", "token_scale"]
