# Sourced by tools/deb-install-test and tools/cluster-vm (--systemd): the Debian package
# built with cargo-deb, and a cached debootstrap minbase root with systemd. The caller
# runs from the repository root, as root, with `set -euo pipefail`, and defines
# `say MESSAGE` and `fail MESSAGE` (which exits).

# The first http(s) mirror in this host's apt sources (deb822 or one-line format).
host_mirror() {
    local uri
    uri=$(grep -hE '^\s*URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk '{print $2}' | grep -v -- '-security' | head -n 1 || true)
    if [ -z "$uri" ]; then
        uri=$(grep -hE '^\s*deb\s' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            sed -E 's/^\s*deb\s+(\[[^]]*\]\s+)?//' | awk '{print $1}' |
            grep -v -- '-security' | head -n 1 || true)
    fi
    echo "$uri"
}

# build_deb OUTDIR: the release binaries (unless BUILD_DEB_NO_BUILD=1) and the package;
# prints the .deb's path.
build_deb() {
    local out=$1
    if ! command -v cargo-deb >/dev/null 2>&1; then
        say "installing cargo-deb" >&2
        cargo install --locked cargo-deb >&2
    fi
    [ "${BUILD_DEB_NO_BUILD:-0}" = 1 ] || cargo build -q --release -p appliance -p tools --bins >&2
    cargo deb -q -p appliance --no-build --strip --fast -o "$out/" >/dev/null
    ls "$out"/appliance_*.deb
}

# debian_root_tarball WORKDIR: a tarball of a minbase root with systemd for this host's
# Debian release (or DEBIAN_SUITE), from this host's mirror (or DEBIAN_MIRROR), made
# once under ${XDG_CACHE_HOME:-$HOME/.cache}/appliance; prints its path.
debian_root_tarball() {
    local work=$1 suite cache tarball mirror
    suite=${DEBIAN_SUITE:-$(. /etc/os-release && echo "${VERSION_CODENAME:-}")}
    [ -n "$suite" ] || fail "no Debian release to bootstrap: set DEBIAN_SUITE"
    cache=${XDG_CACHE_HOME:-$HOME/.cache}/appliance
    tarball=$cache/debian-$suite-minbase-systemd.tar
    if [ ! -s "$tarball" ]; then
        if ! command -v debootstrap >/dev/null 2>&1; then
            say "installing debootstrap" >&2
            apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null
        fi
        mirror=${DEBIAN_MIRROR:-$(host_mirror)}
        [ -n "$mirror" ] || fail "no Debian mirror in this host's apt sources: set DEBIAN_MIRROR"
        say "making a $suite root with debootstrap from $mirror (cached in $cache)" >&2
        mkdir -p "$cache"
        debootstrap --variant=minbase --include=systemd "$suite" "$work/bootstrap" "$mirror" \
            >"$work/debootstrap.log" 2>&1 || {
            tail -n 20 "$work/debootstrap.log" >&2
            fail "debootstrap failed (is the mirror reachable?)"
        }
        tar -C "$work/bootstrap" -cf "$tarball.partial" .
        mv "$tarball.partial" "$tarball"
        rm -rf "$work/bootstrap"
    fi
    echo "$tarball"
}
