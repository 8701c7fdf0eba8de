"""The DCP interop's staging-directory removal (python/ckpt/interop/dcp.py, _remove_tree) works
by file descriptor, as storage/file_util.h's RemoveTree (issue 39): a directory swapped for a
symlink to a victim directory right after it was listed never makes it remove the victim's
files, symlinks in the tree are removed as links, and a missing path is nothing to do.

The swap is made deterministically: os.scandir is wrapped so that listing the staging
directory's data/ (recognised by its inode, whether scandir gets a path or a descriptor)
replaces data/ by a symlink right after the listing, before any entry is removed.
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python", "ckpt"))

from interop import dcp as interop_dcp  # noqa: E402

NAMES = [f"__{i}_0.distcp" for i in range(20)]


def _fill(directory, text):
    os.mkdir(directory)
    for name in NAMES:
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)


@pytest.fixture
def tree(tmp_path):
    staging = tmp_path / ".out.tmp-1-abc"
    staging.mkdir()
    _fill(staging / "data", "staging")
    _fill(tmp_path / "victim", "victim")
    return tmp_path, staging


def test_data_swapped_for_a_symlink_after_its_listing_leaves_the_victims_files(
        tree, monkeypatch):
    root, staging = tree
    data, victim = staging / "data", root / "victim"
    data_inode = os.stat(data).st_ino
    real_scandir = os.scandir
    swapped = []

    def scandir(target):
        with real_scandir(target) as it:
            entries = list(it)
        if not swapped and os.stat(target).st_ino == data_inode:
            swapped.append(True)
            os.rename(data, root / "moved")
            os.symlink(victim, data)
        return _Listing(entries)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(OSError) as raised:
        interop_dcp._remove_tree(str(staging))
    monkeypatch.undo()
    assert swapped
    assert sorted(os.listdir(victim)) == sorted(NAMES)
    for name in NAMES:
        assert (victim / name).read_text() == "victim"
    assert str(data) in str(raised.value)


def test_symlinks_are_removed_as_links_and_a_missing_path_is_nothing_to_do(tree):
    root, staging = tree
    victim = root / "victim"
    os.symlink(victim, staging / "to_dir")
    os.symlink(victim / NAMES[0], staging / "data" / "to_file")
    os.symlink(victim, root / "top_link")
    interop_dcp._remove_tree(str(staging))
    interop_dcp._remove_tree(str(root / "top_link"))
    interop_dcp._remove_tree(str(root / "missing"))
    assert not os.path.lexists(staging)
    assert not os.path.lexists(root / "top_link")
    assert sorted(os.listdir(victim)) == sorted(NAMES)


class _Listing:
    """What os.scandir returns (an iterator and context manager) over listed entries."""

    def __init__(self, entries):
        self._entries = iter(entries)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._entries)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def close(self):
        pass


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
