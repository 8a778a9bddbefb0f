#!/usr/bin/env bash
# Set up rtvirt on a fresh Debian/Ubuntu machine: system packages (as root), a virtual environment,
# the Python dependencies and the compiled agents. Safe to run again; it only does what is missing.
#
#   scripts/setup.sh            what the main job (`make run`: host, partition, QEMU guest) needs
#   scripts/setup.sh all        everything (`make test`): every environment kind, reference tools, report tests
#   scripts/setup.sh KIND...    the main job's set plus a kind's: libvirt, xen, kvm, arm, tools, report, store, live
#                               (rtvirt runs `scripts/setup.sh KIND` itself on a kind's first use)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
# Debian packages of each part (one package a line, each with what needs it).
MAIN=(
  build-essential cmake ninja-build python3-venv  # the agents, the simulator core, the venv
  qemu-system-x86 busybox-static cpio             # the qemu environment and its guest image
)
LIBVIRT=(
  libvirt-daemon-system libvirt-clients          # the libvirt environment (libvirtd, virtlogd)
  libvirt-dev pkg-config                         # building libvirt-python
)
XEN=(
  xen-hypervisor-4.17-amd64 xen-utils-4.17        # the xen environment: hypervisor config, xl toolstack
  flex bison dpkg-dev python3                     # the Xen lab's hypervisor build (apt-get source xen)
  libxen-dev                                      # rtvirt-a653: sets ARINC 653 schedules (xl has no command)
  qemu-system-xen seabios                         # HVM domUs in the Xen lab: device model, BIOS
  openssh-server openssh-client                   # the Xen lab's dom0 sshd and its keys
)
KVM=(
  mmdebstrap e2fsprogs                            # the KVM lab's Debian root (QEMU, libvirtd, sshd) and its ext4 image
  openssh-client                                  # the KVM lab's keys
  libvirt-dev pkg-config                          # libvirt-python, which drives the lab's libvirtd
)
STORE=(
  postgresql                                      # shared results stores (the tests run their own server)
)
LIVE=(
  prometheus                                      # the live view's /metrics scraped by a real Prometheus in tests
)
ARM=(
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross     # static aarch64 agents and kernel; the arm64 Xen lab's hypervisor
  qemu-user-static                                # runs the aarch64 agents in tests; the ARM labs' arm64 roots' scripts
  qemu-system-arm                                 # the aarch64 bare-metal guest (qemu arch = "aarch64"); the ARM labs
  mmdebstrap e2fsprogs                            # the ARM labs' Debian arm64 roots (KVM host, Xen dom0)
  flex bison dpkg-dev                             # the arm64 Xen lab's hypervisor build (apt-get source xen)
)
TOOLS=(
  rt-tests stress-ng jitterdebugger               # reference tools (benchmarks, importers) and the stress-ng engine
  trace-cmd rtla                                  # trace files users already have, imported into explanations
  openssh-server openssh-client                   # ssh targets (tests start their own sshd)
)
REPORT=(
  chromium                                        # report tests (headless)
)
TESTS=(
  tuned                                           # tests/test_host_tuned.py: a real tuned daemon in a throwaway guest
)
# Installed with no service started and none enabled for the next boot: tuned's daemon would retune this whole
# machine (the test runs it only inside its guest, which sees this file system read-only over 9p); Prometheus (and
# the node exporter it recommends) would scrape this machine for good: the tests start their own, on 127.0.0.1.
NEVER_START=(tuned prometheus prometheus-node-exporter)

parts=("$@")
((${#parts[@]})) || parts=(main)
DEB_PACKAGES=("${MAIN[@]}")
PIP_EXTRAS=()
for part in "${parts[@]}"; do
  case $part in
    main) ;;
    all) DEB_PACKAGES+=("${LIBVIRT[@]}" "${XEN[@]}" "${KVM[@]}" "${ARM[@]}" "${TOOLS[@]}" "${REPORT[@]}" "${STORE[@]}"
                        "${LIVE[@]}" "${TESTS[@]}")
         PIP_EXTRAS+=(test libvirt) ;;
    libvirt) DEB_PACKAGES+=("${LIBVIRT[@]}"); PIP_EXTRAS+=(libvirt) ;;
    xen) DEB_PACKAGES+=("${XEN[@]}") ;;
    kvm) DEB_PACKAGES+=("${KVM[@]}"); PIP_EXTRAS+=(libvirt) ;;
    arm) DEB_PACKAGES+=("${ARM[@]}") ;;
    tools) DEB_PACKAGES+=("${TOOLS[@]}") ;;
    report) DEB_PACKAGES+=("${REPORT[@]}") ;;
    store) DEB_PACKAGES+=("${STORE[@]}") ;;
    live) DEB_PACKAGES+=("${LIVE[@]}") ;;
    *) echo "setup: unknown part '$part' (main, all, libvirt, xen, kvm, arm, tools, report, store, live)" >&2; exit 2 ;;
  esac
done

# The Xen labs (x86_64, arm64) build a hypervisor with the real-time schedulers from Debian's source package
# (`apt-get source xen`), which needs a deb-src entry for the release's main archive.
DEB_SRC=/etc/apt/sources.list.d/rtvirt-deb-src.sources
if [[ " ${DEB_PACKAGES[*]} " == *" dpkg-dev "* && $(id -u) -eq 0 && ! -e $DEB_SRC ]] \
    && grep -qs '^VERSION_CODENAME=bookworm' /etc/os-release; then
  printf 'Types: deb-src\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\nSigned-By: %s\n' \
    /usr/share/keyrings/debian-archive-keyring.gpg >"$DEB_SRC"
  apt-get update -qq
fi

