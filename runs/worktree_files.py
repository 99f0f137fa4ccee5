"""A worktree's files, written and read by loopsweb itself, never through git's filters
(runs/git.py, "no filter"; docs/isolation.md).

- `checkout_files`: a new worktree's files from a commit's tree: each blob written as its
  bytes (mode 0644 or 0755), each symlink as a symlink, each submodule as an empty
  directory. No filter, no end-of-line conversion: the worktree holds what was committed.
- `snapshot_tree`: the tree of what a worktree holds now (the files git would take with
  `git add --all`: tracked ones as they are on disk, untracked ones that no ignore rule
  names; nested repositories are left out), its new blobs written with `hash-object
  --no-filters`, the tree with `update-index --index-info` and `write-tree` on an index of
  loopsweb's own.
- `changed_paths`: what `snapshot_tree` would take that a commit does not hold (the paths
  changed, deleted or new), read without writing anything to the repository.

All open every path component with `O_NOFOLLOW` from the worktree's root descriptor, so a
symlink the agent left (a directory swapped for a link to `/`, say) is taken as a symlink
and never followed out of the worktree. A tree entry named `..`, `.` or `.git` is refused.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from runs.git import GitError, object_format, run_git

BAD_PATH = "refusing tree entry {path!r}: not a plain relative path"
OID_MISMATCH = "git stored {path!r} as {got}, loopsweb computed {want}"
BATCH_BYTES = 64 * 1024 * 1024

MODE_FILE, MODE_EXEC, MODE_LINK, MODE_GITLINK = "100644", "100755", "120000", "160000"


@dataclass(frozen=True)
class TreeEntry:
    mode: str
    kind: str  # blob, commit (a submodule)
    oid: str
    size: int  # -1 for a submodule


def tree_entries(common_dir: str, rev: str) -> dict[bytes, TreeEntry]:
    """Every entry of `rev`'s tree, recursively, by path (bytes, as git stores them)."""
    out = run_git(
        "ls-tree",
        "-r",
        "-z",
        "-l",
        "--full-tree",
        rev,
        git_dir=common_dir,
        cwd=common_dir,
    ).stdout
    entries: dict[bytes, TreeEntry] = {}
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, kind, oid, size = meta.decode().split()
        entries[path] = TreeEntry(mode, kind, oid, -1 if size == "-" else int(size))
    return entries


def _parts(path: bytes) -> list[bytes]:
    parts = path.split(b"/")
    for part in parts:
        if part in (b"", b".", b"..") or part.lower() == b".git" or b"\0" in part:
            raise GitError(BAD_PATH.format(path=path.decode("utf-8", "replace")))
    return parts


@contextmanager
def _root(path: str) -> Iterator[int]:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        yield fd
    finally:
        os.close(fd)


def _open_dir(root: int, parts: list[bytes], *, create: bool) -> int | None:
    """A descriptor of the directory `parts` below `root`, no component followed when it is
    a symlink (None then, or when missing and not `create`). The caller closes it."""
    fd = os.dup(root)
    for part in parts:
        if create:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
        try:
            child = os.open(
                part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd
            )
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = child
    return fd


def _blobs(common_dir: str, oids: list[str]) -> Iterator[tuple[str, bytes]]:
    """(oid, content) of each blob, read with `cat-file --batch`."""
    if not oids:
        return
    out = run_git(
        "cat-file",
        "--batch",
        git_dir=common_dir,
        cwd=common_dir,
        stdin="".join(f"{oid}\n" for oid in oids).encode(),
    ).stdout
    at = 0
    for _ in oids:
        newline = out.index(b"\n", at)
        oid, _kind, size = out[at:newline].decode().split()
        start = newline + 1
        yield oid, out[start : start + int(size)]
        at = start + int(size) + 1


