#!/usr/bin/env bash
# Checks and installs what the project's scripts need on a fresh Debian machine.
# Go and Rust toolchains cannot come from apt at the versions needed, so their absence is
# an error that says how to install them; everything else is installed here.
set -euo pipefail

missing=()
for tool in flock curl git python3 prometheus promtool \
  containerd runc buildah gcc openssl iptables strip chromium chromedriver; do command -v "$tool" >/dev/null || missing+=("$tool"); done
# The real node (hack/real-node.sh): containerd and runc run its pods, CNI plugins wire them,
# buildah builds the images, gcc the pause binary, openssl the node's certificate.
# chromium and chromedriver: the dashboard's test in a real browser (tests/dashboard.rs).
[ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
if [ ${#missing[@]} -gt 0 ]; then
  pkgs=()
  for t in "${missing[@]}"; do
    case $t in
      flock) pkgs+=(util-linux) ;;
      # Debian's prometheus package: the server for metric gates and dashboard checks, and promtool.
      prometheus | promtool) [[ " ${pkgs[*]} " == *" prometheus "* ]] || pkgs+=(prometheus) ;;
      gcc) pkgs+=(gcc libc6-dev) ;;
      strip) pkgs+=(binutils) ;;
      # The dashboard's end-to-end test drives headless Chromium through chromedriver.
      chromedriver) pkgs+=(chromium-driver) ;;
      *) pkgs+=("$t") ;;
    esac
  done
  echo ">> installing Debian packages: ${pkgs[*]}"
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi

export PATH=$HOME/.cargo/bin:/usr/local/go/bin:$PATH
if ! command -v go >/dev/null; then
  echo "error: Go >= 1.26 is required to build the local control plane; install it from https://go.dev/doc/install" >&2
  exit 1
fi
gov=$(go env GOVERSION | sed 's/^go//')
if [ "$(printf '%s\n1.26\n' "$gov" | sort -V | head -1)" != "1.26" ]; then
  echo "error: Go $gov is too old; Go >= 1.26 is required (https://go.dev/doc/install)" >&2
  exit 1
fi
if ! command -v cargo >/dev/null; then
  echo "error: Rust (cargo) >= 1.89 is required; install it with rustup (https://rustup.rs)" >&2
  exit 1
fi
for comp in rustfmt clippy; do
  if ! cargo "${comp/rustfmt/fmt}" --version >/dev/null 2>&1; then
    rustup component add "$comp" >/dev/null 2>&1 || { echo "error: cargo $comp is missing; run 'rustup component add $comp'" >&2; exit 1; }
  fi
done
