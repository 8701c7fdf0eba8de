"""Throwaway git repositories for the tests of the project's own checkers (layering.py,
doc_names.py, function_length.py), which read a repository as git lists it."""

import subprocess


def make_repo(tmp_path, files, add=False):
    """Writes `files` (path -> text) under `tmp_path` (a pathlib.Path) and makes it a git
    repository, its files staged when `add`; returns its path as a str."""
    for path, text in files.items():
        full = tmp_path / path
        full.parent.mkdir(parents=True, exist_ok=True)
        full.write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    if add:
        subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    return str(tmp_path)