def _batches(
    items: list[tuple[bytes, TreeEntry]],
) -> Iterator[list[tuple[bytes, TreeEntry]]]:
    batch: list[tuple[bytes, TreeEntry]] = []
    size = 0
    for item in items:
        batch.append(item)
        size += max(item[1].size, 0)
        if size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def checkout_files(*, common_dir: str, rev: str, dest: str) -> int:
    """Write `rev`'s tree into the directory `dest` (module docstring); the entry count."""
    entries = tree_entries(common_dir, rev)
    blobs = [(path, e) for path, e in entries.items() if e.kind == "blob"]
    with _root(dest) as root:
        for path, entry in entries.items():
            if entry.kind == "commit":
                parts = _parts(path)
                fd = _open_dir(root, parts, create=True)
                if fd is not None:
                    os.close(fd)
        for batch in _batches(blobs):
            content = dict(_blobs(common_dir, sorted({e.oid for _, e in batch})))
            for path, entry in batch:
                _write_entry(root, _parts(path), entry.mode, content[entry.oid])
    return len(entries)


def _write_entry(root: int, parts: list[bytes], mode: str, data: bytes) -> None:
    fd = _open_dir(root, parts[:-1], create=True)
    if fd is None:
        raise GitError(
            BAD_PATH.format(path=b"/".join(parts).decode("utf-8", "replace"))
        )
    try:
        if mode == MODE_LINK:
            os.symlink(data, parts[-1], dir_fd=fd)
            return
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        out = os.open(
            parts[-1], flags, 0o755 if mode == MODE_EXEC else 0o644, dir_fd=fd
        )
        with os.fdopen(out, "wb") as handle:
            handle.write(data)
    finally:
        os.close(fd)


def read_entry(root: int, path: bytes) -> tuple[str, bytes] | None:
    """(mode, content) of the file or symlink at `path` below `root` as it is on disk, or
    None: missing, a directory, anything else, or below a symlink."""
    try:
        parts = _parts(path)
    except GitError:
        return None
    fd = _open_dir(root, parts[:-1], create=False)
    if fd is None:
        return None
    try:
        info = os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        if stat.S_ISLNK(info.st_mode):
            return MODE_LINK, os.fsencode(os.readlink(parts[-1], dir_fd=fd))
        if not stat.S_ISREG(info.st_mode):
            return None
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
        handle = os.open(parts[-1], flags, dir_fd=fd)
        with os.fdopen(handle, "rb") as stream:
            opened = os.fstat(stream.fileno())
            if not stat.S_ISREG(opened.st_mode):
                return None
            data = stream.read()
        return (MODE_EXEC if opened.st_mode & 0o100 else MODE_FILE), data
    except OSError:
        return None
    finally:
        os.close(fd)


