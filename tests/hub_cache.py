"""A Hugging Face hub cache laid out as huggingface_hub writes it, for offline hub tests: each file once under
`blobs/<hash>`, and `snapshots/<commit>/<path in repo>` a relative link to it."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_repo(cache: Path, repo_id: str, files: dict[str, Path]) -> Path:
    """Cache `files` ({path in repo: local file}) as repo `repo_id` at COMMIT, which refs/main names; returns
    the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "blobs").mkdir(exist_ok=True)
    snapshot = repo / "snapshots" / COMMIT
    for name, source in files.items():
        blob = repo / "blobs" / hashlib.sha256(Path(source).read_bytes()).hexdigest()
        shutil.copy(source, blob)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    return snapshot


def offline_cache(tmp_path: Path, monkeypatch) -> Path:
    """An empty hub cache in tmp_path, the hub client offline and the working directory moved there (so that
    "Org/Name" is never a local path); returns the cache folder."""
    import huggingface_hub.constants

    cache = tmp_path / "hf_home" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads these at import; hf_hub_download looks them up on the constants module at call time
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    return cache


def record_downloads(monkeypatch) -> list[str]:
    """The file names asked of `huggingface_hub.hf_hub_download`, in order."""
    import huggingface_hub

    asked, real = [], huggingface_hub.hf_hub_download

    def spy(repo_id, filename, **kwargs):
        asked.append(filename)
        return real(repo_id, filename, **kwargs)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", spy)
    return asked
