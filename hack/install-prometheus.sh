#!/usr/bin/env bash
# Installs Debian's `prometheus` package for `promtool` (rule checks and rule unit tests) and
# the e2e tests, which run their own Prometheus on loopback. Never leaves the packaged
# prometheus service running: service starts are refused during the install (policy-rc.d
# exit 101), and a service that started anyway (systemd) is stopped and disabled.
#
# Skips everything when promtool is already on PATH. Needs root (or sudo) and apt-get.
set -euo pipefail

if command -v promtool >/dev/null 2>&1; then
  echo "promtool found: $(command -v promtool)"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    exec sudo -E bash "$0" "$@"
  fi
  echo "install-prometheus.sh: needs root to install the prometheus package" >&2
  exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-prometheus.sh: no apt-get; install Prometheus (promtool) yourself" >&2
  exit 1
fi

# Refuse service starts while the package installs; put back whatever policy-rc.d was there.
policy=/usr/sbin/policy-rc.d
backup=""
if [[ -e $policy ]]; then
  backup=$(mktemp /usr/sbin/policy-rc.d.gpu-defrag.XXXXXX)
  cp -p "$policy" "$backup"
fi
restore() {
  if [[ -n $backup ]]; then
    mv -f "$backup" "$policy"
  else
    rm -f "$policy"
  fi
}
trap restore EXIT
printf '#!/bin/sh\n# gpu-defrag hack/install-prometheus.sh: no service starts during the install.\nexit 101\n' >"$policy"
chmod 0755 "$policy"

export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y --no-install-recommends prometheus; then
  apt-get update
  apt-get install -y --no-install-recommends prometheus
fi

# Under systemd a unit may still have been enabled or started: stop only that one.
if command -v systemctl >/dev/null 2>&1 && [[ -d /run/systemd/system ]]; then
  systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi

command -v promtool >/dev/null 2>&1 || {
  echo "install-prometheus.sh: prometheus installed but promtool is not on PATH" >&2
  exit 1
}
echo "installed $(promtool --version 2>&1 | head -n 1)"
