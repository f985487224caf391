"""The three synthetic page layouts: ``"paper"`` (:func:`make_document`'s default, a
scientific or business page), ``"receipt"`` (:func:`make_receipt`, a scanned shop receipt
with SROIE's key fields) and ``"invoice"`` (:func:`make_invoice`, held out from the
cascade's training), each a pure function of its seed; :func:`synthetic_documents` draws
several. Drawn with :mod:`fovea_book.eval.raster`, phrased with
:mod:`fovea_book.eval.wordings`. Re-exported by :mod:`fovea_book.eval.documents`."""

from __future__ import annotations

import numpy as np

from fovea_book.eval.document_types import Box, Document, Question, TextElement
from fovea_book.eval.raster import Canvas, Page, finish_page
from fovea_book.eval.wordings import WORDINGS, check_wording, reword

__all__ = ["LAYOUTS", "make_document", "make_invoice", "make_receipt", "synthetic_documents"]

#: page layouts of :func:`make_document`
LAYOUTS = ("paper", "receipt", "invoice")

_WORDS = (
    "analysis method results model data sample signal image vision token budget retina "
    "fovea periphery density pyramid level patch scale window region report study design "
    "system network layer output input value measure error noise contrast detail field "
    "centre border margin table total figure section review summary process quality level "
    "control market growth price sales order account balance policy energy water light "
    "colour shape motion memory attention language reading letter number record record "
    "survey group effect change factor rate area point line surface structure function "
    "simple strong early local global visual human natural formal direct common public"
).split()
_TITLE_WORDS = (
    "Adaptive Foveated Sampling Visual Tokens Retinal Budgets Sparse Attention Document "
    "Understanding Efficient Cortical Magnification Dynamic Resolution Learned Allocation "
    "Multiscale Reading Receipts Layout Analysis Robust Scene Text Fixation Guided Coverage"
).split()
_SURNAMES = ("Moreau Tanaka Okafor Lindqvist Castillo Novak Haddad Petrov Rossi Schmidt "
             "Oliveira Kowalski Nakamura Brennan Duarte Weber Larsen Costa Ferreira Ahmed").split()
_INITIALS = "ABCDEFGHJKLMNPRST"
_MONTHS = ("January February March April May June July August September October "
           "November December").split()
_JOURNALS = ("Journal of Synthetic Documents", "Proceedings of Vision Budgets",
             "Annals of Token Allocation", "Review of Foveated Systems")
_VENUES = ("J. Vis.", "Vision Res.", "Proc. CVPR", "Proc. ICDAR", "Nat. Neurosci.", "TPAMI")
_ITEMS = ("Sensors", "Lenses", "Cables", "Licences", "Storage", "Labour", "Travel",
          "Printing", "Shipping", "Support", "Training", "Hosting")
_NOTES = ("see Fig. 2", "revised", "cf. Eq. 1", "draft", "checked", "see Table 1",
          "note 4", "verified")


