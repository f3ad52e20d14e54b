#!/usr/bin/env bash
# The fault campaign at full size: ROUNDS (default 100) rounds of
# backup / restore / check through the fault-injecting backend layer
# (backend::testing::Faulty: ~1.5 % of requests dropped and ~1.5 %
# answered with a lost response or a truncated read; read-ahead and the
# other hints reach the store as in production), first on a local repository, then on
# a loopback S3 server (versitygw, scripts/s3-server.sh). Every backup must
# either commit and restore byte-identically or fail cleanly, and every
# committed backup must restore identically and `check --read-data` pass
# after every round. Prints the counts. CI runs the same test with 24
# rounds on a local repository.
#
#   scripts/fault-campaign.sh [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-100}
export PATH=$PATH:/usr/local/go/bin
TEST=backend::testing::faulty::tests::backups_through_faults_commit_whole_or_fail_cleanly
run() {
    TESSERA_FAULT_ROUNDS=$ROUNDS cargo test -q -p tessera --lib "$TEST" -- \
        --exact --nocapture 2>&1 | grep -E "fault campaign|panicked|FAILED|test result"
}
echo "local repository:"
run
if [[ -z ${TESSERA_TEST_S3:-} ]]; then
    trap 'scripts/s3-server.sh stop' EXIT
    eval "$(scripts/s3-server.sh start)"
fi
echo "S3 repository ($TESSERA_TEST_S3):"
TESSERA_FAULT_S3=$TESSERA_TEST_S3/faults-$$-$(date +%s) run
