#!/usr/bin/env bash
# Encryption + compression against neither (issue 22, "Must show").
#
# In one run, for RUNS rounds (default 3), each round in fresh repositories:
#   plain  = init --encryption none --compression off
#   secure = init (encrypted, password from TESSERA_PASSWORD) --compression auto
# it measures on fresh incompressible data (SIZE_MIB of AES-CTR keystream,
# default 1024) the backup (fresh), the backup of the same data again
# (duplicate: every chunk a duplicate) and the restore of the first backup
# to /dev/null, and prints the median and spread (min..max) of each
# secure/plain throughput ratio. Then it backs up a real source tree
# (the tar of the first version of /work/shared/data/code-redis-wc, or TEXT
# if set) into one repository of each kind and prints how many times
# smaller the compressed repository is than the uncompressed one.
#
# Usage: scripts/crypto-benchmark.sh
# Environment: TESSERA (binary; default target/release/tessera, built if
# absent), RUNS, SIZE_MIB, WORK (scratch directory, kept with the unpacked
# text data; default a new one under /tmp, removed at the end), TEXT (a text-like file or directory to back up instead of Redis).
set -euo pipefail

cd "$(dirname "$0")/.."
TESSERA=${TESSERA:-target/release/tessera}
[ -x "$TESSERA" ] || cargo build --release -p tessera-cli
command -v openssl >/dev/null || { echo "needs openssl" >&2; exit 1; }
RUNS=${RUNS:-3}
SIZE_MIB=${SIZE_MIB:-1024}
if [ -n "${WORK:-}" ]; then
    # A directory given by the caller keeps the unpacked text data.
    mkdir -p "$WORK"
    trap 'rm -rf "$WORK/plain" "$WORK/secure" "$WORK/fresh.bin"' EXIT
else
    WORK=$(mktemp -d /tmp/tessera-cryptobench.XXXXXX)
    trap 'rm -rf "$WORK"' EXIT
fi
export TESSERA_PASSWORD=${TESSERA_PASSWORD:-tessera-benchmark}
# Key derivation is not what is measured: the cheapest parameters (below
# the minimum a real key needs, hence TESSERA_INSECURE_KDF).
export TESSERA_INSECURE_KDF=1
KDF=(--kdf-memory 64 --kdf-iterations 1)

# Fresh incompressible input, written once (the same bytes every round).
openssl enc -aes-128-ctr -nosalt -pbkdf2 -pass pass:tessera-cryptobench </dev/zero 2>/dev/null |
    head -c "$((SIZE_MIB << 20))" >"$WORK/fresh.bin" || true

init() { # kind dir
    case $1 in
    plain) "$TESSERA" init "$2" --encryption none --compression off >/dev/null ;;
    secure) "$TESSERA" init "$2" --compression auto "${KDF[@]}" >/dev/null ;;
    esac
}

# Wall-clock and CPU (user + system) seconds of one command.
seconds() {
    local out
    out=$(mktemp)
    /usr/bin/time -f '%e %U %S' -o "$out" "$@" >/dev/null 2>&1
    awk '{printf "%s %.2f\n", $1, $2 + $3}' "$out"
    rm -f "$out"
}

declare -A T C
for run in $(seq 1 "$RUNS"); do
    for kind in plain secure; do
        rm -rf "${WORK:?}/$kind"
        init $kind "$WORK/$kind"
        sync
        read -r "T[$kind,fresh,$run]" "C[$kind,fresh,$run]" < <(seconds "$TESSERA" backup "$WORK/$kind" - <"$WORK/fresh.bin")
        read -r "T[$kind,dup,$run]" "C[$kind,dup,$run]" < <(seconds "$TESSERA" backup "$WORK/$kind" - <"$WORK/fresh.bin")
        read -r "T[$kind,restore,$run]" "C[$kind,restore,$run]" < <(seconds "$TESSERA" restore "$WORK/$kind" 1 -)
        rm -rf "${WORK:?}/$kind"
    done
    echo "run $run: fresh ${T[plain,fresh,$run]} / ${T[secure,fresh,$run]} s, duplicate ${T[plain,dup,$run]} / ${T[secure,dup,$run]} s, restore ${T[plain,restore,$run]} / ${T[secure,restore,$run]} s (plain / encrypted+compressed)" >&2
done

echo "# encrypted + compression auto vs. neither, ${SIZE_MIB} MiB, ${RUNS} runs ($(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores)"
echo "| measurement | plain MB/s (median) | encrypted+auto MB/s (median) | ratio median | ratio min..max | CPU-time ratio median | min..max |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for what in fresh dup restore; do
    ratios=() plain=() secure=() cpu=()
    for run in $(seq 1 "$RUNS"); do
        p=${T[plain,$what,$run]} s=${T[secure,$what,$run]}
        ratios+=("$(echo "$p / $s" | bc -l)")
        cpu+=("$(echo "${C[plain,$what,$run]} / ${C[secure,$what,$run]}" | bc -l)")
        plain+=("$(echo "$SIZE_MIB * 1.048576 / $p" | bc -l)")
        secure+=("$(echo "$SIZE_MIB * 1.048576 / $s" | bc -l)")
    done
    median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
    lo=$(printf '%s\n' "${ratios[@]}" | sort -g | head -1)
    hi=$(printf '%s\n' "${ratios[@]}" | sort -g | tail -1)
    case $what in fresh) label="backup, fresh incompressible" ;; dup) label="backup, duplicate" ;; restore) label="restore" ;; esac
    clo=$(printf '%s\n' "${cpu[@]}" | sort -g | head -1)
    chi=$(printf '%s\n' "${cpu[@]}" | sort -g | tail -1)
    printf '| %s | %.0f | %.0f | %.2f | %.2f..%.2f | %.2f | %.2f..%.2f |\n' "$label" "$(median "${plain[@]}")" "$(median "${secure[@]}")" \
        "$(median "${ratios[@]}")" "$lo" "$hi" "$(median "${cpu[@]}")" "$clo" "$chi"
done

# Text-like data: a real source tree.
TEXT=${TEXT:-}
if [ -z "$TEXT" ]; then
    src=/work/shared/data/code-redis-wc.tar.zst
    [ -r "$src" ] || { echo "no text data ($src); set TEXT" >&2; exit 0; }
    mkdir -p "$WORK/redis"
    [ -e "$WORK/redis/code-redis-wc/v0001.tar" ] ||
        zstd -dc --long=31 "$src" | tar -xf - -C "$WORK/redis"
    TEXT=$WORK/redis/code-redis-wc/v0001.tar
fi
size=()
for kind in plain secure; do
    rm -rf "${WORK:?}/$kind"
    init $kind "$WORK/$kind"
    "$TESSERA" backup "$WORK/$kind" - <"$TEXT" >/dev/null
    size[${#size[@]}]=$(du -sb "$WORK/$kind" | cut -f1)
done
logical=$(du -sb "$TEXT" | cut -f1)
printf '\ntext-like data %s (%d bytes): repository %d bytes uncompressed, %d bytes encrypted+auto: %.2fx smaller\n' \
    "$TEXT" "$logical" "${size[0]}" "${size[1]}" "$(echo "${size[0]} / ${size[1]}" | bc -l)"
