"""Evaluation harness: documents with question/answer boxes, an OCR reader, metrics, sweeps.

The measure: at a fixed token budget, how much of the task-relevant text
survives in what the model would see. A real OCR model reads the answer region of the
foveated reconstruction; ANLS against the ground truth, divided by the same reader's
score on the full-resolution image, is the "fraction of ceiling kept".

Submodules (imported lazily, so ``import fovea_book.eval`` stays cheap):

- :mod:`fovea_book.eval.documents`  deterministic synthetic DocVQA-like pages
- :mod:`fovea_book.eval.sroie`      the SROIE receipts as question/answer documents
- :mod:`fovea_book.eval.funsd`      the FUNSD forms as question/answer documents
- :mod:`fovea_book.eval.reader`     rapidocr recognition on answer crops, cached by hash
- :mod:`fovea_book.eval.metrics`    ANLS, exact match, coverage, bootstrap CIs
- :mod:`fovea_book.eval.evaluator`  the one per-document evaluator (rows, method hooks,
                                    cell cache, in-process / process-pool dispatch)
- :mod:`fovea_book.eval.sweep`      allocators x budgets x datasets -> tidy table
"""
