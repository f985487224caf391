"""Rules tried on pages unlike the training pages and dropped (the book's appendix chapters).

Each was fitted on photograph-like training pages, read on the WildReceipt photographs and the
dev scans, and is kept with its record so the book can show it, apart from what ``foveate``'s
default (``cascade_glance``) rests on: :mod:`fovea_book.eval.glance_rule` and
:mod:`fovea_book.eval.reading_fit` fit the default, :mod:`fovea_book.eval.fitting` holds what
every fit shares.

* :mod:`~fovea_book.eval.tried.resize_rule`: spend N like ``resize`` on a small page;
* :mod:`~fovea_book.eval.tried.confidence_rule`: spend N like ``resize`` when the map is unsure;
* :mod:`~fovea_book.eval.tried.safe_rule`: ... or when the page's text is legible in
  ``resize``'s view (``cascade_safe``).
"""
