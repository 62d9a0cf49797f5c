# Sourced by tests/run_all.sh and .ci/run: each stage of the test run timed against its budget.
# A stage over its budget says so at once, with the longest tests of the ctest stage, and the
# table at the end (stages_report) lists every stage with its time and budget: a runaway test is
# seen when it lands, not when CI reaches its hard limit. Budgets are seconds on a 2-core machine
# (docs/testing.md, "Stages and budgets"); DETAUDIT_STAGE_BUDGETS=strict makes a stage over budget fail.
#   stage NAME BUDGET_SECONDS COMMAND...
_stages_file=${_stages_file:-$(mktemp)}
export _stages_file

stage() {
  local name=$1 budget=$2
  shift 2
  local start=$SECONDS status=0
  echo "stage: $name (budget ${budget} s)" >&2
  "$@" || status=$?
  local took=$((SECONDS - start))
  printf '%s\t%s\t%s\t%s\n' "$name" "$took" "$budget" "$status" >>"$_stages_file"
  if ((took > budget)); then
    echo "stage: $name took ${took} s, over its budget of ${budget} s" >&2
    [ -n "${STAGE_LONGEST_FROM:-}" ] && [ -f "$STAGE_LONGEST_FROM" ] && stages_longest "$STAGE_LONGEST_FROM"
    if [ "${DETAUDIT_STAGE_BUDGETS:-}" = strict ] && ((status == 0)); then status=97; fi
  else
    echo "stage: $name took ${took} s (budget ${budget} s)" >&2
  fi
  return "$status"
}

# The longest tests of a ctest log, the ten slowest first.
stages_longest() {
  echo "stage: the longest tests:" >&2
  grep -E 'Test +#[0-9]+: ' "$1" | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2\t\1/' |
    sort -rn | head -10 | awk -F'\t' '{printf "  %8.1f s  %s\n", $1, $2}' >&2
}

stages_report() {
  [ -s "$_stages_file" ] || return 0
  echo "stages (seconds, budget):" >&2
  awk -F'\t' '{t += $2; b += $3; printf "  %-28s %6d %6d%s\n", $1, $2, $3, ($2 > $3 ? "  over" : "")}
              END {printf "  %-28s %6d %6d\n", "total", t, b}' "$_stages_file" >&2
}
