# Sourced by bench/heap.sh and bench/scale.sh: heaptrack, installed when missing, and the
# process it runs.

# heaptrack_installed: heaptrack, heaptrack_print and c++filt (Debian packages heaptrack and
# binutils), installed with apt-get when one is missing; exits with a message otherwise.
heaptrack_installed() {
  if ! command -v heaptrack >/dev/null || ! command -v heaptrack_print >/dev/null || ! command -v c++filt >/dev/null; then
    echo ">> installing heaptrack and binutils (apt-get)"
    apt-get install -y heaptrack binutils >/dev/null || {
      echo "heaptrack or c++filt is missing and could not be installed: run 'apt-get install heaptrack binutils'" >&2
      exit 1
    }
  fi
}

# heaptrack_child WRAPPER BIN LOG: the PID of the program BIN that heaptrack (PID WRAPPER)
# runs, once it runs. heaptrack is a shell script: its own subshells carry the same command
# line for a moment, so the child is told by the program it runs. Exits, printing LOG, if
# heaptrack exits first.
heaptrack_child() {
  local wrapper=$1 exe c
  exe=$(readlink -f "$2")
  while true; do
    kill -0 "$wrapper" 2>/dev/null || { cat "$3" >&2; echo "error: heaptrack exited" >&2; exit 1; }
    for c in $(pgrep -P "$wrapper" || true); do
      [ "$(readlink "/proc/$c/exe" 2>/dev/null)" = "$exe" ] && { echo "$c"; return; }
    done
    sleep 0.1
  done
}
