#!/usr/bin/env bash
# The unbounded corruption campaign (issue 20): the test
# crates/tessera-cli/tests/campaign.rs run for several seeds, damaging every
# object of each kind (not one per kind) in every repository variant, and
# printing each seed's table (per object kind: cases, detected, exempt,
# repaired, unrecoverable, failures).
# Usage: scripts/corruption-campaign.sh [FIRST_SEED] [SEEDS] [JOBS]
# (defaults 1, 5, 2). Exits non-zero if any seed has a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
first=${1:-1}
seeds=${2:-5}
export TESSERA_CAMPAIGN_JOBS=${3:-2}
export TESSERA_CAMPAIGN_ALL_OBJECTS=1
status=0
for ((s = first; s < first + seeds; s++)); do
  echo "== seed $s"
  TESSERA_CAMPAIGN_SEED=$s cargo test --release -q -p tessera-cli --test campaign -- --nocapture || status=1
done
exit $status
