#!/usr/bin/env bash
# Replicas of the notebook images Fenwicks installs on, one venv per image, each holding
# the image's own versions of TensorFlow, JAX, Keras, orbax and what they need, pinned in
# tools/replicas/IMAGE.txt (read from each image's public definition; see that file):
#   colab-gpu   Colab's GPU runtime (googlecolab/backend-info pip-freeze.gpu.txt, Python
#               3.13): tensorflow 2.20.0, tf_keras, jax 0.7.2 with jax-cuda12-plugin/-pjrt,
#               keras 3.13.2, flax, orbax-checkpoint 0.12.4, tensorstore, tensorflow-datasets,
#               protobuf 5.29.6, numpy 2.1.3, scikit-learn
#   colab-tpu   Colab's TPU runtime (pip-freeze.tpu.txt, Python 3.13): jax 0.7.2, libtpu
#               0.0.21.1, keras 3.13.2, flax, orbax-checkpoint, tensorflow-datasets, protobuf
#               7.35.1, scikit-learn; no TensorFlow
#   kaggle-tpu  Kaggle/docker-python tpu/ (Python 3.12; no public freeze: its
#               requirements.in resolved from PyPI): tensorflow-cpu 2.20.0, jax[tpu] 0.7.2,
#               then libtpu 0.0.17 force-reinstalled, keras>3, flax, tensorflow-datasets,
#               tensorflow-probability, scikit-learn; ISTPUVM=1, TPU_PROCESS_ADDRESSES=local
# (scikit-learn: all three images ship it, and the demo reads its bundled digits.)
# The rest of each image (torch, torch_xla, CUDA libraries, ...) is left out: it comes from
# indexes this machine cannot reach, or is not what Fenwicks' install meets. For each image
# it runs README.md's first cell for that platform as written (its folder pointed at this
# clone; a step that needs an unreachable index is skipped, and says so), then `pip check`,
# `python -m fenwicks info` and the demo, and prints one summary line per image and a table
# of the image's TensorFlow, JAX, Keras, numpy, protobuf, ... before and after the cell.
# On the TPU images it also runs info and the demo with FENWICKS_ENGINE=tf: the TPU
# diagnosis of the image's TensorFlow, and what that TensorFlow trains on its own (the CPU).
# Each venv takes 1.3-3.2 GB, downloaded from PyPI (then pip's cache): not part of the test suite.
#
# Usage:  tools/platform_replicas.sh [IMAGE ...]     (default: kaggle-tpu colab-tpu colab-gpu)
# Environment:
#   PLATFORM_REPLICAS_DIR     where the venvs and logs go (default: $TMPDIR/fenwicks-replicas;
#                             never inside the repository). Each image's venv is rebuilt.
#   PLATFORM_REPLICAS_PYTHON  the interpreter the venvs are made from (default: the image's
#                             Python version, pythonX.Y on PATH or under pyenv's root)
#   PLATFORM_REPLICAS_EPOCHS  demo epochs (default: the demo's own)
# Exit status: 0 if every step passed on every image, 1 otherwise.
set -u -o pipefail
set -f  # no globbing: pip arguments such as jax[tpu] are not file patterns

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
IMAGES=("$@")
[ ${#IMAGES[@]} -eq 0 ] && IMAGES=(kaggle-tpu colab-tpu colab-gpu)
BASE="${PLATFORM_REPLICAS_DIR:-${TMPDIR:-/tmp}/fenwicks-replicas}"
case "$(cd "$(dirname "$BASE")" 2>/dev/null && pwd)/" in
  "$REPO"/*) echo "PLATFORM_REPLICAS_DIR=$BASE is inside the repository; use another" >&2
             exit 2 ;;
esac
mkdir -p "$BASE"
SUMMARY=()
STATUS=0

log() { printf '[replicas %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
last_line() { grep -v '^\s*$' "$1" | grep -vE '^(WARNING: All log|I0000|W0000|E0000)' \
  | tail -1 | cut -c1-300; }

# What each image has, as pip arguments (installed in this order, one line a step), its
# Python, its environment, and the steps of its build that this machine cannot make.
image_packages() {
  case "$1" in
    kaggle-tpu|colab-tpu|colab-gpu) echo "-r $REPO/tools/replicas/$1.txt" ;;
    *) return 1 ;;
  esac
}
image_python_version() {
  case "$1" in
    kaggle-tpu) echo 3.12 ;;
    *) echo 3.13 ;;
  esac
}
# The interpreter for IMAGE: PLATFORM_REPLICAS_PYTHON, else pythonX.Y that runs, else
# pyenv's newest X.Y.
image_python() {
  local ver candidate
  ver=$(image_python_version "$1")
  if [ -n "${PLATFORM_REPLICAS_PYTHON:-}" ]; then echo "$PLATFORM_REPLICAS_PYTHON"; return; fi
  if "python$ver" -c "" >/dev/null 2>&1; then command -v "python$ver"; return; fi
  for candidate in $(find "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")/versions" \
                       -mindepth 1 -maxdepth 1 -name "$ver.*" 2>/dev/null | sort -V -r); do
    [ -x "$candidate/bin/python$ver" ] && { echo "$candidate/bin/python$ver"; return; }
  done
  return 1
}
image_env() {
  case "$1" in
    kaggle-tpu) echo "ISTPUVM=1 TPU_PROCESS_ADDRESSES=local" ;;
    *) echo "" ;;
  esac
}
image_skipped() {
  case "$1" in
    kaggle-tpu) echo "the build's --find-links to Google's libtpu index and PyTorch's (not reachable here: torch, torch_xla 2.8, tunix, ... left out; jax and libtpu 0.0.17 come from PyPI); tensorflow-hub and tensorflow-io (tensorflow-hub pulls tf-keras 2.21 and with it a second TensorFlow, tensorflow 2.21.0, over tensorflow-cpu 2.20.0: what Kaggle's resolver makes of it has no public freeze)" ;;
    colab-tpu) echo "the image's other packages (torch, ...); its freeze's versions are used for every package the replica has" ;;
    colab-gpu) echo "the image's other packages (torch, CUDA and cuDNN libraries, ...): JAX's CUDA plugin finds no CUDA here (its version check logs 'Unable to load CUDA' when JAX first makes its devices, at the demo's first checkpoint; JAX stays on the CPU: jax_platforms=cpu, backends ['cpu'])" ;;
  esac
}

# README.md's first cell for IMAGE: the code block after `<!-- replica: IMAGE -->`.
readme_cell() {
  awk -v name="<!-- replica: $1 -->" '
    $0 == name {found = 1; next}
    found && /^```/ {if (inside) exit; inside = 1; next}
    inside {print}' "$REPO/README.md"
}

# The packages whose versions installing Fenwicks must keep, as the table prints them.
KEY_PACKAGES="tensorflow tensorflow-cpu tf-keras keras jax jaxlib jax-cuda12-plugin libtpu"
KEY_PACKAGES+=" numpy protobuf ml-dtypes orbax-checkpoint tensorstore flax tensorflow-datasets"
KEY_PACKAGES+=" tensorboard gcsfs fsspec h5py requests"
declare -A VERSIONS=()
# A package's version in a freeze file, names compared as pip does (case, - _ .).
version_in() {
  awk -F'==' -v want="$1" '{name = tolower($1); gsub(/[-_.]+/, "-", name)}
    name == want {print $2}' "$2"
}
versions_row() {
  local image="$1" dir="$2" pkg before after
  for pkg in $KEY_PACKAGES; do
    before=$(version_in "$pkg" "$dir/before.txt")
    after=$(version_in "$pkg" "$dir/after.txt")
    if [ "$before" = "$after" ]; then VERSIONS[$image,$pkg]="${before:--}"
    else VERSIONS[$image,$pkg]="${before:-none} -> ${after:-none}"; fi
  done
}
print_versions() {
  local image pkg
  printf '%-20s' "package"; for image in "${IMAGES[@]}"; do printf ' | %-22s' "$image"; done; echo
  for pkg in $KEY_PACKAGES; do
    printf '%-20s' "$pkg"
    for image in "${IMAGES[@]}"; do printf ' | %-22s' "${VERSIONS[$image,$pkg]:-?}"; done
    echo
  done
}

run_image() {
  local image="$1" dir="$BASE/$1" venv line ok=1
  local -a envs
  read -r -a envs <<<"$(image_env "$image")"
  venv="$dir/venv"
  rm -rf "$dir" && mkdir -p "$dir"
  log "$image: venv in $venv"
  local py
  if ! py=$(image_python "$image"); then
    SUMMARY+=("$image | no Python $(image_python_version "$image") here (the image's); set PLATFORM_REPLICAS_PYTHON")
    return 1
  fi
  log "$image: $("$py" --version 2>&1) ($py)"
  "$py" -m venv "$venv" || { SUMMARY+=("$image | venv failed"); return 1; }
  local pip="$venv/bin/pip" python="$venv/bin/python"
  "$pip" install -q --upgrade pip >/dev/null 2>&1
  while read -r step; do
    log "$image: pip install $step"
    # shellcheck disable=SC2086  # one line of pip arguments, split on purpose
    if ! "$pip" install -q --no-compile $step >>"$dir/image.log" 2>&1; then
      SUMMARY+=("$image | building the image failed at 'pip install $step' (see $dir/image.log)")
      return 1
    fi
  done < <(image_packages "$image")
  log "$image: skipped: $(image_skipped "$image")"
  "$pip" freeze --exclude-editable | sort >"$dir/before.txt"
  local check_before="clean"
  "$pip" check >"$dir/pip-check-before.log" 2>&1 || check_before="FAILED: $(head -1 "$dir/pip-check-before.log")"

  # An image without TensorFlow: what `import fenwicks` says before the cell installs it.
  local before_cell=""
  if ! "$python" -c "import tensorflow" >/dev/null 2>&1; then
    (cd "$dir" && env "${envs[@]}" PYTHONPATH="$REPO" "$python" -c "import fenwicks") \
      >"$dir/before-cell.log" 2>&1
    before_cell=" | before the cell, import fenwicks: $(last_line "$dir/before-cell.log")"
  fi

  # The README cell: `!` lines run in a shell whose pip is the venv's, the rest is Python.
  local cell
  cell=$(readme_cell "$image" | sed -e "s#/kaggle/working/fenwicks#$REPO#g" \
         -e "s#/content/fenwicks#$REPO#g" -e "s#/tmp/keep.txt#$dir/keep.txt#g")
  if [ -z "$cell" ]; then SUMMARY+=("$image | README.md has no cell marked '$image'"); return 1; fi
  printf '%s\n' "$cell" >"$dir/cell.txt"
  printf '%s\n' "$cell" | grep -v '^!' >"$dir/cell.py"
  local cell_result="ok" shell_line
  while IFS= read -r shell_line; do
    log "$image: cell: ${shell_line:0:120}"
    if ! (cd "$dir" && env "${envs[@]}" PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" \
          bash -c "${shell_line#!}") >>"$dir/cell.log" 2>&1; then
      cell_result="FAILED at ${shell_line:0:60}: $(last_line "$dir/cell.log")"; ok=0; break
    fi
  done < <(printf '%s\n' "$cell" | grep '^!')
  if [ "$ok" = 1 ] && ! (cd "$dir" && env "${envs[@]}" timeout 600 "$python" cell.py) \
        >>"$dir/cell.log" 2>&1; then
    cell_result="FAILED: $(last_line "$dir/cell.log")"; ok=0
  fi
  "$pip" freeze --exclude-editable | sort >"$dir/after.txt"
  # What installing Fenwicks changed among the image's packages (must be none).
  local changed
  changed=$(join -t= -j1 <(sed 's/==/=/' "$dir/before.txt" | sort -t= -k1,1) \
                         <(sed 's/==/=/' "$dir/after.txt" | sort -t= -k1,1) \
            | awk -F= '$2 != $3 {printf "%s %s->%s, ", $1, $2, $3}' | sed 's/, $//')
  [ -n "$changed" ] && ok=0
  local added
  added=$(LC_ALL=C comm -13 <(cut -d= -f1 "$dir/before.txt" | LC_ALL=C sort) \
                             <(cut -d= -f1 "$dir/after.txt" | LC_ALL=C sort) \
          | grep -iE '^(tensorflow|tf-|jax|libtpu|keras)' | tr '\n' ' ' | sed 's/ $//')

  local check="clean"
  if ! "$pip" check >"$dir/pip-check.log" 2>&1; then
    check="FAILED: $(head -1 "$dir/pip-check.log")"; ok=0
  fi
  local info
  if (cd "$dir" && env "${envs[@]}" timeout 600 "$python" -m fenwicks info) \
       >"$dir/info.log" 2>"$dir/info.err"; then
    info="engine $(sed -n 's/^engine *\([a-z]*\).*/\1/p' "$dir/info.log"),"
    info+=" $(sed -n 's/^accelerator *//p' "$dir/info.log")"
    info+=" ($(sed -n 's/^chosen by *//p' "$dir/info.log"))"
    grep -q '^WARNING' "$dir/info.log" && info+=", WARNING row"
  else
    info="FAILED: $(last_line "$dir/info.err")"; ok=0
  fi
  # On a TPU image, what the tf engine would say: the TPU diagnosis of its TensorFlow.
  local tf_info=""
  if [ "${image%-tpu}" != "$image" ]; then
    if (cd "$dir" && env "${envs[@]}" FENWICKS_ENGINE=tf timeout 600 "$python" -m fenwicks \
          info) >"$dir/info-tf.log" 2>"$dir/info-tf.err"; then
      tf_info=" | with FENWICKS_ENGINE=tf: $(sed -n 's/^accelerator *//p' "$dir/info-tf.log")"
      tf_info+=" ($(sed -n 's/^chosen by *//p' "$dir/info-tf.log"))"
    else
      tf_info=" | with FENWICKS_ENGINE=tf: FAILED: $(last_line "$dir/info-tf.err")"
    fi
  fi
  local demo t0 t1 epochs=()
  [ -n "${PLATFORM_REPLICAS_EPOCHS:-}" ] && epochs=(--epochs "$PLATFORM_REPLICAS_EPOCHS")
  t0=$(date +%s)
  if (cd "$dir" && env "${envs[@]}" timeout 1200 "$python" -m fenwicks demo \
        --work-dir "$dir/demo" "${epochs[@]}") >"$dir/demo.log" 2>&1; then
    t1=$(date +%s)
    demo="accuracy $(sed -n 's/^test accuracy *\([0-9.]*\).*/\1/p' "$dir/demo.log") in $((t1 - t0)) s"
  else
    demo="FAILED: $(last_line "$dir/demo.log")"; ok=0
  fi
  # On a TPU image, the same demo on the tf engine: what this TensorFlow trains on its own.
  local tf_demo=""
  if [ -n "$tf_info" ]; then
    t0=$(date +%s)
    if (cd "$dir" && env "${envs[@]}" FENWICKS_ENGINE=tf timeout 1200 "$python" -m fenwicks \
          demo --work-dir "$dir/demo-tf" "${epochs[@]}") >"$dir/demo-tf.log" 2>&1; then
      t1=$(date +%s)
      tf_demo=" | demo with FENWICKS_ENGINE=tf: accuracy $(sed -n \
        's/^test accuracy *\([0-9.]*\).*/\1/p' "$dir/demo-tf.log") in $((t1 - t0)) s"
    else
      tf_demo=" | demo with FENWICKS_ENGINE=tf: FAILED: $(last_line "$dir/demo-tf.log")"
    fi
  fi
  versions_row "$image" "$dir"
  line="$image ($("$python" --version 2>&1))$before_cell | cell $cell_result"
  line+=" | pip check before the cell $check_before, after $check"
  line+=" | changed by fenwicks: ${changed:-none}"
  line+="${added:+ (added: $added)} | info $info$tf_info | demo $demo$tf_demo"
  SUMMARY+=("$line")
  [ $ok = 1 ]
}

for image in "${IMAGES[@]}"; do
  if ! image_packages "$image" >/dev/null; then
    echo "unknown image '$image'; known: kaggle-tpu colab-tpu colab-gpu" >&2; exit 2
  fi
done
for image in "${IMAGES[@]}"; do
  run_image "$image" || STATUS=1
done
echo
echo "Image replicas (venvs from PyPI; README first cell, pip check, fenwicks info, demo):"
for image in "${IMAGES[@]}"; do
  echo "$image: skipped: $(image_skipped "$image")"
done
for line in "${SUMMARY[@]}"; do echo "$line"; done
echo
echo "Versions before -> after the README cell ('-': not in the image; one version: unchanged):"
print_versions
echo "logs: $BASE"
exit $STATUS
