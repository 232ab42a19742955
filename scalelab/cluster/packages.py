"""Package metadata as the offline bundle reads and writes it, with no side effects: apt's
dependency closure and stanzas, wheel names and requirement specifiers, the Packages and
Release files of a flat apt repository, which local wheels to take, the torch pin."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from scalelab.core.errors import ScalelabError


class BundleError(ScalelabError):
    """An offline bundle could not be built, or lacks what the roles need; carries stderr."""

    def __init__(self, message: str, stderr: str = "") -> None:
        super().__init__(message)
        self.stderr = stderr


def parse_depends_closure(text: str) -> list[str]:
    """Real package names in `apt-cache depends --recurse` output, in order, once each.

    Package names start a line; indented lines are relations; <name> is a virtual package,
    which has nothing to download (its providers are listed as packages of their own).

    >>> out = '''iperf3
    ...   Depends: libc6
    ...  |Depends: debconf
    ...   Depends: <debconf-2.0>
    ...     cdebconf
    ...     debconf
    ... libc6
    ...   Depends: libgcc-s1
    ... <debconf-2.0>
    ... debconf
    ... libc6
    ... '''
    >>> parse_depends_closure(out)
    ['iperf3', 'libc6', 'debconf']
    """
    names: list[str] = []
    seen: set[str] = set()
    for line in text.splitlines():
        if not line or line[0].isspace() or line.startswith("|"):
            continue
        name = line.strip()
        if name.startswith("<") or name in seen:
            continue
        seen.add(name)
        names.append(name)
    return names


def parse_stanzas(text: str) -> list[dict[str, str]]:
    """Deb822 paragraphs (apt-cache show, dpkg-deb -f, Packages) as dicts; continuation lines
    are kept, joined by newlines.

    >>> s = parse_stanzas('Package: a\\nVersion: 1:2.0-1\\nDescription: x\\n more\\n\\nPackage: b\\n')
    >>> s[0]["Version"], s[0]["Description"], s[1]["Package"]
    ('1:2.0-1', 'x\\n more', 'b')
    """
    out: list[dict[str, str]] = []
    cur: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if not line.strip():
            if cur:
                out.append(cur)
            cur, key = {}, ""
        elif line[0].isspace() and key:
            cur[key] += "\n" + line
        elif ":" in line:
            key, _, value = line.partition(":")
            cur[key] = value.strip()
    if cur:
        out.append(cur)
    return out


_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")


def canonical_name(name: str) -> str:
    """PEP 503 normalised project name.

    >>> canonical_name("PyYAML"), canonical_name("typing_extensions")
    ('pyyaml', 'typing-extensions')
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_filename(filename: str) -> tuple[str, str]:
    """(canonical name, version) of a wheel file name.

    >>> parse_wheel_filename("horovod-0.28.1-cp311-cp311-linux_x86_64.whl")
    ('horovod', '0.28.1')
    >>> parse_wheel_filename("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl")
    ('torch', '2.13.0+cpu')
    >>> parse_wheel_filename("typing_extensions-4.12.2-py3-none-any.whl")
    ('typing-extensions', '4.12.2')
    """
    m = _WHEEL.match(Path(filename).name)
    if not m:
        raise BundleError(f"{filename} is not a wheel file name (name-version-tags.whl)")
    return canonical_name(m["name"]), m["version"]


def parse_requirement(req: str) -> tuple[str, str]:
    """(canonical name, specifier) of a requirement; extras and markers are not for bundles.

    >>> parse_requirement("torch==2.13.0"), parse_requirement("Pillow >= 10"), parse_requirement("six")
    (('torch', '==2.13.0'), ('pillow', '>=10'), ('six', ''))
    """
    m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*?)\s*$", req)
    if not m or any(c in m[2] for c in "[;@"):
        raise BundleError(f"requirement {req!r}: give a name with an optional version "
                          "specifier, e.g. torch==2.13.0 or numpy")
    return canonical_name(m[1]), m[2].replace(" ", "")


def satisfies(version: str, specifier: str) -> bool:
    """Whether a wheel's version meets a requirement's specifier (PEP 440; a local tag such
    as +cpu meets a pin without one).

    >>> satisfies("2.13.0+cpu", "==2.13.0"), satisfies("2.12.1", "==2.13.0"), satisfies("1.0", "")
    (True, False, True)
    >>> satisfies("11.0.0", ">=10,<12")
    True
    """
    if not specifier:
        return True
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(specifier).contains(Version(version), prereleases=True)
    except (InvalidSpecifier, InvalidVersion):
        return False


