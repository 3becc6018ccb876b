"""The repository explains itself: its documents and code point only at files it holds, carry no
run labels, branch names, dated load readings or commit hashes in prose, every requirement id the
source names is defined in docs/requirements.md, the README stays a guide of bounded size, and
every folder of a packaged package is itself a package (so an install warns about nothing).

Pure and fast: reads files, and asks git once for the commit ids (skipped outside a clone)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_LIMIT = 12_000
SKIP_DIRS = {".git", ".venv", "node_modules", "__pycache__", "artifacts", "data", "build"}
CONSOLE_EXT = {".js", ".html", ".css"}


def _files(*, suffixes: set[str]) -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts):
            continue
        if path.is_file() and path.suffix in suffixes:
            found.append(path)
    return sorted(found)


def _documents() -> list[Path]:
    """What a reader of the repository reads as prose."""
    docs = [ROOT / "README.md", ROOT / "CHANGELOG.md"]
    docs += sorted((ROOT / "docs").rglob("*.md"))
    docs += sorted((ROOT / "examples").glob("*.toml"))
    return docs


def _source() -> list[Path]:
    """Code and console files, less this test (whose patterns would match themselves)."""
    return [p for p in _files(suffixes={".py"} | CONSOLE_EXT) if p != Path(__file__).resolve()]


def _hits(paths: list[Path], pattern: re.Pattern[str]) -> list[str]:
    out = []
    for path in paths:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = pattern.search(line)
            if m:
                out.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r} in {line.strip()[:120]}")
    return out


# Files that exist only beside this repository, never in it.
OUTSIDE = re.compile(
    r"\.\./shared|\bSPEC\.md\b|\bDESIGN\.md\b|\bSTACK-NOTES\b|\bseeds/"
    r"|\bDESIGN §|\bDESIGN \"|\bSPEC (§|[A-Z]{2,3}-\d)|\bseed[- ]0\d\d\b"
)
# Run labels, branch names and dated machine-load readings: a diary, not a description.
LABELS = re.compile(
    r"\bstop \d+\b"  # run labels ("after stop 21 merged")
    r"|(?<![\w-])(?:k-[a-z]{4,}\d*|[sh]\d+-[a-z][a-z0-9]*)\b"  # branch names (k-chain4, s11-robust)
    r"|\bload (?:average )?\d+(?:\.\d+)?\b"  # load readings ("load 13-16")
    r"|\b\d\d:\d\d(?:-\d\d:\d\d)? UTC\b"  # clock times of a run
    r"|\bthis session\b"
    r"|\bshared (?:by|with) (?:\w+ )?(?:other )?sessions\b"
)
HEX = re.compile(r"(?<![\w/.#-])[0-9a-f]{7,40}(?![\w-])")
ID_PREFIXES = "MEM|ACL|LRN|ENR|MB|API|SEC|WS|SC|FS|ND|WA|EV|CO|UI"
REQUIREMENT = re.compile(rf"\b(?:{ID_PREFIXES})-\d+\b")
DEFINED = re.compile(rf"^- \*\*((?:{ID_PREFIXES})-\d+)\*\*", re.M)


def test_documents_point_only_at_files_in_the_repo():
    assert not _hits(_documents(), OUTSIDE)


def test_source_points_only_at_files_in_the_repo():
    assert not _hits(_source(), OUTSIDE)


def test_no_run_labels_branch_names_or_load_diaries():
    assert not _hits(_documents() + _source(), LABELS)


@pytest.mark.subprocess  # git lists the commits
def test_no_commit_hashes_in_prose():
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git clone")
    out = subprocess.run(
        [git, "rev-list", "--all"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        pytest.skip("git cannot list commits here")
    prefixes = {line[:7] for line in out.stdout.split()}
    found = []
    for path in _documents() + _source():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for m in HEX.finditer(line):
                token = m.group(0)
                mixed = re.search(r"[a-f]", token) and re.search(r"\d", token)
                if mixed and token[:7] in prefixes:
                    found.append(f"{path.relative_to(ROOT)}:{n}: {token}")
    assert not found


def test_readme_is_a_guide_of_bounded_size():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text) <= README_LIMIT, len(text)
    # The two commands a newcomer types, exactly as `run` takes them.
    assert "./run serve" in text and "./run test" in text


def test_every_requirement_id_in_the_source_is_defined():
    defined = set(DEFINED.findall((ROOT / "docs" / "requirements.md").read_text(encoding="utf-8")))
    used: dict[str, str] = {}
    paths = _files(suffixes={".py", ".md", ".toml"} | CONSOLE_EXT)
    for path in paths:
        for rid in REQUIREMENT.findall(path.read_text(encoding="utf-8")):
            used.setdefault(rid, str(path.relative_to(ROOT)))
    assert used, "no requirement ids found: is the pattern still right?"
    missing = {rid: where for rid, where in used.items() if rid not in defined}
    assert not missing


def test_every_folder_of_a_packaged_package_is_a_package():
    """setuptools warns about a shipped folder inside a listed package that is not listed itself
    (its files would go in as data): a folder holding modules, or named by package-data."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]
    listed = set(tool["setuptools"]["packages"])
    data = tool["setuptools"].get("package-data", {})
    unlisted = []
    for package in sorted(listed):
        folder = ROOT / package.replace(".", "/")
        for sub in folder.iterdir():
            if not sub.is_dir() or sub.name in SKIP_DIRS:
                continue
            modules = any(sub.glob("*.py"))
            named = any(g.startswith(f"{sub.name}/") for g in data.get(package, ()))
            if (modules or named) and f"{package}.{sub.name}" not in listed:
                unlisted.append(f"{package}.{sub.name}")
    assert not unlisted
