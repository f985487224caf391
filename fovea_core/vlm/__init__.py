"""Into a real VLM: M-RoPE position ids for a TokenSet and the bridge into Qwen-VL models.

``positions`` is pure torch (no transformers import); ``qwen`` imports transformers lazily
in its model builders; ``processor`` (``FoveatedProcessor``: a page and a prompt to the
inputs of ``model.generate`` for a foveated page) imports it when called.
"""

from fovea_core.vlm.positions import (MRopePositions, footprint_weights, full_grid_tokens,
                                      merged_cell_px, merged_cells, merged_grid_shape,
                                      mrope_positions, rope2d_angles, token_scale)
from fovea_core.vlm.processor import (FROM_TEXT, SUPPORTED_PROCESSORS, FoveatedProcessor,
                                      offline_tokenizer, processor_family, stock_processor)

__all__ = ["FROM_TEXT", "FoveatedProcessor", "SUPPORTED_PROCESSORS", "offline_tokenizer", "processor_family",
           "stock_processor", "MRopePositions", "footprint_weights", "full_grid_tokens",
           "merged_cell_px", "merged_cells", "merged_grid_shape", "mrope_positions",
           "rope2d_angles", "token_scale"]
