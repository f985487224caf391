"""How the questions are phrased: the wording sets (:data:`WORDING_SETS`), their templates
per field (:data:`WORDINGS`, :data:`FORM_WORDINGS`), and :func:`phrase` / :func:`reword`,
which draw a template per question. The pages never depend on the wording. Re-exported by
:mod:`fovea_book.eval.documents`."""

from __future__ import annotations

__all__ = ["FORM_FIELD", "FORM_WORDINGS", "WORDINGS", "WORDING_SETS", "check_wording",
           "phrase", "reword", "wording_key"]

#: the wording sets of :func:`make_document`, :func:`fovea_book.eval.sroie.load_sroie` and
#: :func:`fovea_book.eval.funsd.load_funsd`
WORDING_SETS = ("default", "train", "heldout")

#: ``WORDINGS[set][field]``: the phrasings of a question about ``field`` (``{item}`` is the
#: table row an ``amount`` question names). ``"default"`` holds the one phrasing the book
#: has always asked; ``"train"`` and ``"heldout"`` are disjoint pools (no template in both),
#: so a model trained on one is tested on wordings it has never seen.
WORDINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "default": {
        "date": ("What is the date in the header?",),
        "title": ("What is the title?",),
        "author": ("Who is the first author?",),
        "formula": ("What is the formula?",),
        "amount": ("What is the amount for {item}?",),
        "total": ("What is the total in the table?",),
        "citation": ("What does the footer cite?",),
        # receipts and invoices (the SROIE key fields, phrased as in sroie.QUESTIONS)
        "company": ("What is the company?",),
        "address": ("What is the address?",),
        "receipt_date": ("What is the date?",),
        "receipt_total": ("What is the total?",),
    },
    "train": {
        "date": ("What date is printed at the top of the page?",
                 "When was this issue published?", "Which date appears in the running header?",
                 "Give the date shown above the title.", "What is the publication date?",
                 "When is this page dated?", "Read the date in the top right corner.",
                 "Which day, month and year head the page?"),
        "title": ("What is the paper called?", "What is the heading of the article?",
                  "Name the title of this document.", "What is the name of this paper?",
                  "What does the big bold headline say?", "Which title is printed at the top?",
                  "What is the article's title?", "Give the document's heading."),
        "author": ("Who wrote this paper first?", "What is the name of the lead author?",
                   "Which author is listed first?", "Name the first person in the byline.",
                   "Who is the first writer named under the title?", "Who leads the author list?",
                   "What is the first author's name?", "Which researcher is named first?"),
        "formula": ("What equation is shown?", "Which formula is displayed in the text?",
                    "What is f equal to?", "Write down the displayed equation.",
                    "What is the polynomial on the page?", "Which expression is centred in the text?",
                    "What does the equation say?", "Give the formula for f."),
        "amount": ("How much does {item} cost?", "What amount is listed for {item}?",
                   "What is the price of {item} in the table?", "How much is charged for {item}?",
                   "What is the {item} amount?", "Which amount does the {item} row show?",
                   "What does {item} come to?", "How much was spent on {item}?"),
        "total": ("What is the table's total?", "What is the sum of the amounts?",
                  "What is the total amount in the table?", "What does the Total row say?",
                  "How much do all the items cost together?", "What is the overall sum?",
                  "Give the total at the end of the table.", "What is the table total?"),
        "citation": ("Which reference is cited at the bottom?",
                     "What source does the page cite?", "What is cited in the footer?",
                     "Which publication does the footnote refer to?",
                     "What reference is given in the footer line?", "Who is cited at the bottom?",
                     "What work does the footer mention?", "Give the citation in the footer."),
        "company": ("What is the name of the store?", "Which company issued this receipt?",
                    "What business is this from?", "Who is the seller?",
                    "What is the shop called?", "Which firm is named at the top?",
                    "What is the vendor?", "Name the company that printed this."),
        "address": ("What is the store's address?", "Where is the shop located?",
                    "What address is printed at the top?", "Where is the seller based?",
                    "What is the company's street address?", "Give the address of the store.",
                    "Where can the shop be found?", "Which address does the header give?"),
        "receipt_date": ("What is the date of the receipt?", "When was this issued?",
                         "On which date was the purchase made?", "What date is printed on it?",
                         "When did the sale happen?", "What is the transaction date?",
                         "Which date does the invoice show?", "When was the bill printed?"),
        "receipt_total": ("What is the total amount?", "How much was paid in total?",
                          "What is the amount due?", "How much did the customer pay?",
                          "What is the total to pay?", "What does the bill come to?",
                          "What is the final total?", "How much is owed altogether?"),
    },
    "heldout": {
        "date": ("On what day was this document dated?",
                 "Tell me the date shown in the page header."),
        "title": ("What is this article titled?", "Which title does the document have?"),
        "author": ("Whose name comes first in the author list?",
                   "Who is the principal author?"),
        "formula": ("Which mathematical expression appears on the page?",
                    "What function is defined in the displayed equation?"),
        "amount": ("What is the cost of {item}?", "{item}: what amount is listed?"),
        "total": ("What do the table amounts add up to?", "What is the grand total?"),
        "citation": ("What reference appears at the very bottom of the page?",
                     "Which work is cited at the foot of the page?"),
        "company": ("Which shop printed this?", "What is the merchant's name?"),
        "address": ("At what location is the business?", "Give the merchant's street address."),
        "receipt_date": ("What day does this transaction date from?",
                         "Which day was this bill issued on?"),
        "receipt_total": ("What was the final amount charged?",
                          "What is the grand total to pay?"),
    },
}


