#!/usr/bin/env bash
# Builds the real-engine root the tests in tests/engines/ run: Debian unstable (minbase) with
# slurmctld, slurmd, slurmrestd and the Slurm client 26.05 (the first Debian Slurm with the
# metrics/openmetrics and job_submit/lua plugins; stable's 24.11 has neither metrics plugin) and
# Prometheus 3.
# Usage (as root): tools/engine-root.sh [ROOT]   (default: .engines/sid beside this repository)
# The root is a test fixture: never deployed, never committed (.gitignore).
set -euo pipefail

# The versions the tests were written against. Debian unstable serves only its newest build: when
# it moves, this script stops here with the version it found, and the pins are updated on purpose.
SLURM_VERSION=26.05.5-1
PROMETHEUS_VERSION=3.5.3+ds1-6
MIRROR=http://deb.debian.org/debian

here=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-$here/.engines/sid}
stamp=$root/.testbed-engine-root

want="slurmctld=$SLURM_VERSION slurmd=$SLURM_VERSION slurmrestd=$SLURM_VERSION slurm-client=$SLURM_VERSION prometheus=$PROMETHEUS_VERSION"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "engine root ready: $root ($want)"
  exit 0
fi
# A root built before slurmrestd joined the list gets it added at the pinned version, not rebuilt.
before_slurmrestd="slurmctld=$SLURM_VERSION slurmd=$SLURM_VERSION slurm-client=$SLURM_VERSION prometheus=$PROMETHEUS_VERSION"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$before_slurmrestd" ] && [ "$(id -u)" = 0 ]; then
  DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y --no-install-recommends "slurmrestd=$SLURM_VERSION" >>"$root.log" 2>&1 ||
    { tail -n 20 "$root.log" >&2; echo "engine root: adding slurmrestd failed: remove $stamp and re-run $0 to rebuild" >&2; exit 1; }
  echo "$want" >"$stamp"
  echo "engine root ready: $root ($want)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "engine root: run as root (debootstrap, chroot): sudo $0 $root" >&2
  exit 2
fi
command -v debootstrap >/dev/null || { echo "engine root: debootstrap is missing: apt-get install debootstrap" >&2; exit 2; }

rm -rf "$root"
mkdir -p "$(dirname "$root")"
debootstrap --variant=minbase --include=slurmctld,slurmd,slurmrestd,slurm-client,prometheus sid "$root" "$MIRROR" >"$root.log" 2>&1 ||
  { tail -n 20 "$root.log" >&2; echo "engine root: debootstrap failed (log: $root.log)" >&2; exit 1; }

for pin in $want; do
  pkg=${pin%%=*} version=${pin#*=}
  # shellcheck disable=SC2016 # dpkg-query's own format, not a shell expansion
  got=$(chroot "$root" dpkg-query -W -f '${Version}' "$pkg")
  if [ "$got" != "$version" ]; then
    echo "engine root: Debian unstable now has $pkg $got, the tests pin $version: update SLURM_VERSION/PROMETHEUS_VERSION in $0 and re-run the engine tests" >&2
    exit 1
  fi
done

# What the harness binds over or needs in place: mount points and a fake GPU for GRES
# (gres.conf File=/dev/nvidia0; the char device's major is NVIDIA's, 195).
mkdir -p "$root/var/spool/slurmctld" "$root/var/spool/slurmd" "$root/var/log/slurm" "$root/srv/prometheus" "$root/mnt/share"
touch "$root/etc/hosts"
[ -e "$root/dev/nvidia0" ] || mknod "$root/dev/nvidia0" c 195 0
echo "$want" >"$stamp"
echo "engine root ready: $root ($want)"
