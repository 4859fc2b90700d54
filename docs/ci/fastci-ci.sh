#!/usr/bin/env bash
# FastCI in any CI system (GitLab, Buildkite, Jenkins, ...): the steps of
# docs/ci/github-actions.yml in one script. How to call it: docs/CI.md, "Other CI systems".
#
#   FASTCI_ARTIFACTS=/some/dir docs/ci/fastci-ci.sh main|pr|nightly
#
# Run it from the repository root, with `fastci` and `bazel` on PATH, on the same kind
# of machine for every mode (same image, same GPUs: evidence is trusted only in the
# environment it was recorded in).
#
# The CI system moves files; this script never talks to it:
#   $FASTCI_ARTIFACTS/in/   before the job: what the newest main jobs published
#                           (evidence-*.jsonl.gz, calibration.db). May be empty.
#   $FASTCI_ARTIFACTS/out/  after the job: what to publish or show.
#                           main:    evidence-main.jsonl.gz, calibration.db
#                           pr:      plan.txt, run.txt, plan.json, summary.md
#                           nightly: evidence-nightly.jsonl.gz, plan.txt, run.txt,
#                                    misses/, eval/ (results.jsonl, summary.md,
#                                    report.html, baseline/: the run-all cache)
# FASTCI_ARTIFACTS must be outside the checkout, or ignored by git (.gitignore or
# .git/info/exclude): files git sees are part of the change and of the tree a plan is for.
#
# Settings (environment):
#   FASTCI_ARTIFACTS      required (above)
#   FASTCI_RECORD         main: 0 = do not record (a calibration-only run). Default 1.
#   FASTCI_CALIBRATE      main: 1 = also run `fastci calibrate` (nightly). Default 0.
#   FASTCI_BASE           pr: the revision the change is compared with. Default origin/main.
#   FASTCI_SINCE          nightly: the main commit before the day's merges. Default: the
#                         newest first-parent commit older than FASTCI_SINCE_DATE.
#   FASTCI_SINCE_DATE     nightly: default "24 hours ago".
#   FASTCI_FAULTS         nightly: generated faults per changed unit. Default 1.
#   FASTCI_REMOTE_CACHE   grpc://host:port of a shared Bazel remote cache (optional;
#                         written to user.bazelrc, which must be git-ignored).
#   FASTCI_PYTHON         the Python that writes the pr summary. Default python3.
#   FASTCI_STORE, FASTCI_CALIBRATION, FASTCI_PLAN: as for fastci (docs/CONFIG.md).
#
# Exit status: 0 when every step passed; else the status of the first step that failed.
# Steps after a failure still run where they make sense (export, summary, reports).
set -euo pipefail

STORE=${FASTCI_STORE:-.fastci/evidence.db}
CALIBRATION=${FASTCI_CALIBRATION:-.fastci/calibration.db}
PLAN=${FASTCI_PLAN:-.fastci/plan.json}
status=0

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
}

log() {
  printf 'fastci-ci: %s\n' "$*" >&2
}

die() {
  log "error: $*"
  exit 2
}

# failed RC WHAT: remember the first failure, go on.
failed() {
  log "$2 exited $1"
  if [ "$status" -eq 0 ]; then status=$1; fi
}

