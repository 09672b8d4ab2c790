# Sourced by the scripts that install a Debian package for the tests (ensure-slurm.sh, ensure-postgres.sh):
# debian_install PACKAGE... installs them with apt, bounded in time, updating the lists once if the first try
# fails; on anything else it calls the caller's fail() with one line saying why.
debian_install() {
    [ -r /etc/os-release ] || fail "no /etc/os-release: not a Debian-family system"
    # shellcheck disable=SC1091
    . /etc/os-release
    case " ${ID:-} ${ID_LIKE:-} " in
        *" debian "* | *" ubuntu "*) ;;
        *) fail "not Debian or Ubuntu (${ID:-unknown}): install $* yourself" ;;
    esac
    command -v apt-get >/dev/null 2>&1 || fail "apt-get not found"
    say "installing Debian's $* (about 30 s)"
    apt_() { DEBIAN_FRONTEND=noninteractive timeout 300 apt-get -o Acquire::http::Timeout=20 -o Acquire::Retries=1 "$@" >/dev/null 2>&1; }
    if ! apt_ install -y -q --no-install-recommends "$@"; then
        apt_ update -q || fail "apt-get update failed or timed out (offline?)"
        apt_ install -y -q --no-install-recommends "$@" || fail "apt-get install $* failed or timed out"
    fi
}
