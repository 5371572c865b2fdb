#!/usr/bin/env bash
# Relocatable runtime bundle of a built dtrain, for machines that have glibc
# but none of dtrain's libraries (a GPU machine lent for 30 minutes, a compute
# node without the distribution's packages): see doc/gpu.md.
#
#   scripts/bundle.sh [--cuda] [--build DIR] OUTDIR | OUT.tar.gz | OUT.tar.xz
#
# From an already-built build directory (--build, default the current one):
# dtrain, dreshard, dtrain-prepare, the benchmarks, OpenMPI's mpirun (orterun)
# and orted, the test/gpu programs and scripts (CUDA builds), bench/gpu.sh,
# the corpus token files (data/), examples/ and the GPT-2 vocabulary, plus
# every shared library they load at run time, found with ldd on the programs
# and on the OpenMPI/PMIx components that are kept, and taken from the Debian
# packages of exactly the installed versions (apt-get download into a cache,
# /var/tmp/dtrain-bundle/debs, then dpkg -x). Left out on purpose:
#   - glibc, libgcc_s and libstdc++ (packages libc6, libgcc-s1, libstdc++6:
#     every glibc system has them, Debian's minbase root included);
#   - the NVIDIA driver (libcuda) and the CUDA 13 runtime, cuBLAS/cuBLASLt
#     and NCCL: about 1 GB, and a GPU machine has them (env.sh finds them);
#   - OpenMPI components for other transports and OpenSHMEM (UCX, OFI/
#     libfabric, PSM, PSM2, openib/verbs, liboshmem) and whatever only they
#     need, static libraries, headers, compiler wrappers, docs, man pages.
# The bundle's env.sh (source it) sets OPAL_PREFIX, PMIX_PREFIX, PATH and
# LD_LIBRARY_PATH relative to wherever the bundle was unpacked.
# --cuda insists on a CUDA build (the default takes the build as it is).
# Needs network access once per package version (the cache is reused);
# nothing in the bundle reaches the network at run time.
set -euo pipefail
me=bundle.sh
die() { echo "$me: $*" >&2; exit 1; }

want_cuda=no
build=.
out=
while [ $# -gt 0 ]; do
    case $1 in
        --cuda) want_cuda=yes ;;
        --build) [ $# -ge 2 ] || die "--build needs a directory"; build=$2; shift ;;
        --build=*) build=${1#--build=} ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $1 (try --help)" ;;
        *) [ -z "$out" ] || die "one output only (got $out and $1)"; out=$1 ;;
    esac
    shift
done
[ -n "$out" ] || die "usage: scripts/bundle.sh [--cuda] [--build DIR] OUTDIR|OUT.tar.gz|OUT.tar.xz"
for t in ldd dpkg dpkg-query apt-get readelf tar; do
    command -v "$t" >/dev/null || die "$t not found (a Debian/Ubuntu build machine is assumed)"
done

build=$(cd "$build" 2>/dev/null && pwd) || die "no build directory $build"
[ -f "$build/Makefile" ] && [ -f "$build/config.h" ] || die "$build is not a configured build directory (no Makefile/config.h)"
[ -x "$build/src/dtrain" ] || die "$build/src/dtrain not built: run make first"
mkvar() { sed -n "s/^$1 = //p" "$build/Makefile" | head -n 1; }
srcdir=$(mkvar abs_top_srcdir)
[ -d "$srcdir" ] || die "cannot read abs_top_srcdir from $build/Makefile"
if grep -q '^#define HAVE_CUDA 1' "$build/config.h"; then cuda=yes; else cuda=no; fi
[ "$want_cuda" = no ] || [ "$cuda" = yes ] || die "--cuda: $build is not a CUDA build (./configure --with-cuda)"

case $out in
    *.tar.gz|*.tgz) tarball=$out; comp=-z ;;
    *.tar.xz) tarball=$out; comp=-J ;;
    *.tar*) die "$out: use .tar.gz or .tar.xz" ;;
    *) tarball= ;;