def _money(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(np.round(rng.uniform(lo, hi), 2))


def _fmt_money(v: float) -> str:
    return f"{v:,.2f}"


def _sentence_lines(page: Page, rng: np.random.Generator, width: int, size: int,
                    n_lines: int) -> list[str]:
    """Greedy word wrap of random words into ``n_lines`` lines at most ``width`` px wide."""
    words = list(rng.choice(_WORDS, size=n_lines * 16))
    lines, cur = [], ""
    for w in words:  # string layout, not a tensor loop
        trial = f"{cur} {w}".strip()
        if page.width_of(trial, "DejaVuSans.ttf", size) > width:
            lines.append(cur)
            cur = w
            if len(lines) == n_lines:
                break
        else:
            cur = trial
    return lines


def make_document(seed: int, *, width: int = 1024, height: int = 1024,
                  doc_id: str | None = None, layout: str = "paper",
                  wording: str = "default") -> Document:
    """Render one synthetic page deterministically from ``seed``.

    Args:
        seed: any non-negative integer; the page is a pure function of it.
        width, height: page size in pixels for ``layout="paper"`` (the layout is designed
            for 1024 x 1024; accepted range 768..2048 each). The other layouts choose their
            own size from the seed.
        doc_id: default ``syn{seed:05d}`` (paper) or ``{layout}{seed:05d}``.
        layout: one of :data:`LAYOUTS`: ``"paper"`` (default, below), ``"receipt"``
            (:func:`make_receipt`) or ``"invoice"`` (:func:`make_invoice`).
        wording: how the questions are phrased, one of :data:`WORDING_SETS`:
            ``"default"`` (one fixed phrasing per field, the book's questions),
            ``"train"`` / ``"heldout"`` (a phrasing drawn per question from two disjoint
            template pools, :data:`WORDINGS`; the learned localiser of the cascade is
            trained on ``"train"`` and evaluated on ``"heldout"``). The page image does
            not depend on the wording.

    Returns:
        A :class:`Document`; for the paper layout ~40 text elements and 7 questions
        (title, first author, header date, formula, a table amount, the table total, the
        footer citation).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    check_wording(wording)
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    if layout == "receipt":
        return make_receipt(seed, doc_id=doc_id, wording=wording)
    if layout == "invoice":
        return make_invoice(seed, doc_id=doc_id, wording=wording)
    if not (768 <= width <= 2048 and 768 <= height <= 2048):
        raise ValueError(f"width and height must be in [768, 2048], got {width} x {height}")
    rng = np.random.default_rng(seed)
    page = Page(width, height)
    left, right = 112, width - 80
    content = right - left
    q: list[Question] = []

    def ask(qid: str, question: str, el: TextElement, field_: str, *alternatives: str):
        q.append(Question(qid, question, (el.text, *alternatives), (el.box,), field_, el.size_px))

    # running header: journal (left) and date (right), 10-12 px
    hs = int(rng.integers(10, 13))
    page.text((left, 28), str(rng.choice(_JOURNALS)), "header", hs)
    date = f"{rng.choice(_MONTHS)} {int(rng.integers(1, 29))}, {int(rng.integers(1995, 2026))}"
    el = page.text((right - page.width_of(date, "DejaVuSans.ttf", hs), 28), date, "header", hs)
    ask("date", "What is the date in the header?", el, "date")
    page.rule(left, right, 28 + hs + 10)

    # title, 20-28 px bold
    ts = int(rng.integers(20, 29))
    nwords = int(rng.integers(3, 6))
    title = " ".join(rng.choice(_TITLE_WORDS, size=nwords, replace=False))
    while page.width_of(title, "DejaVuSans-Bold.ttf", ts) > content:
        title = title.rsplit(" ", 1)[0]
    y = 80
    el = page.text((left, y), title, "title", ts, "DejaVuSans-Bold.ttf")
    ask("title", "What is the title?", el, "title")
    y += ts + 18

    # authors, 12-15 px
    aus = int(rng.integers(12, 16))
    names = [f"{rng.choice(list(_INITIALS))}. {s}"
             for s in rng.choice(_SURNAMES, size=3, replace=False)]
    x = left
    for i, name in enumerate(names):
        el = page.text((x, y), name, "authors", aus)
        if i == 0:
            ask("author", "Who is the first author?", el, "author")
        x += page.width_of(name + "     ", "DejaVuSans.ttf", aus)
    y += aus + 26

    # body paragraph(s), 11-14 px
    bs = int(rng.integers(11, 15))
    lead = int(bs * 1.55)

    def paragraph(y: int, n: int) -> int:
        for line in _sentence_lines(page, rng, content, bs, n):
            page.text((left, y), line, "paragraph", bs)
            y += lead
        return y + 12

    y = paragraph(y, int(rng.integers(4, 7)))

    # formula, 15-20 px serif italic, centred
    fs = int(rng.integers(15, 21))
    a, b, c = int(rng.integers(2, 10)), int(rng.integers(2, 10)), int(rng.integers(1, 20))
    var = str(rng.choice(list("xtuz")))
    formula = f"f({var}) = {a}{var}\u00b2 + {b}{var} - {c}"
    fw = page.width_of(formula, "DejaVuSerif-Italic.ttf", fs)
    el = page.text(((left + right - fw) // 2, y + 6), formula, "formula", fs,
                   "DejaVuSerif-Italic.ttf")
    ask("formula", "What is the formula?", el, "formula", formula.replace("\u00b2", "^2"),
        formula.replace("\u00b2", "2"))
    y += fs + 30

    y = paragraph(y, int(rng.integers(2, 4)))

    # table: Item | Qty | Amount, 4-6 rows, Total row; 11-15 px
    tsz = int(rng.integers(11, 16))
    rows = int(rng.integers(4, 7))
    items = list(rng.choice(_ITEMS, size=rows, replace=False))
    qty = rng.integers(1, 20, size=rows)
    amounts = [_money(rng, 10, 900) for _ in range(rows)]
    total = float(np.round(sum(amounts), 2))
    tl, tr = left + 40, right - 40
    cols = (tl + 8, tl + int(0.55 * (tr - tl)), tr - 8)  # item x0, qty x0, amount right edge
    rh = int(tsz * 1.9)
    page.rule(tl, tr, y, 2)
    y += 8
    page.text((cols[0], y), "Item", "table", tsz, "DejaVuSans-Bold.ttf")
    page.text((cols[1], y), "Qty", "table", tsz, "DejaVuSans-Bold.ttf")
    page.text((cols[2] - page.width_of("Amount", "DejaVuSans-Bold.ttf", tsz), y), "Amount",
              "table", tsz, "DejaVuSans-Bold.ttf")
    y += rh
    page.rule(tl, tr, y - 6)
    pick = int(rng.integers(0, rows))
    for i in range(rows):  # a handful of table rows
        page.text((cols[0], y), items[i], "table", tsz)
        page.text((cols[1], y), str(int(qty[i])), "table", tsz)
        s = _fmt_money(amounts[i])
        el = page.text((cols[2] - page.width_of(s, "DejaVuSans.ttf", tsz), y), s, "table", tsz)
        if i == pick:
            ask("amount", f"What is the amount for {items[i]}?", el, "amount")
        y += rh
    page.rule(tl, tr, y - 6)
    page.text((cols[0], y), "Total", "table", tsz, "DejaVuSans-Bold.ttf")
    s = _fmt_money(total)
    el = page.text((cols[2] - page.width_of(s, "DejaVuSans-Bold.ttf", tsz), y), s, "table", tsz,
                   "DejaVuSans-Bold.ttf")
    ask("total", "What is the total in the table?", el, "total")
    y += rh
    page.rule(tl, tr, y - 4, 2)
    y += 20

    # more body text while it fits above the footer
    footer_y = height - 44
    n_more = max(0, (footer_y - 40 - y) // lead)
    y = paragraph(y, int(min(n_more, rng.integers(6, 16))))

    # margin notes in the left margin, 8-10 px
    for ny in np.sort(rng.choice(np.arange(200, footer_y - 60, 40), size=3, replace=False)):
        page.text((12, int(ny)), str(rng.choice(_NOTES)), "margin", int(rng.integers(8, 11)))

    # footer: citation (left) and page number (right), 9-11 px
    fts = int(rng.integers(9, 12))
    page.rule(left, right, footer_y - 10)
    label = "Cites:"
    page.text((left, footer_y), label, "footer", fts)
    cite = (f"{rng.choice(_SURNAMES)} et al. ({int(rng.integers(1980, 2025))}) "
            f"{rng.choice(_VENUES)} {int(rng.integers(1, 60))}")
    el = page.text((left + page.width_of(label + " ", "DejaVuSans.ttf", fts), footer_y), cite,
                   "footer", fts)
    ask("citation", "What does the footer cite?", el, "citation")
    pno = str(int(rng.integers(1, 400)))
    page.text((right - page.width_of(pno, "DejaVuSans.ttf", fts), footer_y), pno, "footer", fts)

    gray = np.asarray(page.img)
    image = np.repeat(gray[:, :, None], 3, axis=2)
    return Document(doc_id or f"syn{seed:05d}", image, reword(q, wording, seed),
                    tuple(page.elements), "synthetic")


def synthetic_documents(n: int, seed: int = 0, **kwargs) -> list[Document]:
    """``n`` pages with seeds ``seed, seed+1, ...`` (see :func:`make_document`; keyword
    arguments such as ``layout=`` and ``wording=`` are passed on)."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return [make_document(seed + i, **kwargs) for i in range(n)]

_SHOP_WORDS = ("GOLDEN MART SUNRISE EVERGREEN HAPPY FAMILY METRO CITY ROYAL PEARL OCEAN "
               "GREEN LEAF LUCKY STAR UNITED PRIME DAILY FRESH SILVER MOON KING MAPLE").split()
_SHOP_KINDS = ("TRADING", "HARDWARE", "BOOKSTORE", "PHARMACY", "BAKERY", "RESTAURANT",
               "MINI MARKET", "STATIONERY", "ELECTRICAL", "FOOD COURT", "CAFE", "SUPPLIES")
_SHOP_SUFFIX = ("SDN BHD", "SDN. BHD.", "ENTERPRISE", "LTD", "& CO", "")
_STREETS = ("JALAN", "LORONG", "PERSIARAN", "HIGH STREET", "MAIN ROAD", "AVENUE")
_STREET_NAMES = ("SS 2/24", "MERANTI", "BUNGA RAYA", "KENANGA", "PARK", "STATION", "MAHSURI",
                 "UTAMA", "CEMPAKA", "HARBOUR", "MARKET", "KLANG LAMA")
_AREAS = ("TAMAN SRI MUDA", "BANDAR BARU", "TAMAN MELATI", "SEKSYEN 13", "TAMAN DESA",
          "KAWASAN PERINDUSTRIAN", "OLD TOWN", "WESTFIELD")
_CITIES = ("SHAH ALAM", "PETALING JAYA", "KUALA LUMPUR", "KLANG", "JOHOR BAHRU", "IPOH",
           "SEREMBAN", "KAJANG", "PUCHONG", "SUBANG JAYA")
_STATES = ("SELANGOR", "WILAYAH PERSEKUTUAN", "JOHOR", "PERAK", "NEGERI SEMBILAN", "")
_GOODS = ("BREAD", "MILK 1L", "EGGS 10S", "RICE 5KG", "SUGAR", "COFFEE", "TEA BAGS", "PEN BLUE",
          "A4 PAPER", "NOTEBOOK", "BATTERY AA", "SCREW 2IN", "PAINT 1L", "NOODLES", "SOAP",
          "CHICKEN RICE", "ICED TEA", "MEE GORENG", "TISSUE", "WATER 1.5L", "GLUE", "TAPE")
_RECEIPT_FONTS = ("DejaVuSansMono.ttf", "cmtt10.ttf", "DejaVuSans.ttf", "STIXGeneral.ttf")


def _date_string(rng: np.random.Generator) -> str:
    d, m, y = int(rng.integers(1, 29)), int(rng.integers(1, 13)), int(rng.integers(2015, 2020))
    mon = ("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC").split()[m - 1]
    styles = (f"{d:02d}/{m:02d}/{y}", f"{d:02d}-{m:02d}-{y}", f"{y}-{m:02d}-{d:02d}",
              f"{d:02d}/{m:02d}/{y % 100:02d}", f"{d:02d} {mon} {y}", f"{d:02d}.{m:02d}.{y}")
    return styles[int(rng.integers(0, len(styles)))]


def _company(rng: np.random.Generator) -> str:
    words = " ".join(rng.choice(_SHOP_WORDS, size=int(rng.integers(1, 3)), replace=False))
    kind = str(rng.choice(_SHOP_KINDS)) if rng.random() < 0.8 else ""
    return " ".join(w for w in (words, kind, str(rng.choice(_SHOP_SUFFIX))) if w)


def _address(rng: np.random.Generator) -> list[str]:
    no = f"NO. {int(rng.integers(1, 200))}" if rng.random() < 0.6 else f"LOT {int(rng.integers(1, 9000))}"
    street = f"{rng.choice(_STREETS)} {rng.choice(_STREET_NAMES)},"
    area = f"{rng.choice(_AREAS)},"
    city = f"{int(rng.integers(10000, 99999))} {rng.choice(_CITIES)}"
    state = str(rng.choice(_STATES))
    lines = [f"{no}, {street}", area, f"{city}, {state}".rstrip(", ") + "."]
    if rng.random() < 0.3:                                 # short form on two lines
        lines = [f"{no}, {street} {area}", lines[2]]
    return lines


def make_receipt(seed: int, *, doc_id: str | None = None, wording: str = "default") -> Document:
    """A synthetic shop receipt (layout ``"receipt"``) with SROIE's four key fields.

    A narrow, long page: the company name (centred, often bold or larger), its address on
    2-3 lines, optional registration/phone/GST lines, a document title, the date (alone,
    after a ``DATE:`` label, or beside a time), 2-10 item lines with right-aligned amounts,
    sub-total / tax / rounding lines, the TOTAL line, cash and change, and a thank-you
    footer (the date sometimes under the totals instead of in the header block). Fonts are
    matplotlib's monospace, typewriter, sans and serif TTFs at 14-34 px
    (the scan resolution varies); some receipts lie on a larger scanned sheet. Paper tone,
    ink tone, noise and blur vary as in scans.

    Questions (``field``): ``company``, ``address`` (one box per printed line),
    ``date``, ``total``, each answer being the printed string. The layout is drawn from
    general knowledge of shop receipts (as in SROIE [Huang et al. 2019]); nothing is fitted
    to any real receipt.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    rng = np.random.default_rng([seed, 7])
    font = str(rng.choice(_RECEIPT_FONTS, p=[0.5, 0.2, 0.2, 0.1]))
    bold = {"DejaVuSansMono.ttf": "DejaVuSansMono-Bold.ttf",
            "DejaVuSans.ttf": "DejaVuSans-Bold.ttf"}.get(font, font)
    size = int(rng.integers(12, 31))
    chars = int(rng.integers(32, 49))
    probe = Canvas(10, 10)
    char_w = probe.width_of("0" * 20, font, size) / 20
    margin = int(rng.uniform(1, 8) * char_w)                 # paper and scan around the text
    width = int(chars * char_w) + 2 * margin
    lead = int(size * rng.uniform(1.25, 1.6))
    n_items = int(rng.integers(2, 13))
    two_rows = rng.random() < 0.4                            # "qty @ price" under each item
    height = int((48 + n_items * (1 + two_rows)) * lead + 2 * margin)  # cropped below
    page = Canvas(width, height)
    left, right = margin, width - margin
    q: list[Question] = []
    y = margin + int(rng.integers(0, 3)) * lead // 2

    # company (1-2 lines), sometimes bold / larger
    company = _company(rng)
    csize = int(size * rng.choice([1.0, 1.0, 1.2, 1.4]))
    cfont = bold if rng.random() < 0.5 else font
    words = company.split()
    if page.width_of(company, cfont, csize) > right - left:
        cut = len(words) // 2
        lines = [" ".join(words[:cut]), " ".join(words[cut:])]
    else:
        lines = [company]
    align = "centre" if rng.random() < 0.8 else "left"
    boxes = []
    for text in lines:
        el = page.line(y, text, "company", csize, cfont, align=align, left=left, right=right)
        boxes.append(el.box)
        y += int(csize * 1.4)
    q.append(Question("company", WORDINGS["default"]["company"][0], (" ".join(lines),),
                      tuple(boxes), "company", csize))
    if rng.random() < 0.5:
        page.line(y, f"(CO. REG. {int(rng.integers(10000, 999999))}-{rng.choice(list('ADHKPTUVWX'))})",
                  "header", size, font, align=align, left=left, right=right)
        y += lead
    # address
    addr = _address(rng)
    boxes = []
    for text in addr:
        while page.width_of(text, font, size) > right - left:
            text = text[: len(text) - 2]
        el = page.line(y, text, "address", size, font, align=align, left=left, right=right)
        boxes.append((el.box, el.text))
        y += lead
    q.append(Question("address", WORDINGS["default"]["address"][0],
                      (" ".join(t for _, t in boxes),), tuple(b for b, _ in boxes), "address",
                      size))
    for label in ("TEL", "GST ID"):
        if rng.random() < 0.5:
            num = (f"0{int(rng.integers(3, 10))}-{int(rng.integers(1000, 9999))} "
                   f"{int(rng.integers(1000, 9999))}" if label == "TEL"
                   else f"{int(rng.integers(0, 10**11)):012d}")
            page.line(y, f"{label}: {num}", "header", size, font, align=align, left=left,
                      right=right)
            y += lead
    y += lead // 2
    title = str(rng.choice(["TAX INVOICE", "RECEIPT", "CASH BILL", "SIMPLIFIED TAX INVOICE",
                            "OFFICIAL RECEIPT", "INVOICE"]))
    page.line(y, title, "title", size, bold, align="centre", left=left, right=right)
    y += int(lead * 1.5)
    # document meta and the date
    date = _date_string(rng)
    time_s = f"{int(rng.integers(8, 23)):02d}:{int(rng.integers(0, 60)):02d}"
    meta_first = rng.random() < 0.5
    date_style = int(rng.integers(0, 3))
    date_at_end = rng.random() < 0.3                         # printed under the totals

    def date_line(y: int) -> None:
        if date_style == 0:                                 # DATE: label, then the date
            lab = page.line(y, "DATE:", "meta", size, font, left=left)
            el = page.text((lab.box[2] + int(char_w), y), date, "date", size, font)
        elif date_style == 1:                               # date left, time right
            el = page.line(y, date, "date", size, font, left=left)
            page.line(y, time_s, "meta", size, font, align="right", right=right)
        else:                                               # "DATE : date   TIME : hh:mm"
            lab = page.line(y, "DATE :", "meta", size, font, left=left)
            el = page.text((lab.box[2] + int(char_w), y), date, "date", size, font)
            page.line(y, f"TIME : {time_s}", "meta", size, font, align="right", right=right)
        q.append(Question("date", WORDINGS["default"]["receipt_date"][0], (date,), (el.box,),
                          "date", size))

    if meta_first:
        page.line(y, f"INV NO: {int(rng.integers(1000, 99999))}", "meta", size, font, left=left)
        y += lead
    if not date_at_end:
        date_line(y)
        y += lead
    if not meta_first:
        page.line(y, f"CASHIER: {rng.choice(_SURNAMES).upper()}", "meta", size, font, left=left)
        y += lead
    for label in rng.choice(["TABLE", "PAX", "STATION", "TERMINAL", "BILL NO"],
                            size=int(rng.integers(0, 3)), replace=False):
        page.line(y, f"{label}: {int(rng.integers(1, 999))}", "meta", size, font, left=left)
        y += lead
    sep = str(rng.choice(["-", "=", "*"]))
    page.line(y, sep * (chars - 2), "rule", size, font, left=left)
    y += lead
    # items
    amounts = []
    for _ in range(n_items):  # a few item lines
        name = str(rng.choice(_GOODS))
        qty, price = int(rng.integers(1, 6)), float(np.round(rng.uniform(0.5, 80), 2))
        amount = float(np.round(qty * price, 2))
        amounts.append(amount)
        if two_rows:
            page.line(y, name, "item", size, font, left=left)
            y += lead
            page.line(y, f"  {qty} @ {_fmt_money(price)}", "item", size, font, left=left)
        else:
            page.line(y, f"{qty} x {name}", "item", size, font, left=left)
        page.line(y, _fmt_money(amount), "item", size, font, align="right", right=right)
        y += lead
    page.line(y, sep * (chars - 2), "rule", size, font, left=left)
    y += lead
    sub = float(np.round(sum(amounts), 2))
    tax = float(np.round(sub * 0.06, 2)) if rng.random() < 0.6 else 0.0
    raw = sub + tax
    total = float(np.round(np.round(raw * 20) / 20, 2)) if rng.random() < 0.5 else float(np.round(raw, 2))
    for label, value in (("SUB TOTAL", sub), ("GST 6%", tax if tax else None),
                         ("ROUNDING", float(np.round(total - raw, 2)) if total != round(raw, 2)
                          else None)):
        if value is not None:
            page.line(y, label, "sum", size, font, left=left)
            page.line(y, _fmt_money(value), "sum", size, font, align="right", right=right)
            y += lead
    tlabel = str(rng.choice(["TOTAL", "TOTAL (RM)", "GRAND TOTAL", "NETT TOTAL",
                             "TOTAL INCL. GST", "TOTAL AMOUNT"]))
    tfont = bold if rng.random() < 0.5 else font
    prefix = "RM " if rng.random() < 0.3 else ""
    page.line(y, tlabel, "sum", size, tfont, left=left)
    el = page.line(y, prefix + _fmt_money(total), "total", size, tfont, align="right",
                   right=right)
    q.append(Question("total", WORDINGS["default"]["receipt_total"][0],
                      (prefix + _fmt_money(total), _fmt_money(total)), (el.box,), "total", size))
    y += lead
    cash = float(np.ceil(total / 10) * 10)
    for label, value in (("CASH", cash), ("CHANGE", cash - total)):
        page.line(y, label, "sum", size, font, left=left)
        page.line(y, _fmt_money(value), "sum", size, font, align="right", right=right)
        y += lead
    if rng.random() < 0.5:
        page.line(y, f"ITEM COUNT: {n_items}", "meta", size, font, left=left)
        y += lead
    if tax and rng.random() < 0.6:                           # the tax summary block
        y += lead // 2
        page.line(y, "GST SUMMARY   AMOUNT   TAX", "meta", size, font, left=left)
        y += lead
        for code, rate in (("SR", 0.06), ("ZR", 0.0)):
            page.line(y, f"{code} @ {int(rate * 100)}%", "meta", size, font, left=left)
            page.line(y, f"{_fmt_money(sub if rate else 0.0)}   {_fmt_money(tax if rate else 0.0)}",
                      "meta", size, font, align="right", right=right)
            y += lead
    if date_at_end:
        y += lead // 2
        date_line(y)
        y += lead
    y += lead // 2
    for text in rng.choice(["THANK YOU", "PLEASE COME AGAIN", "GOODS SOLD ARE NOT RETURNABLE",
                            "HAVE A NICE DAY", "EXCHANGE WITHIN 7 DAYS", "OPEN DAILY 8AM-10PM",
                            "WWW.SHOP.COM.MY", "KEEP THIS RECEIPT"],
                           size=int(rng.integers(1, 6)), replace=False):
        if y + lead < height:
            page.line(y, str(text), "footer", size, font, align="centre", left=left, right=right)
            y += lead
    page.img = page.img.crop((0, 0, width, min(height, y + margin + int(rng.integers(0, 5)) * lead)))
    image = finish_page(page, rng, scan=True)
    elements = tuple(page.elements)
    if rng.random() < 0.2:                                  # on a larger scanned sheet
        image, elements, q = _on_sheet(image, elements, q, rng)
    order = {"company": 0, "date": 1, "address": 2, "total": 3}
    q = sorted(q, key=lambda x: order[x.field])
    return Document(doc_id or f"receipt{seed:05d}", image, reword(q, wording, seed, "receipt"),
                    elements, "receipt")


def _shift(box: Box, dx: int, dy: int) -> Box:
    return (box[0] + dx, box[1] + dy, box[2] + dx, box[3] + dy)


def _on_sheet(image: np.ndarray, elements, questions, rng: np.random.Generator):
    """Place a receipt image on a larger sheet (an A4 scan with the receipt on it)."""
    h, w = image.shape[:2]
    sw = int(w * rng.uniform(1.4, 2.2))
    sh = max(int(sw * 1.414), h + 40)
    sheet = np.full((sh, sw, 3), int(rng.integers(225, 256)), np.uint8)
    dx, dy = int(rng.integers(10, sw - w - 10)), int(rng.integers(10, sh - h - 10 + 1))
    sheet[dy:dy + h, dx:dx + w] = image
    els = tuple(TextElement(e.kind, e.text, _shift(e.box, dx, dy), e.size_px) for e in elements)
    qs = [Question(x.qid, x.question, x.answers, tuple(_shift(b, dx, dy) for b in x.boxes),
                   x.field, x.size_px) for x in questions]
    return sheet, els, qs


def make_invoice(seed: int, *, doc_id: str | None = None, wording: str = "default") -> Document:
    """A synthetic business invoice (layout ``"invoice"``), held out from the cascade's
    training: the same four fields as a receipt (company, address, date, total) in a
    different arrangement.

    A4-proportioned page (about 900-1200 px wide): company letterhead at the top left
    (large, bold) with its address below, the word INVOICE and a key-value block (invoice
    number, ``Date:``, due date) on the right, a bill-to block, an items table
    (description, quantity, unit price, amount), subtotal / tax / ``Total due`` at the
    bottom right, and payment terms in the footer. Serif or sans fonts, 12-24 px.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    rng = np.random.default_rng([seed, 11])
    width = int(rng.integers(900, 1201))
    height = int(width * 1.414)
    font = str(rng.choice(["DejaVuSerif.ttf", "DejaVuSans.ttf", "STIXGeneral.ttf"]))
    bold = {"DejaVuSerif.ttf": "DejaVuSerif-Bold.ttf", "DejaVuSans.ttf": "DejaVuSans-Bold.ttf",
            "STIXGeneral.ttf": "STIXGeneralBol.ttf"}[font]
    size = int(rng.integers(12, 19))
    lead = int(size * 1.5)
    page = Canvas(width, height)
    left, right = int(width * 0.07), int(width * 0.93)
    q: list[Question] = []
    y = int(height * rng.uniform(0.04, 0.07))
    company = _company(rng).title()
    csize = int(size * rng.uniform(1.5, 2.0))
    el = page.line(y, company, "company", csize, bold, left=left)
    q.append(Question("company", WORDINGS["default"]["company"][0], (company,), (el.box,),
                      "company", csize))
    page.line(y, "INVOICE", "title", int(csize * 1.1), bold, align="right", right=right)
    y += int(csize * 1.6)
    boxes = []
    for text in _address(rng):
        text = text.title()
        el = page.line(y, text, "address", size, font, left=left)
        boxes.append((el.box, text))
        y += lead
    q.append(Question("address", WORDINGS["default"]["address"][0],
                      (" ".join(t for _, t in boxes),), tuple(b for b, _ in boxes), "address",
                      size))
    ky = int(height * 0.16)
    kx = int(width * rng.uniform(0.58, 0.66))
    date = _date_string(rng)
    for label, value in (("Invoice No:", f"INV-{int(rng.integers(1000, 99999))}"),
                         ("Date:", date), ("Due date:", _date_string(rng))):
        page.line(ky, label, "meta", size, font, left=kx)
        el = page.line(ky, value, "date" if label == "Date:" else "meta", size, font,
                       align="right", right=right)
        if label == "Date:":
            q.append(Question("date", WORDINGS["default"]["receipt_date"][0], (date,),
                              (el.box,), "date", size))
        ky += lead
    y = max(y, ky) + 2 * lead
    page.line(y, "Bill to:", "meta", size, bold, left=left)
    y += lead
    for text in [str(rng.choice(_SURNAMES)) + " " + str(rng.choice(_SHOP_KINDS)).title()] + \
            [t.title() for t in _address(rng)[:2]]:
        page.line(y, text, "billto", size, font, left=left)
        y += lead
    y += lead
    cols = (left, int(left + 0.5 * (right - left)), int(left + 0.68 * (right - left)), right)
    page.rule(left, right, y - 6, 2)
    for x, label, al in zip(cols, ("Description", "Qty", "Unit price", "Amount"),
                            ("left", "left", "left", "right")):
        page.line(y, label, "table", size, bold, align=al, left=x, right=right)
    y += int(lead * 1.3)
    amounts = []
    for _ in range(int(rng.integers(3, 9))):  # a few table rows
        qty, price = int(rng.integers(1, 20)), _money(rng, 5, 400)
        amounts.append(float(np.round(qty * price, 2)))
        page.line(y, str(rng.choice(_ITEMS)), "table", size, font, left=cols[0])
        page.line(y, str(qty), "table", size, font, left=cols[1])
        page.line(y, _fmt_money(price), "table", size, font, left=cols[2])
        page.line(y, _fmt_money(amounts[-1]), "table", size, font, align="right", right=right)
        y += lead
    page.rule(left, right, y, 1)
    y += lead
    sub = float(np.round(sum(amounts), 2))
    tax = float(np.round(sub * rng.choice([0.06, 0.1, 0.2]), 2))
    total = float(np.round(sub + tax, 2))
    lx = int(left + 0.55 * (right - left))
    for label, value, f in (("Subtotal", sub, font), ("Tax", tax, font),
                            ("Total due", total, bold)):
        page.line(y, label, "sum", size, f, left=lx)
        el = page.line(y, _fmt_money(value), "total" if label == "Total due" else "sum", size,
                       f, align="right", right=right)
        y += lead
    q.append(Question("total", WORDINGS["default"]["receipt_total"][0], (_fmt_money(total),),
                      (el.box,), "total", size))
    fy = height - int(height * 0.06)
    page.line(fy, "Payment due within 30 days. Thank you for your business.", "footer",
              max(10, size - 3), font, left=left)
    image = finish_page(page, rng, scan=rng.random() < 0.5)
    order = {"company": 0, "date": 1, "address": 2, "total": 3}
    q = sorted(q, key=lambda x: order[x.field])
    return Document(doc_id or f"invoice{seed:05d}", image, reword(q, wording, seed, "invoice"),
                    tuple(page.elements), "invoice")
