"""Snapshots in the local Hugging Face cache, found offline: ``hf:REPO@REVISION`` -> (commit, folder).

The cache layout (huggingface_hub's "Manage huggingface_hub cache-system" guide)::

    <cache>/models--ORG--NAME/refs/<branch or tag>     a text file holding the commit hash
    <cache>/models--ORG--NAME/snapshots/<commit>/...   the files of that commit (symlinks into blobs/)

``<cache>`` is ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub``,
else ``~/.cache/huggingface/hub`` (huggingface_hub's own ``constants.py`` rules, read from the
environment at each call rather than at import). Where huggingface_hub is installed its
``scan_cache_dir`` reads the folder; otherwise the layout above is read directly. Nothing is
downloaded: a revision not in the cache is a :class:`~oracles.errors.PinError` naming the folder.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from oracles.errors import PinError

COMMIT = re.compile(r"[0-9a-f]{40}")


def cache_dir() -> Path:
    """The Hugging Face hub cache folder this environment names (module docstring)."""
    env = os.environ
    given = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if given:
        return Path(os.path.expandvars(given)).expanduser()
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def repo_folder(repo: str, cache: Path | None = None) -> Path:
    """``<cache>/models--ORG--NAME`` of the model repository ``repo`` (``ORG/NAME``)."""
    return (cache or cache_dir()) / ("models--" + repo.replace("/", "--"))


def snapshot_folder(repo: str, revision: str, cache: Path | None = None) -> Path:
    """The folder of ``revision`` (a commit, or a ref read from ``refs/``) of ``repo`` in the cache, by the
    layout alone (no scan, no import): where a pinned commit's files are. The folder need not exist."""
    where = repo_folder(repo, cache)
    if not COMMIT.fullmatch(revision) and (where / "refs" / revision).is_file():
        revision = (where / "refs" / revision).read_text().strip()
    return where / "snapshots" / revision


def parse(source: str) -> tuple[str, str]:
    """``"hf:ORG/NAME@REVISION"`` (or without ``@REVISION``: ``main``) -> (repo, revision).

    Raises:
        PinError: not of that form.
    """
    body = source.removeprefix("hf:")
    repo, _, revision = body.partition("@")
    if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", repo) or "@" in revision:
        raise PinError(f"--from {source!r}: expected hf:ORG/NAME@REVISION (a branch, tag or commit in the local "
                       "Hugging Face cache)")
    return repo, revision or "main"


def resolve(repo: str, revision: str, cache: Path | None = None) -> tuple[str, Path]:
    """The commit ``revision`` names for model ``repo`` in the cache, and its snapshot folder.

    ``revision`` is a ref (``main``, a tag, ``refs/pr/1``) or a full 40-hex commit.

    Raises:
        PinError: the cache, the repository or the revision is not there; one line naming the folder
            looked in and the refs and commits it holds.
    """
    cache = cache or cache_dir()
    where = repo_folder(repo, cache)
    if importlib.util.find_spec("huggingface_hub") is not None:
        refs, commits = _scan_with_hub(repo, cache, where)
    else:
        refs, commits = _scan_layout(where)
    commit = refs.get(revision) or (revision if revision in commits else None)
    if commit is None or commit not in commits:
        held = (f"refs {', '.join(sorted(refs)) or 'none'}; snapshots "
                f"{', '.join(c[:12] for c in sorted(commits)) or 'none'}") if where.is_dir() else "no such folder"
        raise PinError(f"hf:{repo}@{revision}: revision {revision!r} is not in the local Hugging Face cache: looked in "
                       f"{where} ({held}); nothing is downloaded: fetch it on a machine with network "
                       f"(`hf download {repo} --revision {revision}`) or set HF_HUB_CACHE / HF_HOME")
    return commit, commits[commit]


def _scan_layout(where: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """(ref -> commit, commit -> snapshot folder) read from the cache layout itself."""
    refs: dict[str, str] = {}
    if (where / "refs").is_dir():
        for path in (where / "refs").rglob("*"):
            if path.is_file():
                refs[path.relative_to(where / "refs").as_posix()] = path.read_text().strip()
    snaps = where / "snapshots"
    commits = {p.name: p for p in snaps.iterdir() if p.is_dir()} if snaps.is_dir() else {}
    return refs, commits


def _scan_with_hub(repo: str, cache: Path, where: Path) -> tuple[dict[str, str], dict[str, Path]]:
    """The same, through huggingface_hub's ``scan_cache_dir`` (a repository it finds corrupted is refused
    with its message)."""
    from oracles.engines.types import hub_offline

    hub_offline()  # huggingface_hub reads the offline switch once, at import
    from huggingface_hub import CacheNotFound, scan_cache_dir

    if not cache.is_dir():
        return {}, {}
    try:
        info = scan_cache_dir(cache)
    except (CacheNotFound, ValueError):
        return {}, {}
    for warning in info.warnings:
        if str(where) in str(warning):
            raise PinError(f"hf:{repo}: the Hugging Face cache entry {where} is damaged: {warning}")
    for entry in info.repos:
        if entry.repo_type == "model" and entry.repo_id == repo:
            commits = {r.commit_hash: Path(r.snapshot_path) for r in entry.revisions}
            refs = {ref: r.commit_hash for r in entry.revisions for ref in r.refs}
            return refs, commits
    return {}, {}
