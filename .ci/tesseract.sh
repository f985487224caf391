#!/usr/bin/env bash
# tesseract, the book's second, independent OCR reader (fovea_book.eval.reader, engine
# "tesseract"): the receipts' and forms' verdicts are checked under both readers. Optional:
# found, nothing to do; missing, as root with apt-get, installs the Debian package
# `tesseract-ocr` (English model included); otherwise says so and carries on (exit 0): the
# second reader's tests and book sections are then skipped with this reason.
set -euo pipefail
command -v tesseract >/dev/null 2>&1 && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "tesseract.sh: installing tesseract-ocr (Debian package), the second reader"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tesseract-ocr >/dev/null
  command -v tesseract >/dev/null 2>&1 && exit 0
fi
echo "tesseract.sh: tesseract is missing and cannot be installed here (apt-get install tesseract-ocr as root): the second reader's tests and book sections are skipped" >&2
exit 0