# The arm part fetches Debian's arm64 packages (kernel, busybox, Xen: tests/armkvm, the ARM labs) with
# `apt-get download PKG:arm64`, which needs arm64 among dpkg's architectures; nothing arm64 gets installed.
if [[ " ${parts[*]} " =~ \ (arm|all)\  && $(id -u) -eq 0 ]] && command -v dpkg >/dev/null \
    && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  apt-get update -qq
fi

missing=()
for pkg in "${DEB_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian packages: ${missing[*]}"
    apt-get update -qq
    started=() unstarted=()
    for pkg in "${missing[@]}"; do
      if [[ " ${NEVER_START[*]} " == *" $pkg "* ]]; then unstarted+=("$pkg"); else started+=("$pkg"); fi
    done
    ((${#started[@]} == 0)) || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${started[@]}" >/dev/null
    if ((${#unstarted[@]})); then
      # invoke-rc.d and deb-systemd-invoke start nothing while policy-rc.d exits 101 ("action forbidden"); a
      # policy-rc.d already there (a container's) is left as it is
      if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        trap 'rm -f /usr/sbin/policy-rc.d' EXIT
      fi
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${unstarted[@]}" >/dev/null
      for pkg in "${NEVER_START[@]}"; do  # nor at the next boot (a package enables its unit), recommended ones too
        if command -v systemctl >/dev/null; then systemctl disable "$pkg.service" >/dev/null 2>&1 || true; fi
        if pgrep -x "${pkg:0:15}" >/dev/null; then  # (a process's name is its command's first 15 characters)
          echo "setup: $pkg runs after its installation: stop it (rtvirt needs its files, never its service)" >&2
          exit 1
        fi
      done
    fi
    # xen-hypervisor makes GRUB boot Xen by default; rtvirt only needs its files, never a reboot into Xen
    if [[ -e /etc/default/grub.d/xen.cfg && ! -e /etc/default/grub.d/00-rtvirt-xen.cfg ]]; then
      echo 'XEN_OVERRIDE_GRUB_DEFAULT=0  # rtvirt: keep the normal kernel the default' \
        >/etc/default/grub.d/00-rtvirt-xen.cfg
      if command -v update-grub >/dev/null && [[ -d /boot/grub ]]; then update-grub 2>/dev/null || true; fi
    fi
  else
    echo "setup: please install these packages first (as root): apt-get install ${missing[*]}" >&2
    command -v cc >/dev/null && command -v cmake >/dev/null || exit 2
  fi
fi

# The ARM labs' arm64 roots run their packages' maintainer scripts under qemu-user-static: binfmt_misc mounted and
# its aarch64 rule registered (systemd-binfmt does it at boot where systemd is init; the labs' image builder does
# it too, since a registration lasts until the next boot only)
if [[ " ${parts[*]} " =~ \ (arm|all)\  && $(id -u) -eq 0 && -e /usr/lib/binfmt.d/qemu-aarch64.conf \
      && ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
  [[ -e /proc/sys/fs/binfmt_misc/register ]] || mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || true
  cat /usr/lib/binfmt.d/qemu-aarch64.conf >/proc/sys/fs/binfmt_misc/register || true
fi

PYTHON=${PYTHON:-python3}
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "setup: rtvirt needs Python >= 3.11 ($PYTHON is $("$PYTHON" --version 2>&1))" >&2; exit 2; }
[[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# Build requirements first so the editable install can reuse one build directory (fast rebuilds).
# setuptools + wheel: libvirt-python builds from source (against libvirt-dev) in this same environment.
"$VENV/bin/python" -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.12" setuptools wheel
extras=$(IFS=,; echo "${PIP_EXTRAS[*]}")
"$VENV/bin/python" -m pip install -q --no-build-isolation -e ".${extras:+[$extras]}"

# Debian 12's libvirt client (9.0) can crash a threaded program with SIGSEGV: CVE-2024-4418, a temporary event
# source left pointing at a returned thread's stack (fixed in libvirt 10.3). rtvirt's libvirt environment and KVM
# lab loaded it with an event loop thread and died of it now and then, so on bookworm the venv gets the client
# library of bookworm-backports (libvirt0 only, unpacked into the venv; nothing installed or upgraded on the
# system, whose libvirtd stays Debian 12's). rtvirt loads it in place of the system's (docs/environments-libvirt.md).
LIBVIRT_CLIENT_DIR="$VENV/lib/rtvirt-libvirt"
if [[ " ${PIP_EXTRAS[*]} " == *" libvirt "* && ! -e $LIBVIRT_CLIENT_DIR/libvirt.so.0 ]] \
    && grep -qs '^VERSION_CODENAME=bookworm' /etc/os-release && command -v apt-get >/dev/null; then
  fetch=$(mktemp -d)
  mkdir -p "$fetch/lists/partial" "$fetch/cache/archives/partial"
  echo "deb http://deb.debian.org/debian bookworm-backports main" >"$fetch/sources.list"
  apt_private=(-o Dir::Etc::sourcelist="$fetch/sources.list" -o Dir::Etc::sourceparts=- -o Dir::State::Lists="$fetch/lists"
               -o Dir::Cache="$fetch/cache" -o APT::Sandbox::User=root)
  apt-get "${apt_private[@]}" update -qq
  (cd "$fetch" && apt-get "${apt_private[@]}" download -qq libvirt0/bookworm-backports)
  dpkg-deb -x "$fetch"/libvirt0_*.deb "$fetch/root"
  mkdir -p "$LIBVIRT_CLIENT_DIR"
  cp -a "$fetch"/root/usr/lib/*/libvirt.so.0* "$fetch"/root/usr/lib/*/libvirt-qemu.so.0* "$LIBVIRT_CLIENT_DIR/"
  rm -rf "$fetch"
fi
echo "setup: ready ($("$VENV/bin/rtvirt" --version))"
