#!/usr/bin/env bash
# Prometheus, promtool and Alertmanager from the distribution's packages, for the tests.
set -euo pipefail
missing=()
command -v prometheus >/dev/null || missing+=(prometheus)
command -v promtool >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
command -v amtool >/dev/null || missing+=(prometheus-alertmanager)
[ ${#missing[@]} -eq 0 ] && exit 0
pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if ! command -v apt-get >/dev/null; then
  echo "the tests need: $pkgs (promtool, prometheus, prometheus-alertmanager, amtool);" \
       "install them with your package manager and run again" >&2
  exit 2
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "installing $pkgs needs root: run as root or install sudo" >&2; exit 2; }
  SUDO=sudo
fi
echo "==> installing $pkgs from the distribution's packages"
$SUDO apt-get update -qq
# The packages' own services are not started here: the tests start their own on loopback.
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
