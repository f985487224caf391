#!/usr/bin/env bash
# Chromium for make test's browser check (python -m fovea_book.build check-html), in one place:
# called first by `make test` (its `chromium` prerequisite) and by .ci/run.
# Found ($CHROMIUM, or one of the names book/fovea_book/build/browser.py looks for): nothing to do.
# Missing, as root with apt-get: installs the Debian package `chromium`.
# Missing otherwise: one line saying how, exit 1, before any set-up or test has run.
set -euo pipefail

found() {
  local name
  for name in ${CHROMIUM:+"$CHROMIUM"} chromium chromium-browser google-chrome chrome; do
    if command -v "$name" >/dev/null 2>&1; then
      return 0
    fi
  done
  return 1
}

found && exit 0
HOW="apt-get install -y --no-install-recommends chromium (as root, Debian/Ubuntu), or set \$CHROMIUM to a Chromium or Chrome executable"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "chromium.sh: installing chromium (Debian package) for make test's browser check"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
  found && exit 0
  echo "chromium.sh: apt-get installed chromium but no Chromium executable is on PATH; $HOW" >&2
  exit 1
fi
echo "make test needs Chromium for its browser check and cannot install it here (not root with apt-get): $HOW" >&2
exit 1