def packages_stanza(control: str, filename: str, size: int, md5: str, sha256: str) -> str:
    """One paragraph of a flat repository's Packages index: the deb's control fields plus
    where it is and its hashes (what dpkg-scanpackages writes, without needing dpkg-dev).

    >>> print(packages_stanza("Package: a\\nVersion: 1\\nDescription: x\\n y\\n", "a_1_all.deb", 10,
    ...                       "m", "s"), end="")
    Package: a
    Version: 1
    Description: x
     y
    Filename: ./a_1_all.deb
    Size: 10
    MD5sum: m
    SHA256: s
    """
    body = "\n".join(ln for ln in control.rstrip("\n").splitlines() if ln.strip())
    return (f"{body}\nFilename: ./{filename}\nSize: {size}\nMD5sum: {md5}\n"
            f"SHA256: {sha256}\n")


def release_file(packages: bytes, date: str) -> str:
    """The Release file of a flat repository whose only index is Packages: apt then fetches
    exactly that index (no probing for compressed variants) and checks its hashes.

    >>> print(release_file(b"", "Mon, 23 Nov 2026 12:00:00 GMT"), end="")
    Origin: scalelab
    Label: scalelab offline bundle
    Date: Mon, 23 Nov 2026 12:00:00 GMT
    MD5Sum:
     d41d8cd98f00b204e9800998ecf8427e 0 Packages
    SHA256:
     e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 0 Packages
    """
    md5 = hashlib.md5(packages, usedforsecurity=False).hexdigest()
    sha = hashlib.sha256(packages).hexdigest()
    return (f"Origin: scalelab\nLabel: scalelab offline bundle\nDate: {date}\n"
            f"MD5Sum:\n {md5} {len(packages)} Packages\nSHA256:\n {sha} {len(packages)} Packages\n")


def pick_local_wheels(dirs: Iterable[Path], torch_pin: str | None = None) -> list[Path]:
    """The wheels under dirs (searched recursively), one per file name.

    scripts/build_horovod.sh caches one horovod wheel per torch version, under directories
    named horovod-<v>_torch-<torch>_<tag> whose wheels share a file name; where names clash,
    the one built for the pinned torch wins, and without a pin the clash is an error.
    """
    found: dict[str, list[Path]] = {}
    for d in dirs:
        d = Path(d)
        if not d.is_dir():
            raise BundleError(f"wheel directory {d} does not exist; build Horovod first "
                              "(scripts/build_horovod.sh) or name your wheels' directory "
                              "with --wheel-dir")
        for whl in sorted(d.rglob("*.whl")):
            found.setdefault(whl.name, []).append(whl)
    picked: list[Path] = []
    for name, paths in sorted(found.items()):
        if len(paths) > 1 and torch_pin:
            paths = [p for p in paths if _built_for_torch(p.parent.name, torch_pin)] or paths
        if len(paths) > 1:
            raise BundleError(f"wheel {name} is in {len(paths)} places ({', '.join(map(str, paths))});"
                              " pass only the directory of the one to bundle")
        picked.append(paths[0])
    return picked


def _built_for_torch(dirname: str, torch_pin: str) -> bool:
    """Whether a build_horovod.sh cache directory name is for this torch release.

    >>> _built_for_torch("horovod-0.28.1_torch-2.13.0+cpu_cp311", "2.13.0")
    True
    >>> _built_for_torch("horovod-0.28.1_torch-2.12.0_cp311", "2.13.0")
    False
    """
    m = re.search(r"_torch-([^_+]+)(\+[^_]*)?_", dirname)
    return bool(m) and m[1] == torch_pin


def torch_pin(requirements: Sequence[str], constraints: Path | None) -> str | None:
    """The torch release an == pin names, in the requirements or the constraints file."""
    lines = list(requirements)
    if constraints is not None and constraints.exists():
        lines += [ln.split("#", 1)[0] for ln in constraints.read_text().splitlines()]
    for line in lines:
        m = re.match(r"^\s*torch\s*==\s*([0-9][^\s,;+]*)", line)
        if m:
            return m[1]
    return None
