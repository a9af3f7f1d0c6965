# Sourced by tests/run.sh and bench/run.sh: `python312` prints a working CPython 3.12
# (on PATH, or installed by pyenv), or fails.
python312() {
  local candidate
  for candidate in "$(command -v python3.12 || true)" \
    "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12.*/bin/python3.12; do
    if [ -x "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      echo "$candidate"
      return
    fi
  done
  return 1
}
