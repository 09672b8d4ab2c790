#!/bin/sh
# Install headless Chromium for tests/test_html_reports.py when it is missing.
#
# Only where that is safe and cheap to do: a Debian-family system with apt-get, run
# as root (a CI container); Ubuntu itself is left out, its chromium package being a
# snap that containers cannot run. Anywhere else, or with KFIT_SKIP_CHROMIUM set, it
# says why and exits 0: the browser tests then skip with their own message, and the
# rest of `make test` runs. Installed once, later calls cost nothing.
set -u
exec 1>&2  # messages go to stderr, like scripts/install-deps.sh

for name in chromium chromium-browser google-chrome google-chrome-stable; do
    if command -v "$name" >/dev/null 2>&1; then
        exit 0
    fi
done

skip() {
    echo "ensure-chromium: not installing Chromium: $1; the browser tests in tests/test_html_reports.py will skip"
    exit 0
}

[ -z "${KFIT_SKIP_CHROMIUM:-}" ] || skip "KFIT_SKIP_CHROMIUM is set"
[ -r /etc/os-release ] || skip "no /etc/os-release"
# shellcheck disable=SC1091
. /etc/os-release
case " ${ID:-} ${ID_LIKE:-} " in
    *" debian "* | *" ubuntu "*) ;;
    *) skip "not Debian or Ubuntu (${ID:-unknown})" ;;
esac
command -v apt-get >/dev/null 2>&1 || skip "apt-get not found"
[ "$(id -u)" = 0 ] || skip "not root (run: sudo apt-get install -y --no-install-recommends chromium)"

# Ubuntu's `chromium` is a snap wrapper that does not run in containers; Debian's is a real package.
[ "${ID:-}" = ubuntu ] && skip "Ubuntu ships Chromium only as a snap"

echo "ensure-chromium: installing Debian's chromium package for the browser tests (about 20 s, 340 MB)"
start=$(date +%s)
# Bounded: a machine that cannot reach its mirrors skips the browser tests instead of stalling make test.
apt() { DEBIAN_FRONTEND=noninteractive timeout 240 apt-get -o Acquire::http::Timeout=20 -o Acquire::Retries=1 "$@" >/dev/null 2>&1; }
if ! apt install -y -q --no-install-recommends chromium; then
    # The package lists may be missing (fresh container) or stale: refresh them once and retry.
    apt update -q || skip "apt-get update failed or timed out (offline?)"
    apt install -y -q --no-install-recommends chromium \
        || skip "apt-get install chromium failed or timed out"
fi
command -v chromium >/dev/null 2>&1 || skip "apt-get installed chromium, but it is not on PATH"
echo "ensure-chromium: chromium installed in $(( $(date +%s) - start )) s"
