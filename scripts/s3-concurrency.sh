#!/usr/bin/env bash
# The long many-clients campaign on a real S3 server: 4 clients back up
# different sources (two of them sharing a file) into one repository at once,
# with a deletion and a gc started alongside, for ROUNDS rounds (default 20);
# after every round each committed backup must restore byte-identically and
# none may be lost. (The tests run the same code for 3 rounds.)
#
#   scripts/s3-concurrency.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin
trap 'scripts/s3-server.sh stop' EXIT
eval "$(scripts/s3-server.sh start)"
TESSERA_S3_ROUNDS=${1:-20} cargo test --release -p tessera-cli --test s3 \
    four_clients_back_up_at_once -- --nocapture
