"""Two-part questions (chapter 14): questions whose answer needs two distant parts of a page.

The documents carry single-field questions ("What is the total?"). A *two-part* question
asks two of them at once (:data:`PAIRS`: the header date and the footer citation, ...):

* :func:`two_part` builds its rows from a sweep's single-field rows: it counts as read only
  as far as *both* parts are read, so its ``anls``, ``em`` and ``ceiling_anls`` are the
  minimum of its parts';
* :func:`by_question_type` puts single-field and two-part rows in one table, the question
  type in the dataset name, so one paired family covers both;
* :func:`pair_questions` turns a page's pairs into single questions (joined text, joined
  answer, both parts' boxes) for scorers that read the question;
* :func:`pair_parts` shows which questions make each pair on one page, and
  :func:`claim_line` says the chapter's claim (two-part and single-field verdicts of one
  comparison) in a sentence.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from fovea_book.eval.document_types import Document, Question

__all__ = ["PAIRS", "PAIR_KEYS", "two_part", "by_question_type", "pair_questions",
           "pair_parts", "claim_line"]

#: the field pairs of the two-part questions: (first part, second part)
PAIRS: tuple[tuple[str, str], ...] = (("date", "citation"), ("date", "total"),
                                      ("title", "total"), ("company", "total"))
#: the columns that identify one page's answer under one allocation (the join key of parts)
PAIR_KEYS: tuple[str, ...] = ("dataset", "doc_id", "allocator", "budget")
_SCORES = ("anls", "em", "ceiling_anls")


def _check_pairs(pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    pairs = [tuple(p) for p in pairs]
    if not pairs or any(len(p) != 2 or not all(isinstance(f, str) for f in p) for p in pairs):
        raise ValueError(f"pairs must be a non-empty sequence of (field, field) string pairs, "
                         f"got {pairs!r}")
    return pairs


def two_part(table: pd.DataFrame, pairs: Sequence[tuple[str, str]] = PAIRS) -> pd.DataFrame:
    """One row per page x pair x allocator x budget: the minimum of the two parts' scores.

    ``table`` holds sweep rows (one per single-field question) with at least
    :data:`PAIR_KEYS`, ``field``, ``anls``, ``em`` and ``ceiling_anls``. Each output row is
    the first part's row with ``field`` and ``qid`` set to ``"a+b"``, the three scores
    replaced by the element-wise minimum of the two parts' and the second part's scores
    kept as ``anls_b, em_b, ceiling_anls_b``; a page without both fields has no row for
    that pair. Rows come pair by pair (in ``pairs`` order), each in ``table``'s order.
    """
    need = set(PAIR_KEYS) | {"field", *_SCORES}
    missing = sorted(need - set(table.columns))
    if missing:
        raise ValueError(f"two_part: table lacks the columns {missing}")
    keys = list(PAIR_KEYS)
    out = []
    for a, b in _check_pairs(pairs):                                   # over the few pairs
        m = table[table.field == a].merge(table[table.field == b][keys + list(_SCORES)],
                                          on=keys, suffixes=("", "_b"))
        out.append(m.assign(field=f"{a}+{b}", qid=f"{a}+{b}",
                            **{c: m[[c, f"{c}_b"]].min(axis=1) for c in _SCORES}))
    return pd.concat(out, ignore_index=True)


def by_question_type(table: pd.DataFrame, pairs: Sequence[tuple[str, str]] = PAIRS
                     ) -> pd.DataFrame:
    """Single-field rows (``dataset`` suffixed ``" | single-field"``) then the
    :func:`two_part` rows (``" | two-part"``) in one table, so one
    :func:`~fovea_book.eval.stats.paired_family` covers both question types."""
    return pd.concat([table.assign(dataset=table.dataset + " | single-field"),
                      two_part(table, pairs).assign(dataset=lambda d: d.dataset + " | two-part")],
                     ignore_index=True)


def pair_questions(doc: Document, pairs: Sequence[tuple[str, str]] = PAIRS
                   ) -> tuple[Question, ...]:
    """``doc``'s two-part questions as single questions: qid and field ``"a+b"``, the two
    questions' texts joined by a space, the answer their first answers joined by a space,
    both parts' boxes, and the smaller of their text sizes. One question per pair and per
    pair of questions with those fields (none when the page lacks a field)."""
    return tuple(
        Question(f"{a}+{b}", f"{qa.question} {qb.question}",
                 (f"{qa.answers[0]} {qb.answers[0]}",), qa.boxes + qb.boxes, f"{a}+{b}",
                 min(qa.size_px, qb.size_px))
        for a, b in _check_pairs(pairs) for qa in doc.questions if qa.field == a
        for qb in doc.questions if qb.field == b)


def pair_parts(doc: Document, pairs: Sequence[tuple[str, str]] = PAIRS) -> pd.DataFrame:
    """``pair, parts``: for each pair whose two fields ``doc`` asks about, the questions of
    those fields joined by ``" / "`` (what a reader sees of the construction)."""
    fields = {q.field for q in doc.questions}
    return pd.DataFrame([dict(pair=f"{a}+{b}", parts=" / ".join(q.question for q in doc.questions
                                                               if q.field in (a, b)))
                         for a, b in _check_pairs(pairs) if {a, b} <= fields])


def claim_line(claim: pd.DataFrame, dataset: str, *,
               missing: str = "not measured (no SROIE data)") -> str:
    """The claim of a :func:`~fovea_book.eval.stats.paired_family` table over
    :func:`by_question_type` rows, for ``dataset``, as markdown: ``"two-part questions
    **better** (+3.1 [0.5, 5.6] ANLS points, n = 40); single-field questions **no
    detectable difference** (...)"``; ``missing`` when ``claim`` has no two-part row of
    ``dataset`` (one comparison per dataset and question type is expected)."""
    cl = claim.set_index("dataset")
    key = f"{dataset} | two-part"
    if key not in cl.index:
        return missing
    two, one = cl.loc[key], cl.loc[f"{dataset} | single-field"]
    return (f"two-part questions **{two.verdict}** ({two.text} ANLS points, "
            f"n = {two.n_docs}); single-field questions **{one.verdict}** ({one.text})")