check_artifacts() {
  [ -n "${FASTCI_ARTIFACTS:-}" ] || die "set FASTCI_ARTIFACTS to a directory for the job's files"
  mkdir -p "$FASTCI_ARTIFACTS/in" "$FASTCI_ARTIFACTS/out"
  local dir top
  dir=$(cd "$FASTCI_ARTIFACTS" && pwd -P)
  IN=$dir/in
  OUT=$dir/out
  top=$(git rev-parse --show-toplevel) || die "run this from inside the repository"
  top=$(cd "$top" && pwd -P)
  case "$dir/" in
    "$top"/*)
      git check-ignore -q "$dir" ||
        die "$FASTCI_ARTIFACTS is inside the checkout and git does not ignore it:" \
            "its files would be part of the change (add it to .git/info/exclude)"
      ;;
  esac
}

use_remote_cache() {
  [ -n "${FASTCI_REMOTE_CACHE:-}" ] || return 0
  git check-ignore -q user.bazelrc ||
    die "user.bazelrc is not git-ignored: writing it would change the tree a plan is for"
  printf 'build --config=remote_cache\nbuild:remote_cache --remote_cache=%s\n' \
    "$FASTCI_REMOTE_CACHE" >> user.bazelrc
  log "Bazel remote cache: $FASTCI_REMOTE_CACHE (user.bazelrc)"
}

# Import every evidence file the CI system put in $IN; restore the calibration store.
# Returns non-zero when the import failed (the store is then unchanged).
restore() {
  local files
  shopt -s nullglob
  files=("$IN"/*.jsonl.gz)
  shopt -u nullglob
  if [ ${#files[@]} -gt 0 ]; then
    fastci evidence import "${files[@]}" || return $?
  else
    log "no evidence in $IN: the store starts empty (a plan without evidence runs everything)"
  fi
  if [ -f "$IN/calibration.db" ] && [ ! -e "$CALIBRATION" ]; then
    mkdir -p "$(dirname "$CALIBRATION")"
    cp "$IN/calibration.db" "$CALIBRATION"
  fi
}

# publish NAME: export the store as $OUT/evidence-NAME.jsonl.gz.
publish() {
  if [ -f "$STORE" ]; then
    fastci evidence export --out "$OUT/evidence-$1.jsonl.gz" || failed $? "fastci evidence export"
  else
    log "no evidence store at $STORE: nothing to export"
  fi
}

mode_main() {
  # Never publish a store that lost its history because the import failed.
  restore || die "could not import the evidence in $IN: not recording, not publishing"
  if [ "${FASTCI_RECORD:-1}" != 0 ]; then
    fastci record || failed $? "fastci record"
  fi
  if [ "${FASTCI_CALIBRATE:-0}" = 1 ]; then
    # Resumable: run it again at the same commit and it skips the rungs already stored.
    fastci calibrate || failed $? "fastci calibrate"
  fi
  publish main
  if [ -f "$CALIBRATION" ]; then
    cp "$CALIBRATION" "$OUT/calibration.db"
  fi
}

mode_pr() {
  # Without the evidence the plan runs more tests, never fewer: go on.
  restore || log "could not import the evidence in $IN: planning with the store as it is"
  local base=${FASTCI_BASE:-origin/main}
  if ! fastci plan --base "$base" | tee "$OUT/plan.txt"; then
    log "fastci plan failed: fastci run runs every test at full workload"
  fi
  fastci run | tee "$OUT/run.txt" || failed $? "fastci run"
  if [ -f "$PLAN" ]; then
    cp "$PLAN" "$OUT/plan.json"
  fi
  summary "$base" > "$OUT/summary.md"
}

# summary BASE: Markdown for the merge request, from $OUT/plan.txt, run.txt and plan.json.
summary() {
  "${FASTCI_PYTHON:-python3}" - "$OUT" "$1" <<'EOF'
import json, pathlib, sys
out, base = pathlib.Path(sys.argv[1]), sys.argv[2]
def text(name):
    path = out / name
    return path.read_text().strip() if path.is_file() else ""
run = text("run.txt").splitlines()
print("### FastCI\n\n```\n" + (text("plan.txt") or "fastci plan printed nothing") + "\n```\n")
print("**Result:** " + (run[-1] if run else "fastci run did not finish"))
try:
    skipped = json.loads(text("plan.json") or "{}").get("skipped", [])
except ValueError:
    skipped = []
if skipped:
    print(f"\n{len(skipped)} test(s) skipped:\n")
    for s in skipped[:200]:
        print(f"- `{s.get('id')}`: {s.get('why')}")
    if len(skipped) > 200:
        print(f"- ... and {len(skipped) - 200} more (plan.json)")
print(f"\nWhy was a test skipped? `fastci explain --base {base} <test id>`")
EOF
}

mode_nightly() {
  restore || failed $? "fastci evidence import"
  local since head
  since=${FASTCI_SINCE:-$(git rev-list -1 --first-parent \
    --before="${FASTCI_SINCE_DATE:-24 hours ago}" HEAD)}
  head=$(git rev-parse HEAD)
  if [ -n "$since" ]; then
    since=$(git rev-parse --verify "$since^{commit}")
  fi

  # Shadow: everything runs; the miss report names failures the plan would have skipped.
  fastci plan --shadow --base "${since:-HEAD}" | tee "$OUT/plan.txt" ||
    failed $? "fastci plan --shadow"
  fastci run | tee "$OUT/run.txt" || failed $? "fastci run (shadow)"
  mkdir -p "$OUT/misses"
  if [ -d .fastci/runs ]; then
    find .fastci/runs -maxdepth 1 -name 'miss-report-*.json' -exec cp {} "$OUT/misses/" ';'
  fi

  if [ -z "$since" ] || [ "$since" = "$head" ]; then
    log "no merges since ${FASTCI_SINCE_DATE:-24 hours ago}: nothing to evaluate"
  else
    # Exits 1 when a plan missed a test that failed when everything ran.
    fastci eval "$since..$head" --faults "${FASTCI_FAULTS:-1}" --out "$OUT/eval" ||
      failed $? "fastci eval"
  fi
  publish nightly
}

case "${1:-}" in
  main | pr | nightly)
    check_artifacts
    use_remote_cache
    "mode_$1"
    exit "$status"
    ;;
  -h | --help | help)
    usage
    ;;
  *)
    usage >&2
    exit 2
    ;;
esac
