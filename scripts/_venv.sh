# shellcheck shell=bash
# Sourced by scripts/demo.sh and scripts/test.sh: make sure .venv exists and has this checkout
# installed (editable) with the extras dev, tf, crt and torch.
#
# Re-runs are fast: after a successful install the hash of pyproject.toml, the extras, the
# torch pin, the checkout's path and the Python version is stamped into .venv/.installed, and
# pip runs again only when that hash changes or prefetchd no longer resolves to this checkout.
#
# Afterwards: ROOT (the checkout), VENV, PY (the venv's python), .venv/bin first on PATH, and
# say() to print a step header. Honours PYTHON (the interpreter that creates the venv,
# default python3), PREFETCHD_VENV (default $ROOT/.venv) and PREFETCHD_EXTRAS (default
# dev,tf,crt,torch; scripts/bench.sh adds bench, in a venv of its own).
#
# With the torch extra, PyTorch is installed first as TORCH_PIN: the extra asks only for
# torch>=2.1, and pip's newest torch is the multi-GB CUDA build, while this pinned version
# installs the CPU wheel here (the version the tests run against; docs/pytorch.md).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${PREFETCHD_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
EXTRAS="${PREFETCHD_EXTRAS:-dev,tf,crt,torch}"
TORCH_PIN="torch==2.13.0"
# StatefulDataLoader, installed without its dependencies right after the pinned torch, so that
# resolving them can never bring another torch (it asks for torch>=2, requests, urllib3).
TORCHDATA_PIN="torchdata==0.11.0"
# The tf extra names no TensorFlow package (it must not replace a user's GPU build); with tf in
# EXTRAS the CPU build the tests use is installed explicitly, unless a TensorFlow is there.
TF_PACKAGE="${PREFETCHD_TF_PACKAGE:-tensorflow-cpu>=2.15}"

say() {
    printf '\n==> %s\n' "$*"
}

_venv_stamp() {
    {
        cat "$ROOT/pyproject.toml"
        printf 'extras=%s\nroot=%s\ntorch=%s %s\ntf=%s\n' "$EXTRAS" "$ROOT" "$TORCH_PIN" "$TORCHDATA_PIN" "$TF_PACKAGE"
        "$PY" -c 'import sys; print(sys.version)'
    } | sha256sum | cut -d' ' -f1
}

# True if `import prefetchd` in the venv finds this checkout (without importing it).
_venv_has_checkout() {
    "$PY" - "$ROOT/" <<'EOF'
import importlib.util
import sys

spec = importlib.util.find_spec("prefetchd")
sys.exit(0 if spec and spec.origin and spec.origin.startswith(sys.argv[1]) else 1)
EOF
}

if ! "$PY" -c 'pass' 2>/dev/null; then
    _venv_python="${PYTHON:-python3}"
    if ! "$_venv_python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        echo "error: prefetchd needs Python >= 3.11 as '$_venv_python' (set PYTHON=...)" >&2
        exit 1
    fi
    say "creating the virtualenv $VENV"
    if ! "$_venv_python" -m venv --clear "$VENV"; then
        echo "error: '$_venv_python -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
        exit 1
    fi
fi

_venv_want="$(_venv_stamp)"
_venv_have=""
if [ -f "$VENV/.installed" ]; then
    _venv_have="$(cat "$VENV/.installed")"
fi
if [ "$_venv_want" != "$_venv_have" ] || ! _venv_has_checkout; then
    say "installing prefetchd[$EXTRAS] into $VENV (first run: several minutes)"
    rm -f "$VENV/.installed"
    case ",$EXTRAS," in
    *,torch,*)
        PIP_DISABLE_PIP_VERSION_CHECK=1 "$PY" -m pip install --progress-bar off "$TORCH_PIN"
        PIP_DISABLE_PIP_VERSION_CHECK=1 "$PY" -m pip install --progress-bar off --no-deps "$TORCHDATA_PIN"
        ;;
    esac
    _venv_tf=()
    case ",$EXTRAS," in
    *,tf,*)
        if ! "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("tensorflow") is None)'; then
            _venv_tf=("$TF_PACKAGE")
        fi
        ;;
    esac
    PIP_DISABLE_PIP_VERSION_CHECK=1 "$PY" -m pip install --progress-bar off -e "${ROOT}[${EXTRAS}]" "${_venv_tf[@]}"
    printf '%s\n' "$_venv_want" >"$VENV/.installed"
else
    echo "using $VENV (prefetchd[$EXTRAS] already installed for this pyproject.toml)"
fi

# The editable install builds the C extensions once (the record kernel, _native, and the native
# GET client's engine, _http); a checkout whose .c changed since (a pull, a merge) would go on
# importing the old build, which lacks what the new Python calls. Rebuild them in place when a
# source is newer than its build (a few seconds).
_venv_stale=""
for _venv_ext in _native _http; do
    _venv_so=("$ROOT"/prefetchd/kernel/"$_venv_ext".cpython-*.so)
    if [ ! -e "${_venv_so[0]}" ] || [ "$ROOT/prefetchd/kernel/$_venv_ext.c" -nt "${_venv_so[0]}" ]; then
        _venv_stale="$_venv_stale $_venv_ext"
    fi
done
if [ -n "$_venv_stale" ]; then
    say "building the C extensions (changed:$_venv_stale)"
    (cd "$ROOT" && "$PY" setup.py -q build_ext --inplace) ||
        echo "warning: a C extension did not build; the writers use the record kernel's Python twin, download.client: native is unavailable"
fi

export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
unset _venv_python _venv_want _venv_have _venv_tf _venv_so _venv_ext _venv_stale