esac
name=$(basename "$out"); name=${name%.tar.gz}; name=${name%.tgz}; name=${name%.tar.xz}
[ -n "$tarball" ] || [ ! -e "$out" ] || [ -z "$(ls -A "$out")" ] || die "$out exists and is not empty"

progs=(src/dtrain src/dreshard src/dtrain-prepare src/dtrain-bench-comm src/dtrain-bench-gemm)
gpu_progs=()
if [ "$cuda" = yes ]; then
    gpu_progs=(test/gpu/test_ops_cuda test/gpu/test_nccl_comm)
    if [ ! -x "$build/test/gpu/test_ops_cuda" ] || [ ! -x "$build/test/gpu/test_nccl_comm" ]; then
        echo "$me: building the test/gpu programs"
        make -C "$build" -s "${gpu_progs[@]}" >/dev/null || die "make ${gpu_progs[*]} failed in $build"
    fi
fi
for p in "${progs[@]}" "${gpu_progs[@]}"; do [ -x "$build/$p" ] || die "$build/$p not built: run make"; done
data_files=(data/gutenberg_train_000000.bin data/gutenberg_val_000000.bin)
for f in "${data_files[@]}"; do
    [ -f "$build/$f" ] || die "$build/$f missing: run make (it builds the corpus token files)"
done
tokdir=$(mkvar TOKENIZER_DIR)
[ -f "$tokdir/gpt2/encoder.json" ] || die "GPT-2 vocabulary not found in '$tokdir/gpt2' (scripts/fetch-tokenizers.sh)"

# OpenMPI as installed: the launcher mpirun really is, its component
# directory (pkglibdir), PMIx's components and help files.
mpirun_real=$(readlink -f "$(command -v mpirun)") || die "mpirun not found"
ompi_bin=$(dirname "$mpirun_real")
pkglibdir=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')
[ -d "$pkglibdir" ] || die "cannot find OpenMPI's component directory (ompi_info --path pkglibdir)"
ompi_prefix=$(ompi_info --path prefix --parsable | sed -n 's/^path:prefix://p')
[ "$ompi_prefix" = /usr ] || die "OpenMPI prefix is $ompi_prefix; only Debian's (/usr) is supported"
libpmix=$(ldd "$pkglibdir"/mca_pmix_*.so 2>/dev/null | awk '$1 ~ /^libpmix\.so/ { print $3; exit }')
[ -n "$libpmix" ] || die "cannot find the PMIx library OpenMPI's pmix component uses"
pmix_real=$(readlink -f "$libpmix")
pmix_prefix=$(dirname "$pmix_real")/pmix2
[ -d "$pmix_prefix/lib/pmix" ] || pmix_prefix=$(dirname "$(dirname "$pmix_real")")
[ -d "$pmix_prefix/lib/pmix" ] || die "cannot find PMIx's component directory (looked for .../pmix2/lib/pmix)"

# Libraries every glibc machine has, and those a GPU machine brings.
base_pkgs=' libc6 libgcc-s1 libstdc++6 '
target_re='^lib(cuda|cudart|cublas|cublasLt|nccl|nvidia-ml|nvrtc|nvJitLink)\.so'
# OpenMPI components for transports a single node does not use, and OpenSHMEM
drop_re='^lib(ucp|ucs|uct|ucm|fabric|ibverbs|rdmacm|psm_infinipath|psm2|infinipath|efa|oshmem|mca_common_ucx|mca_common_ofi|mca_common_verbs)\.so'

