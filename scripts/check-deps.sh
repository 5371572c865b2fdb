#!/usr/bin/env bash
# Every command that the build, the tests, the scripts and the benchmarks
# call is present, and scripts/install-deps.sh installs it (issue 22: on a
# minimal Debian 12 root, test_comm_timeout.sh called pgrep and procps was
# not installed).
#
#   scripts/check-deps.sh            presence, the table against install-deps.sh, and the scan
#   scripts/check-deps.sh --scan     only the scan and the table (no presence check)
#
# 1. Each command of the tables below is found (PATH, /usr/sbin, /sbin),
#    each Python module imports in /usr/bin/python3 (the tests' Python);
#    optional ones (GPU-only tools, not in Debian main) only warn; each
#    library of the libs list is found by pkg-config (configure's check).
# 2. Each package of the first table and of the libs list is in
#    install-deps.sh's list.
# 3. The scan: every word in command position (line start, after | ; & ( !
#    $( then do else exec xargs timeout N env sudo) of test/, scripts/,
#    bench/, slurm/, fuzz/run.sh, .ci/run and autogen.sh that is a program
#    on this machine, and every non-standard module those files and test/
#    *.py import, must be in a table: a new command is caught here rather
#    than on a new user's machine. A word that only looks like a command
#    (text in a message) goes in the ignore list.
# Exit 0 when all hold, 1 with one line per problem otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
PATH=$PATH:/usr/sbin:/sbin

