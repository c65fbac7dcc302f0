#!/usr/bin/env bash
# The supported-TensorFlow matrix: for each TensorFlow version, a fresh venv with that
# TensorFlow installed FIRST (as Colab and Kaggle have it), Fenwicks installed on top
# without a TensorFlow extra, then `pip check`, `python -m fenwicks info`, the demo and
# the fast tests. Prints one summary line per version at the end.
#
# Usage:  tools/tf_matrix.sh [VERSION[+PACKAGE==X[+...]] ...]
#         (default: 2.20 2.21, the range's ends). Packages after '+' are installed together
#         with TensorFlow, before Fenwicks: e.g. 2.20+protobuf==5.28.3 is a machine whose
#         TF 2.20 came with the oldest protobuf it allows, as a pinned image may have it.
# Environment:
#   TF_MATRIX_TESTS   pytest arguments (default: -m "not slow"), e.g.
#                     TF_MATRIX_TESTS="tests/test_accel.py tests/test_package.py"
#   TF_MATRIX_DIST    the TensorFlow distribution installed first (default tensorflow-cpu)
#   TF_MATRIX_PYTHON  the interpreter the venvs are made from (default python3)
#   TF_MATRIX_KEEP=1  keep the venvs (about 1.5 GB each) instead of deleting them
#   TF_MATRIX_DIR     where the venvs go (default: a new directory under $TMPDIR)
# Exit status: 0 if every version passed every step, 1 otherwise.
set -u -o pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSIONS=("$@")
[ ${#VERSIONS[@]} -eq 0 ] && VERSIONS=(2.20 2.21)
TESTS="${TF_MATRIX_TESTS:--m \"not slow\"}"
DIST="${TF_MATRIX_DIST:-tensorflow-cpu}"
PY="${TF_MATRIX_PYTHON:-python3}"
BASE="${TF_MATRIX_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/tf_matrix.XXXXXX")}"
mkdir -p "$BASE"
SUMMARY=()
STATUS=0

log() { printf '[tf_matrix %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

run_version() {
  local spec="$1" version="${1%%+*}" extra=() dir="$BASE/tf-$1" venv line ok=1
  [ "$spec" != "$version" ] && IFS=+ read -r -a extra <<<"${spec#*+}"
  venv="$dir/venv"
  mkdir -p "$dir"
  log "TF $version: venv in $venv"
  "$PY" -m venv "$venv" || { SUMMARY+=("tf $version: venv failed"); return 1; }
  local pip="$venv/bin/pip" python="$venv/bin/python"
  "$pip" install -q --upgrade pip >/dev/null 2>&1
  log "TF $version: pip install $DIST==$version.* ${extra[*]}"
  if ! "$pip" install -q "$DIST==$version.*" "${extra[@]}" >"$dir/install-tf.log" 2>&1; then
    SUMMARY+=("tf $version: installing $DIST failed (see $dir/install-tf.log)"); return 1
  fi
  "$pip" freeze --exclude-editable | sort >"$dir/before.txt"
  local tf_version
  tf_version=$("$pip" show "$DIST" 2>/dev/null | sed -n 's/^Version: //p')
  log "TF $version: pip install -e $REPO[test] on top of $DIST $tf_version"
  if ! "$pip" install -q -e "$REPO[test]" >"$dir/install-fenwicks.log" 2>&1; then
    SUMMARY+=("tf $tf_version: installing fenwicks failed (see $dir/install-fenwicks.log)")
    return 1
  fi
  "$pip" freeze --exclude-editable | sort >"$dir/after.txt"
  # What installing Fenwicks changed among the packages TensorFlow brought (must be none).
  local changed
  changed=$(join -t= -j1 <(sed 's/==/=/' "$dir/before.txt" | sort -t= -k1,1) \
                         <(sed 's/==/=/' "$dir/after.txt" | sort -t= -k1,1) \
            | awk -F= '$2 != $3 {printf "%s %s->%s, ", $1, $2, $3}' | sed 's/, $//')
  [ -n "$changed" ] && ok=0
  local check="clean"
  if ! "$pip" check >"$dir/pip-check.log" 2>&1; then
    check="FAILED: $(head -1 "$dir/pip-check.log")"; ok=0
  fi
  local info="failed"
  if (cd "$dir" && timeout 600 "$python" -m fenwicks info >"$dir/info.log" 2>&1); then
    info="ok ($(sed -n 's/^accelerator *//p' "$dir/info.log" | head -1), keras $(sed -n \
      's/^keras *//p' "$dir/info.log"))"
  else
    ok=0
  fi
  local demo="failed" t0 t1
  t0=$(date +%s)
  if (cd "$dir" && timeout 1200 "$python" -m fenwicks demo --work-dir "$dir/demo" \
        >"$dir/demo.log" 2>&1); then
    t1=$(date +%s)
    demo="accuracy $(sed -n 's/^test accuracy *\([0-9.]*\).*/\1/p' "$dir/demo.log") in $((t1 - t0)) s"
  else
    ok=0
  fi
  local tests="failed" summary
  t0=$(date +%s)
  (cd "$REPO" && eval timeout 3600 "$python" -m pytest -q -p no:cacheprovider $TESTS) \
    >"$dir/tests.log" 2>&1
  local rc=$?
  t1=$(date +%s)
  summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|error)' "$dir/tests.log" | tail -1 \
            | sed 's/=//g; s/^ *//; s/ *$//')
  if [ $rc -eq 0 ]; then tests="${summary:-passed} (wall $((t1 - t0)) s)"; else
    tests="FAILED: ${summary:-exit $rc} (see $dir/tests.log)"; ok=0; fi
  line="tf $tf_version${extra[*]:+ (with ${extra[*]})} | pip check $check"
  line+=" | upgraded by fenwicks: ${changed:-none}"
  line+=" | info $info | demo $demo | tests $tests"
  SUMMARY+=("$line")
  if [ "${TF_MATRIX_KEEP:-0}" != 1 ]; then rm -rf "$venv"; fi
  [ $ok = 1 ]
}

for version in "${VERSIONS[@]}"; do
  run_version "$version" || STATUS=1
done
echo
echo "TensorFlow matrix ($DIST installed first, fenwicks -e [test] on top; tests: $TESTS)"
for line in "${SUMMARY[@]}"; do echo "$line"; done
echo "logs: $BASE"
exit $STATUS