tmp=$(mktemp -d "${TMPDIR:-/tmp}/dtrain-bundle.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
B=$tmp/$name
mkdir -p "$B"

# ---- what each program and component loads (ldd: the transitive closure) ----
pmix_comps=("$pmix_prefix"/lib/pmix/*.so)
launchers=()
for b in orterun orted ompi_info prterun prted prte; do
    [ -x "$ompi_bin/$b" ] && launchers+=("$ompi_bin/$b")
done
progs_abs=("${progs[@]/#/$build/}")
[ ${#gpu_progs[@]} -eq 0 ] || progs_abs+=("${gpu_progs[@]/#/$build/}")
# one "FILE SONAME PATH" line per dependency ("not" for not found)
ldd "${progs_abs[@]}" "${launchers[@]}" "$pkglibdir"/*.so "${pmix_comps[@]}" 2>/dev/null |
    awk '/^\/.*:$/ { f = substr($0, 1, length($0) - 1); next } $2 == "=>" { print f, $1, $3 }' >"$tmp/deps" ||
    die "ldd failed"

# OpenMPI components: keep those that need no dropped or missing library
kept_comps=()
dropped_comps=()
for c in "$pkglibdir"/*.so; do
    if awk -v f="$c" -v re="$drop_re" '$1 == f && ($2 ~ re || $3 == "not") { bad = 1 } END { exit !bad }' "$tmp/deps"; then
        dropped_comps+=("$(basename "$c" .so)")
    else
        kept_comps+=("$c")
    fi
done
keep_list=$(printf '%s\n' "${progs_abs[@]}" "${launchers[@]}" "${kept_comps[@]}" "${pmix_comps[@]}")

declare -A libpath=()   # soname -> path where the loader found it
from_target=()
while read -r f so path; do
    if [[ $so =~ $target_re ]]; then
        [[ " ${from_target[*]} " == *" $so "* ]] || from_target+=("$so")
        continue
    fi
    [ "$path" != not ] || die "$f needs $so, which is not found on this machine"
    [[ ! $so =~ $drop_re ]] || die "$f needs $so, a dropped transport library"
    libpath[$so]=$path
done < <(awk 'NR == FNR { keep[$0] = 1; next } keep[$1]' <(echo "$keep_list") "$tmp/deps")

# owning package of each library and file (one dpkg -S for all): glibc's
# and the C++ runtime's stay out
extra_files=("${launchers[@]}" "${kept_comps[0]}" "${pmix_comps[0]}" /usr/share/openmpi/help-orterun.txt
    /etc/openmpi/openmpi-mca-params.conf "$pmix_prefix/share/pmix/help-pmix-server.txt")
variants() { # a path as dpkg may have recorded it (merged /usr)
    local p r
    for p in "$@"; do
        r=$(readlink -f "$p")
        printf '%s\n' "$p" "$r" "/usr${p#/usr}" "/usr${r#/usr}" "${p#/usr}" "${r#/usr}"
    done | grep '^/' | sort -u
}
declare -A pkgof=()
# shellcheck disable=SC2046 # one path a word
while IFS= read -r line; do
    pk=${line%%: /*}; pk=${pk%%,*}; pk=${pk%%:*}
    pkgof[${line#*: }]=$pk
done < <(dpkg -S $(variants "${libpath[@]}" "${extra_files[@]}") 2>/dev/null | grep -v '^diversion')
owner() { # path -> package
    local q
    for q in $(variants "$1"); do
        [ -n "${pkgof[$q]:-}" ] && { echo "${pkgof[$q]}"; return 0; }
    done
    return 1
}
declare -A pkgs=()
declare -A libpkg=()
for so in "${!libpath[@]}"; do
    pk=$(owner "${libpath[$so]}") || die "${libpath[$so]} ($so) belongs to no Debian package"
    libpkg[$so]=$pk
    if [[ $base_pkgs == *" $pk "* ]]; then unset "libpath[$so]"; else pkgs[$pk]=1; fi
done
for f in "${extra_files[@]}"; do
    [ -e "$f" ] || continue
    pk=$(owner "$f") || die "$f belongs to no Debian package"
    pkgs[$pk]=1
done

# ---- the Debian packages of exactly the installed versions ----
# A version the archive no longer has (superseded by a point release) is
# taken from the installed package's own files instead (dpkg -L), which is
# what dpkg -x of that version would give.
cache=${DTRAIN_BUNDLE_CACHE:-/var/tmp/dtrain-bundle/debs}
mkdir -p "$cache" || die "cannot create the package cache $cache"
want=()
debs=()
from_host=()
declare -A debof=()
for pk in $(printf '%s\n' "${!pkgs[@]}" | sort); do
    read -r ver arch < <(dpkg-query -W -f '${Version} ${Architecture}\n' "$pk" | head -n 1) ||
        die "dpkg-query $pk failed"
    deb="$cache/${pk}_${ver//:/%3a}_${arch}.deb"
    debof[$pk]=$deb
    if [ -f "$deb.gone" ]; then from_host+=("$pk"); elif [ ! -s "$deb" ]; then want+=("$pk:$arch=$ver"); fi
done
while [ ${#want[@]} -gt 0 ]; do
    echo "$me: apt-get download ${#want[@]} package(s) into $cache"
    if (cd "$cache" && apt-get download -q -o APT::Sandbox::User=root "${want[@]}") >"$tmp/apt.log" 2>&1; then
        break
    fi
    gone=$(sed -n "s/^E: Can't find a source to download version '.*' of '\([^:']*\).*/\1/p" "$tmp/apt.log")
    [ -n "$gone" ] || die "apt-get download failed (network?): $(grep -m1 -E '^(E|Err):' "$tmp/apt.log")"
    rest=()
    for w in "${want[@]}"; do
        if grep -qx "${w%%:*}" <<<"$gone"; then
            from_host+=("${w%%:*}")
            : >"${debof[${w%%:*}]}.gone"   # remembered: not asked for again
        else
            rest+=("$w")
        fi
    done
    want=(${rest[@]+"${rest[@]}"})
done
X=$tmp/x
mkdir -p "$X"
for pk in "${!debof[@]}"; do
    if [[ " ${from_host[*]} " == *" $pk "* ]]; then
        dpkg -L "$pk" | while read -r f; do [ -f "$f" ] && echo "${f#/}"; done | tar -C / -cf - -T - | tar -C "$X" -xf - ||
            die "copying the installed files of $pk failed"
        debs+=("$pk (the installed files: apt-get cannot download its version; apt-get update may help)")
    else
        [ -s "${debof[$pk]}" ] || die "${debof[$pk]} missing after apt-get download"
        dpkg -x "${debof[$pk]}" "$X" || die "dpkg -x ${debof[$pk]} failed"
        debs+=("$(basename "${debof[$pk]}" .deb)")
    fi
done
# merged /usr: a package's /lib/... is /usr/lib/... on the target
for d in lib lib64 bin sbin; do
    if [ -d "$X/$d" ] && [ ! -L "$X/$d" ]; then
        mkdir -p "$X/usr/$d" && cp -a "$X/$d/." "$X/usr/$d/" && rm -rf "${X:?}/$d"
    fi
done
usr() { case $1 in /lib/*|/lib64/*|/bin/*|/sbin/*) echo "/usr$1" ;; *) echo "$1" ;; esac; }

# ---- assemble ----
copy_from_deb() { # host-path [dest-path]: the same file from the unpacked packages
    local p=$1 d=${2:-$(usr "$1")} s
    s=$X$(usr "$p")
    [ -e "$s" ] || s=$X$(usr "$(readlink -f "$p")")
    [ -e "$s" ] || die "$p is not in its package ($(owner "$p" || echo '?')): was it installed by hand?"
    mkdir -p "$B$(dirname "$d")"
    cp -L "$s" "$B$d" || die "cp $s failed"
    cmp -s "$B$d" "$(readlink -f "$p")" || echo "$me: warning: $p differs from its package's copy (the package's is bundled)" >&2
}
declare -A libdirs=()
for so in "${!libpath[@]}"; do
    d=$(usr "$(dirname "${libpath[$so]}")")
    copy_from_deb "${libpath[$so]}" "$d/$so"
    libdirs[$d]=1
done
for l in "${launchers[@]}"; do copy_from_deb "$l"; done
# the components: same directory in the package as on this machine
comp_dir=$(usr "$pkglibdir")
mkdir -p "$B$comp_dir" "$B$pmix_prefix/lib/pmix"
cp "${kept_comps[@]/#$pkglibdir/$X$comp_dir}" "$B$comp_dir/" || die "OpenMPI components missing from libopenmpi3"
cp "$X$pmix_prefix"/lib/pmix/*.so "$B$pmix_prefix/lib/pmix/" || die "PMIx components missing from libpmix2"
[ -x "$ompi_bin/orterun" ] && for n in mpirun mpiexec; do ln -s orterun "$B/usr/bin/$n"; done
[ -x "$ompi_bin/prterun" ] && [ ! -e "$B/usr/bin/mpirun" ] && ln -s prterun "$B/usr/bin/mpirun"
# help files and default parameters (OpenMPI, PMIx); no compiler wrapper data
mkdir -p "$B/usr/share/openmpi" "$B/etc/openmpi" "$B$pmix_prefix/share/pmix"
cp "$X"/usr/share/openmpi/help-*.txt "$B/usr/share/openmpi/" || die "OpenMPI help files missing from openmpi-common"
cp "$X"/etc/openmpi/openmpi-mca-params.conf "$X"/etc/openmpi/openmpi-default-hostfile "$B/etc/openmpi/" 2>/dev/null || true
cp -r "$X$pmix_prefix/share/." "$B$pmix_prefix/share/" || die "PMIx help files missing"
mkdir -p "$B/usr/lib/x86_64-linux-gnu/hwloc"   # an empty plugin directory: see env.sh

# dtrain: programs, scripts, data, vocabulary
mkdir -p "$B/src" "$B/data" "$B/examples/data" "$B/bench" "$B/test/gpu" "$B/tokenizers"
for p in "${progs[@]}" "${gpu_progs[@]}"; do cp "$build/$p" "$B/$p"; done
cp "$build"/data/*.bin "$B/data/"
cp "$build"/data/*.tokenizer.json "$B/data/" 2>/dev/null || true
cp "$srcdir"/examples/*.conf "$B/examples/"
cp "$srcdir"/examples/data/* "$B/examples/data/"
cp -r "$tokdir/gpt2" "$B/tokenizers/"
# the hf kind's tokenizer.json files (about 30 MB), so data prepared with
# hf:NAME finds its tokenizer in the bundle by sha256
if [ -d "$tokdir/hf" ]; then cp -r "$tokdir/hf" "$B/tokenizers/"; fi
cp "$srcdir/bench/gpu.sh" "$srcdir/bench/gpu_kernels.sh" "$B/bench/"
[ -f "$srcdir/doc/gpu.md" ] && cp "$srcdir/doc/gpu.md" "$B/README.md"
# The tests call /usr/bin/python3 for h5py; a GPU machine's python with h5py
# may live elsewhere (bench/gpu.sh sets DTRAIN_PYTHON)
for f in test/common.sh test/compare_params.py; do
    sed 's#/usr/bin/python3#${DTRAIN_PYTHON:-/usr/bin/python3}#g' "$srcdir/$f" >"$B/$f"
done
if [ "$cuda" = yes ]; then
    for f in test/gpu/test_train_cuda.sh test/gpu/test_nccl.sh; do
        sed 's#/usr/bin/python3#${DTRAIN_PYTHON:-/usr/bin/python3}#g' "$srcdir/$f" >"$B/$f"
    done
    for f in test/gpu/hf_logits.sh test/gpu/hf_logits.py test/ref/hf_ref.py; do
        mkdir -p "$B/$(dirname "$f")"
        cp "$srcdir/$f" "$B/$f"
    done
fi

# ---- env.sh ----
ldp=$(for d in "${!libdirs[@]}"; do echo "$d"; done | sort | sed 's#^#$DTRAIN_BUNDLE#' | paste -sd: -)
cat >"$B/env.sh" <<EOF
# Source this file (bash, dash, zsh from the bundle's directory): . /path/to/$name/env.sh
# It points OpenMPI and PMIx at the bundle (wherever it was unpacked) and
# puts its programs and libraries first; DTRAIN_BUNDLE_SAVED_LD_LIBRARY_PATH
# keeps the old library path for programs that must not see the bundle's
# libraries (Python with PyTorch: bench/gpu.sh uses it).
if [ -n "\${BASH_SOURCE:-}" ]; then
    DTRAIN_BUNDLE=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
elif [ -n "\${DTRAIN_BUNDLE:-}" ] && [ -f "\$DTRAIN_BUNDLE/env.sh" ]; then
    :
elif [ -f ./env.sh ] && [ -d ./usr/share/openmpi ]; then
    DTRAIN_BUNDLE=\$(pwd)
else
    echo "env.sh: cannot tell where the bundle is: source it from bash, or from its own directory" >&2
    return 1 2>/dev/null || exit 1
fi
export DTRAIN_BUNDLE
if [ "\${DTRAIN_BUNDLE_ACTIVE:-}" != "\$DTRAIN_BUNDLE" ]; then
    export DTRAIN_BUNDLE_ACTIVE=\$DTRAIN_BUNDLE
    export DTRAIN_BUNDLE_SAVED_LD_LIBRARY_PATH=\${LD_LIBRARY_PATH:-}
    export OPAL_PREFIX=\$DTRAIN_BUNDLE/usr
    export OPAL_SYSCONFDIR=\$DTRAIN_BUNDLE/etc/openmpi
    export PMIX_PREFIX=\$DTRAIN_BUNDLE$pmix_prefix
    export PMIX_MCA_mca_base_component_path=\$DTRAIN_BUNDLE$pmix_prefix/lib/pmix
    # PMIx also scans its built-in pkglibdir (the system's path) unless told
    # where it is: a machine with another PMIx there (the GPU machines) then
    # fails to open that version's components and runs without compression
    export PMIX_PKGLIBDIR=\$DTRAIN_BUNDLE$pmix_prefix/lib/pmix
    # hwloc's plugins (PCI, GL, OpenCL) are not bundled: an empty directory
    # keeps it from loading another hwloc's plugins from the system
    export HWLOC_PLUGINS_PATH=\$DTRAIN_BUNDLE/usr/lib/x86_64-linux-gnu/hwloc
    export DTRAIN_TOKENIZERS=\$DTRAIN_BUNDLE/tokenizers
    export PATH=\$DTRAIN_BUNDLE/src:\$DTRAIN_BUNDLE/usr/bin:\$PATH
    export LD_LIBRARY_PATH=$ldp\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}
    # one node, no ssh: mpirun starts the ranks itself (plm isolated)
    export OMPI_MCA_plm=\${OMPI_MCA_plm:-isolated}
    # containers run as root: let mpirun do so
    if [ "\$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
EOF
if [ "$cuda" = yes ]; then
    cat >>"$B/env.sh" <<EOF
    # The CUDA runtime, cuBLAS/cuBLASLt and NCCL come from the machine: the
    # programs look in /usr/local/cuda/lib64 (their RUNPATH) and the system
    # paths; else a CUDA toolkit or Python wheels (nvidia-*) directory that
    # has them is added here.
    for _so in $(printf '%s ' "${from_target[@]}" | sed 's/libcuda\.so\.1 //'); do
        if ! { [ -e /usr/local/cuda/lib64/\$_so ] || /sbin/ldconfig -p 2>/dev/null | grep -q "^[[:space:]]*\$_so "; }; then
            _found=
            for _d in \$(echo \${LD_LIBRARY_PATH:-} | tr : ' ') /usr/local/cuda*/lib64 /usr/local/cuda*/targets/x86_64-linux/lib \\
                /usr/lib/x86_64-linux-gnu \$(ls -d /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \\
                /usr/local/lib/python3*/dist-packages/nvidia/*/lib /usr/lib/python3/dist-packages/nvidia/*/lib 2>/dev/null); do
                if [ -e "\$_d/\$_so" ]; then _found=\$_d; break; fi
            done
            if [ -n "\$_found" ]; then
                case ":\$LD_LIBRARY_PATH:" in *":\$_found:"*) ;; *) LD_LIBRARY_PATH=\$LD_LIBRARY_PATH:\$_found ;; esac
            else
                echo "env.sh: \$_so not found (the CUDA 13 toolkit and NCCL are expected on the machine; add their directory to LD_LIBRARY_PATH)" >&2
            fi
        fi
    done
    unset _so _d _found
EOF
fi
echo "fi" >>"$B/env.sh"

# ---- manifest ----
commit=$(git -C "$srcdir" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$srcdir" diff --quiet HEAD 2>/dev/null || commit="$commit (+ uncommitted changes)"
{
    echo "dtrain bundle $name: built $(date -u +%Y-%m-%dT%H:%MZ) from $build (source $srcdir, commit $commit)"
    echo "commit: $commit"
    echo "build: $( [ "$cuda" = yes ] && echo "CUDA (--with-cuda)" || echo CPU)"
    echo "configure: $(sed -n 's/^ *\$ \(.*configure.*\)/\1/p' "$build/config.log" | head -n 1)"
    echo
    echo "Debian packages (apt-get download + dpkg -x):"
    printf '  %s\n' "${debs[@]}" | sort
    echo
    echo "Libraries (soname -> package):"
    for so in $(printf '%s\n' "${!libpath[@]}" | sort); do echo "  $so ${libpkg[$so]}"; done
    echo
    echo "Expected on the machine, not bundled: glibc, libgcc_s, libstdc++${from_target[*]:+, }${from_target[*]}"
    echo
    echo "OpenMPI components kept: ${#kept_comps[@]}; dropped (other transports, OpenSHMEM): ${dropped_comps[*]}"
} >"$B/MANIFEST.txt"

# ---- check: every library each ELF file loads is in the bundle or expected ----
base_re=$(for so in "${!libpkg[@]}"; do if [[ $base_pkgs == *" ${libpkg[$so]} "* ]]; then echo "$so"; fi; done |
    sed 's/[.+]/\\&/g' | paste -sd'|' -)
(
    # shellcheck disable=SC1091
    . "$B/env.sh" >/dev/null 2>&1
    find "$B" -type f \( -perm -u+x -o -name '*.so*' \) -print0 | { xargs -0 ldd 2>/dev/null || true; } |
        awk -v b="$B/" -v t="$target_re" -v base="^(${base_re:-none}|linux-vdso\\.so|ld-linux)" '
            /^\/.*:$/ { f = $1; next }
            $2 == "=>" && index($3, b) != 1 && $1 !~ t && $1 !~ base { print f, "needs", $1, "from", $3 }'
) >"$tmp/missing"
[ ! -s "$tmp/missing" ] || die "not self-contained: $(head -n 3 "$tmp/missing")"

dir_bytes=$(du -sb "$B" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
if [ -n "$tarball" ]; then
    mkdir -p "$(dirname "$tarball")"
    tar -C "$tmp" $comp -cf "$tarball.tmp" "$name" || die "tar failed"
    mv "$tarball.tmp" "$tarball"
    tar_bytes=$(stat -c %s "$tarball")
    echo "$me: $tarball: $(mib "$tar_bytes") ($(mib "$dir_bytes") unpacked, ${#debs[@]} packages, ${#libpath[@]} libraries, ${#dropped_comps[@]} OpenMPI components dropped)"
    travel=$tar_bytes
else
    mkdir -p "$out"
    cp -a "$B/." "$out/"
    echo "$me: $out: $(mib "$dir_bytes") (${#debs[@]} packages, ${#libpath[@]} libraries, ${#dropped_comps[@]} OpenMPI components dropped)"
    travel=$dir_bytes
fi
if [ "$travel" -gt $((64 * 1048576)) ]; then
    if [ "$cuda" = yes ] && [ -n "$tarball" ]; then
        die "$(mib "$travel") is over the 64 MiB a GPU machine is sent: make a .tar.gz or .tar.xz instead"
    fi
    echo "$me: note: over 64 MiB; a tarball (.tar.gz) is smaller"
fi