def blob_oid(data: bytes, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    digest.update(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest()


class SecretInWork(Exception):
    """A file the agent left holds a secret loopsweb keeps (ledger.held_secrets)."""

    def __init__(self, path: bytes, name: str) -> None:
        super().__init__(
            f"{os.fsdecode(path)} holds a secret loopsweb keeps ({name}); nothing of the "
            "run is committed or pushed"
        )


def _work_entries(
    common_dir: str, work_tree: str, parent: str, scratch: Path
) -> Iterator[tuple[bytes, TreeEntry | None, tuple[str, bytes] | None]]:
    """Each path of `work_tree` against `parent`'s tree, as `git add --all` would take it:
    the tracked ones, then the untracked ones no ignore rule names; with the tracked entry
    (None: untracked) and what is on disk (`read_entry`; None: missing, or a submodule,
    which is never read). `scratch`: the caller's private directory (a scratch index)."""
    tracked = tree_entries(common_dir, parent)
    index = {"GIT_INDEX_FILE": str(scratch / "index")}
    run_git("read-tree", parent, git_dir=common_dir, cwd=common_dir, extra_env=index)
    others = run_git(
        "ls-files",
        "-z",
        "--others",
        "--exclude-standard",
        git_dir=common_dir,
        work_tree=work_tree,
        cwd=work_tree,
        extra_env=index,
    ).stdout
    untracked = [p for p in others.split(b"\0") if p and not p.endswith(b"/")]
    with _root(work_tree) as root:
        for path in [*tracked, *(p for p in untracked if p not in tracked)]:
            entry = tracked.get(path)
            if entry is not None and entry.kind == "commit":
                yield path, entry, None
            else:
                yield path, entry, read_entry(root, path)


def changed_paths(
    *, common_dir: str, work_tree: str, commit: str, scratch: Path
) -> list[str]:
    """The paths whose files in `work_tree` differ from `commit`'s tree (changed, deleted,
    new and not ignored): what `snapshot_tree` would take that `commit` does not hold.
    Reads only: nothing is written to the repository."""
    algorithm = object_format(common_dir)
    changed: list[str] = []
    for path, entry, found in _work_entries(common_dir, work_tree, commit, scratch):
        if entry is not None and entry.kind == "commit":
            continue
        if found is None:
            if entry is not None:
                changed.append(os.fsdecode(path))  # deleted
            continue
        mode, data = found
        if entry is None or (entry.oid, entry.mode) != (
            blob_oid(data, algorithm),
            mode,
        ):
            changed.append(os.fsdecode(path))
    return changed


def snapshot_tree(
    *,
    common_dir: str,
    work_tree: str,
    parent: str,
    scratch: Path,
    forbidden: Mapping[str, str] | None = None,
) -> str:
    """The tree of what `work_tree` holds now (module docstring), built from `parent`'s
    entries; `scratch` is a private directory of the caller's for loopsweb's index.
    SecretInWork when a new or changed file holds one of `forbidden`'s values."""
    refused = [(name, value.encode()) for name, value in (forbidden or {}).items()]
    algorithm = object_format(common_dir)
    lines: list[bytes] = []
    new: list[tuple[bytes, str, bytes]] = []  # path, oid, content
    for path, entry, found in _work_entries(common_dir, work_tree, parent, scratch):
        if entry is not None and entry.kind == "commit":
            lines.append(f"{entry.mode} {entry.oid}\t".encode() + path)
            continue
        if found is None:
            continue  # deleted (or no longer a file)
        mode, data = found
        oid = blob_oid(data, algorithm)
        if entry is None or entry.oid != oid:
            for name, value in refused:
                if value in data:
                    raise SecretInWork(path, name)
            new.append((path, oid, data))
        lines.append(f"{mode} {oid}\t".encode() + path)
    _write_blobs(common_dir, new, scratch)
    tree_index = {"GIT_INDEX_FILE": str(scratch / "tree-index")}
    run_git(
        "update-index",
        "--add",
        "-z",
        "--index-info",
        git_dir=common_dir,
        cwd=common_dir,
        extra_env=tree_index,
        stdin=b"".join(line + b"\0" for line in lines),
    )
    return run_git(
        "write-tree", git_dir=common_dir, cwd=common_dir, extra_env=tree_index
    ).text


def _write_blobs(
    common_dir: str, new: list[tuple[bytes, str, bytes]], scratch: Path
) -> None:
    """Store the new blobs: each copied to a private file first, so git reads loopsweb's
    copy and never a path of the worktree."""
    if not new:
        return
    copies = scratch / "blobs"
    copies.mkdir(mode=0o700)
    names = []
    for number, (_path, _oid, data) in enumerate(new):
        name = copies / str(number)
        name.write_bytes(data)
        names.append(str(name))
    stored = run_git(
        "hash-object",
        "-w",
        "--no-filters",
        "--stdin-paths",
        git_dir=common_dir,
        cwd=common_dir,
        stdin="".join(f"{name}\n" for name in names).encode(),
    ).text.split()
    for (path, oid, _data), got in zip(new, stored, strict=True):
        if got != oid:
            raise GitError(
                OID_MISMATCH.format(
                    path=path.decode("utf-8", "replace"), got=got, want=oid
                )
            )
