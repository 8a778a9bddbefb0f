"""A lab root's name holds the versions apt here would install (a new Debian point release builds a new root):
read for all its packages at once, each as apt reads it alone."""

from __future__ import annotations

import re
import subprocess

import pytest

from rtvirt.environments.debian_root import _candidate_versions
from rtvirt.environments.kvmlab.image import ROOT_PACKAGES
from rtvirt.errors import RunError


def test_every_packages_candidate_is_what_apt_says_of_it_alone() -> None:
    packages = ("qemu-system-x86", *ROOT_PACKAGES)
    found = _candidate_versions(packages, "x86_64").splitlines()
    alone = []
    for package in packages:
        policy = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True, check=True).stdout
        candidate = re.search(r"Candidate: (\S+)", policy)
        assert candidate is not None, policy
        alone.append(f"{package}={candidate.group(1)}")
    assert found == alone and len(found) == len(packages) >= 8


def test_a_package_apt_does_not_know_is_named() -> None:
    with pytest.raises(RunError, match="apt knows no rtvirt-no-such-package"):
        _candidate_versions(("busybox-static", "rtvirt-no-such-package", "openssh-server"), "x86_64")