# command  Debian package in install-deps.sh  who calls it
packaged=$(cat <<'EOF'
autoreconf   autoconf              autogen.sh
autoconf     autoconf              autogen.sh
automake     automake              autogen.sh
libtoolize   libtool               autogen.sh
pkg-config   pkg-config            configure
make         build-essential       the build, .ci/run, scripts/quickstart.sh, scripts/bundle.sh, tests (make -C)
cc           build-essential       the build
gcc          build-essential       scripts/rehearse-bundle.sh (a foreign PMIx component for the bare root)
g++          build-essential       test/emu (Makefile.am), tests that build a helper
strip        build-essential       scripts/rehearse-bundle.sh (binutils)
readelf      build-essential       scripts/bundle.sh (binutils)
mpiexec      openmpi-bin           make check (MPIEXEC), every multi-rank test
mpirun       openmpi-bin           slurm/train_small_mpirun.sbatch, bench/*.sh
ompi_info    openmpi-bin           scripts/bundle.sh
h5dump       hdf5-tools            reading checkpoints by hand (doc/format.md: h5ls, h5dump)
zstd         zstd                  test/test_prepare.sh
spm_train    sentencepiece         test/test_spm.sh, bench/tokenize.sh
spm_encode   sentencepiece         test/test_spm.sh, bench/tokenize.sh
spm_decode   sentencepiece         test/test_spm.sh
clang        clang                 make fuzz
python3      python3               tests (/usr/bin/python3)
gnuplot      gnuplot-nox           src/dtrain-plot, test/test_plot.sh
protoc       protobuf-compiler     test/test_tfevents.sh
sbatch       slurm-wlm             test/test_slurm.sh
srun         slurm-wlm             slurm/*.sbatch
scontrol     slurm-wlm             slurm/*.sbatch, test/test_slurm.sh
scancel      slurm-wlm             slurm/test-cluster.sh, test/test_slurm.sh
squeue       slurm-wlm             slurm/*.sbatch, slurm/test-cluster.sh
sinfo        slurm-wlm             slurm/test-cluster.sh
slurmctld    slurmctld             slurm/test-cluster.sh
slurmd       slurmd                slurm/test-cluster.sh
munged       munge                 slurm/test-cluster.sh
valgrind     valgrind              debugging aid
pgrep        procps                test/test_comm_timeout.sh, test/test_slurm.sh
pkill        procps                test/test_ckpt.sh
ps           procps                debugging aid
debootstrap  debootstrap           scripts/rehearse-bundle.sh
git          git                   bench/gpu.sh, scripts/bundle.sh (the commit in their reports)
node         nodejs                scripts/fetch-tokenizers.sh, test/test_tokenizer.sh, bench/tokenize.sh
nodejs       nodejs                scripts/install-deps.sh
npm          npm                   scripts/fetch-tokenizers.sh, scripts/fetch-corpus.sh
EOF
)
# commands of Essential or required packages (in every Debian root,
# debootstrap --variant=minbase included): coreutils, util-linux, findutils,
# diffutils, grep, sed, mawk, tar, gzip, bash, dpkg, apt, libc-bin, mount,
# hostname, debianutils, perl-base (perl: test/emu/moe_mutants.sh)
base="awk basename bash cat chmod cmp cp cut date dd df diff dirname dpkg dpkg-query apt-get du echo env expr
find getent grep gzip head hostname id kill ldd ln ls mkdir mktemp mount mv nproc od paste printf pwd
readlink rm rmdir sed seq setsid sh sha1sum sha256sum sleep sort stat sync tail tar tee timeout touch tr
true false umount uname uniq wc xargs zcat which nice unshare chroot perl"
# optional: checked for presence with a warning only (GPU machines, not in
# Debian main; sudo: install-deps.sh also runs as root)
optional="nvcc nvidia-smi sudo"
# words that only look like commands in these files (text in messages,
# awk variables, shell functions of the same name as a program)
ignore="w write size groups install file test [ exec command gfortran"
# libraries configure finds with pkg-config (module, Debian package), for
# the programs it builds: present, and their packages in install-deps.sh
libs="libmicrohttpd:libmicrohttpd-dev jansson:libjansson-dev libpcre2-8:libpcre2-dev zlib:zlib1g-dev libzstd:libzstd-dev
sentencepiece:libsentencepiece-dev libcrypto:libssl-dev libutf8proc:libutf8proc-dev"
# Python modules /usr/bin/python3 must import (Debian package); optional ones warn
pymods="numpy:python3-numpy h5py:python3-h5py torch:python3-torch crc32c:python3-crc32c google:python3-protobuf"
pyoptional="transformers safetensors"

problems=0
problem() { echo "check-deps: $*"; problems=$((problems + 1)); }
warn() { echo "check-deps: note: $*"; }
commands=$(echo "$packaged" | awk '{ print $1 }')
listed=" $(echo $commands $base $optional $ignore) "

# ---- the table's packages are in install-deps.sh ----
deps=$(sed -n '/^packages=(/,/^)/p' scripts/install-deps.sh | sed 's/#.*//')
deps="$deps $(grep -o 'packages+=([^)]*)' scripts/install-deps.sh | sed 's/packages+=(//; s/)//')"
for p in $(echo "$packaged" | awk '{ print $2 }' | sort -u); do
    echo " $(echo $deps) " | grep -q " $p " || problem "package $p (for $(echo "$packaged" | awk -v p="$p" '$2 == p { printf "%s%s", s, $1; s = ", " }')) is not in scripts/install-deps.sh"
done

for l in $libs; do
    echo " $(echo $deps) " | grep -q " ${l#*:} " || problem "package ${l#*:} (library ${l%%:*}) is not in scripts/install-deps.sh"
done

# ---- presence ----
if [ "${1:-}" != --scan ]; then
    for l in $libs; do
        pkg-config --exists "${l%%:*}" 2>/dev/null ||
            problem "library ${l%%:*} not found by pkg-config: install Debian package ${l#*:} (scripts/install-deps.sh)"
    done
    for c in $commands $base; do
        command -v "$c" >/dev/null 2>&1 ||
            problem "$c not found: install $(echo "$packaged" | awk -v c="$c" '$1 == c { print "Debian package " $2 " (" substr($0, index($0, $3)) ")" }')$(echo " $base " | grep -q " $c " && echo "it (part of every Debian root)") (scripts/install-deps.sh)"
    done
    for c in $optional; do
        command -v "$c" >/dev/null 2>&1 || warn "$c not found (optional)"
    done
    if [ -x /usr/bin/python3 ]; then
        for m in $pymods; do
            /usr/bin/python3 -c "import ${m%%:*}" >/dev/null 2>&1 ||
                problem "/usr/bin/python3 cannot import ${m%%:*}: install Debian package ${m#*:} (scripts/install-deps.sh)"
        done
        for m in $pyoptional; do
            /usr/bin/python3 -c "import $m" >/dev/null 2>&1 || warn "/usr/bin/python3 cannot import $m (optional)"
        done
    fi
fi

# ---- the scan ----
files=$(ls test/*.sh test/gpu/*.sh scripts/*.sh bench/*.sh slurm/*.sh slurm/*.sbatch fuzz/run.sh .ci/run autogen.sh 2>/dev/null |
    grep -v '^scripts/check-deps.sh$')
# shell functions the files define
funcs=" $(grep -hoE '^[[:space:]]*[A-Za-z_][A-Za-z0-9_]*\(\)' $files | tr -d ' ()' | sort -u | tr '\n' ' ') "
builtins=" if then else elif fi for while until do done case esac in function return exit break continue set
shift export local readonly declare eval trap wait cd read unset source . echo printf test [ command type
ulimit umask exec let getopts alias hash pushd popd shopt true false kill time "
words=$(awk '
    /^[[:space:]]*#/ { next }
    {
        s = ";" $0
        sub(/[[:space:]]#.*/, "", s)
        while (match(s, /([|;&(!`]|\$\(|[[:space:]](then|do|else|exec|xargs|sudo|timeout( -[^[:space:]]+)* [0-9.]+[smh]?|env( -u [^[:space:]]+| [A-Za-z_]+=[^[:space:]]*)*))[[:space:]]*[A-Za-z][A-Za-z0-9_.+-]*([[:space:];|&)]|$)/)) {
            w = substr(s, RSTART, RLENGTH)
            sub(/[[:space:];|&)]$/, "", w)
            sub(/.*[^A-Za-z0-9_.+-]/, "", w)
            print w, FILENAME ":" FNR
            s = substr(s, RSTART + RLENGTH - 1)
            if (RLENGTH <= 1) break
        }
    }' $files | sort -u -k1,1)
# a program of an Essential or required package is in every Debian root
in_base() {
    local f pkg
    f=$(readlink -f "$(command -v "$1")") || return 1
    pkg=$(dpkg -S "$f" 2>/dev/null | head -n 1 | cut -d: -f1) || return 1
    [ -n "$pkg" ] || pkg=$(dpkg -S "$(command -v "$1")" 2>/dev/null | head -n 1 | cut -d: -f1)
    [ -n "$pkg" ] && dpkg-query -W -f='${Essential} ${Priority}\n' "$pkg" 2>/dev/null | grep -Eq '^yes |required$'
}
all=" $(echo $listed $funcs $builtins) "
while read -r w where; do
    [ -n "$w" ] || continue
    case "$all" in *" $w "*) continue ;; esac
    command -v "$w" >/dev/null 2>&1 || continue # not a program here: a word in text
    in_base "$w" && continue
    problem "$w ($where) is not in scripts/check-deps.sh: add it with the Debian package that has it, and the package to scripts/install-deps.sh"
done <<<"$words"
# Python modules imported by the tests and scripts, outside the standard library
if [ -x /usr/bin/python3 ]; then
    mods=$(grep -hE '^[[:space:]]*(import|from) [A-Za-z_]' test/*.py test/ref/*.py test/gpu/*.py $files 2>/dev/null |
        sed -E 's/^[[:space:]]*(import|from)[[:space:]]+//; s/[[:space:]]+import .*//; s/ as [A-Za-z_]+//g' | tr ',' '\n' |
        sed -E 's/[[:space:]]//g; s/\..*//' | grep -E '^[A-Za-z_][A-Za-z0-9_]*$' | sort -u)
    known=" $(for m in $pymods; do printf '%s ' "${m%%:*}"; done) $pyoptional "
    for m in $(/usr/bin/python3 -c 'import sys; print(" ".join(m for m in sys.argv[1:] if m not in sys.stdlib_module_names))' $mods); do
        # the tests' own modules (test/megatron_reader.py, test/ref/hf_ref.py, ...)
        [ -f "test/$m.py" ] || [ -f "test/ref/$m.py" ] || [ -f "test/gpu/$m.py" ] && continue
        case "$known" in *" $m "*) ;; *) problem "Python module $m is imported but not in scripts/check-deps.sh's pymods (and its Debian package in install-deps.sh)" ;; esac
    done
fi

if [ "$problems" -eq 0 ]; then
    echo "check-deps: $(echo $commands $base | wc -w) commands, $(echo $libs | wc -w) libraries and $(echo $pymods | wc -w) Python modules present, every package in scripts/install-deps.sh, no unlisted command in $(echo $files | wc -w) scripts"
    exit 0
fi
echo "check-deps: $problems problem(s)"
exit 1