#: the pseudo-field of :func:`phrase` for a form's question (FUNSD): its templates, in
#: :data:`FORM_WORDINGS`, have a ``{key}`` slot (the form's own label, e.g. ``DATE``)
FORM_FIELD = "form"

#: ``FORM_WORDINGS[set]``: the phrasings of a question about a form's key (a FUNSD question
#: entity's text without its trailing colon). Forms have an open set of keys, so the templates
#: are key-agnostic, with a ``{key}`` slot. Kept apart from :data:`WORDINGS`, whose pools the
#: cascade's training vocabulary enumerates with an ``{item}`` slot only. ``"train"`` and
#: ``"heldout"`` are disjoint, so a model trained on one is tested on wordings it has never
#: seen, as for the receipts.
FORM_WORDINGS: dict[str, tuple[str, ...]] = {
    "default": ("What is the {key}?",),
    "train": ("What is written next to {key}?", "What was entered for {key}?",
              "Which value is given for {key}?", "Read the entry for {key}.",
              "What does the field {key} contain?", "Give the value of {key}.",
              "What has been filled in for {key}?", "Tell me the {key} on this form."),
    "heldout": ("What does the form say for {key}?", "{key}: what is written?",
                "Which answer does the form give to {key}?", "Find {key} on the form."),
}


def check_wording(wording: str) -> None:
    if wording not in WORDING_SETS:
        raise ValueError(f"wording must be one of {WORDING_SETS}, got {wording!r}")


def phrase(field: str, wording: str, pick: int, **slots: str) -> str:
    """The question about ``field`` in wording set ``wording``: template ``pick`` (modulo the
    pool size) with its ``{slots}`` filled. ``field`` :data:`FORM_FIELD` takes a template
    of :data:`FORM_WORDINGS` (slot ``key``)."""
    check_wording(wording)
    pool = FORM_WORDINGS[wording] if field == FORM_FIELD else WORDINGS[wording].get(field)
    if not pool:
        raise ValueError(f"no {wording!r} wording for field {field!r}")
    return pool[pick % len(pool)].format(**slots)


def wording_key(field: str, source: str) -> str:
    """The key of :data:`WORDINGS` for a question field (receipt/invoice ``date`` and
    ``total`` are phrased as in SROIE, not as the paper's header date and table total; every
    form question, ``source == "funsd"``, is phrased from :data:`FORM_WORDINGS`)."""
    if source == "funsd":
        return FORM_FIELD
    if source in ("receipt", "invoice", "sroie") and field in ("date", "total"):
        return f"receipt_{field}"
    return field


def reword(questions, wording: str, seed: int, source: str = "synthetic") -> tuple:
    """``questions`` with their text replaced by a phrasing of ``wording`` (answers and
    boxes unchanged). ``"default"`` returns them as they are. The template of each question
    is drawn from its own stream (seeded by ``seed``, the field and the wording set), so
    the page, its answers and the other questions do not change with the wording.
    ``source == "funsd"``: each question's ``field`` is its form key, the ``{key}`` slot of
    :data:`FORM_WORDINGS`."""
    import zlib
    from dataclasses import replace

    check_wording(wording)
    if wording == "default":
        return tuple(questions)
    out = []
    for q in questions:  # a handful of questions per page
        key = wording_key(q.field, source)
        pick = zlib.crc32(f"{seed}:{q.qid}:{wording}".encode())
        slots = {}
        if key == FORM_FIELD:
            slots["key"] = q.field
        elif q.field == "amount":
            slots["item"] = q.question.removeprefix("What is the amount for ").rstrip("?")
        out.append(replace(q, question=phrase(key, wording, pick, **slots)))
    return tuple(out)
