"""The Hugging Face hub, for both decoders: what the user gave (a local path, or a repo id to fetch), and
fetching only one component's files into the HF cache by one policy (the cache first, the hub asked once)."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from ..text import shown
from .files import DIFFUSERS_INDEX, DIFFUSERS_SINGLE, CheckpointError, decoder_shards

DEFAULT_REPO = "MiniMaxAI/MiniMax-H3"


def looks_like_repo_id(text: str) -> bool:
    return re.fullmatch(r"[\w.-]+/[\w.-]+", text) is not None and not text.startswith((".", "/"))


def local_or_fetched(
    source: str | os.PathLike, revision: str | None, download: Callable[[str, str | None], Path]
) -> tuple[Path, bool]:
    """The folder or file `source` names: itself when it exists, else the folder `download(repo_id, revision)`
    fetched for a hub repo id; and whether it was fetched."""
    path = Path(os.fspath(source)).expanduser()
    try:
        exists = path.exists()
    except OSError as error:  # a name too long for the filesystem, a folder that may not be searched
        raise CheckpointError(f"{shown(source)}: cannot look there ({error.strerror})") from None
    if exists:
        if revision is not None:
            raise CheckpointError(f"{source}: is a local path; a revision ({revision!r}) applies to hub repo ids only")
        return path, False
    if looks_like_repo_id(str(source)):
        return download(str(source), revision), True
    raise CheckpointError(f"{source}: no such file or folder, and not a hub repo id (like {DEFAULT_REPO})")


def diffusers_locator(subfolder: str, prefixes: tuple[str, ...]) -> Callable[[str, Callable, bool], Path]:
    """A `hub_snapshot` locator of a diffusers folder: its config.json, and the index's shards that hold keys
    starting with `prefixes` (else the single weights file); returns the folder."""

    def locate(repo_id: str, fetch: Callable[[str], Path], local_only: bool) -> Path:
        from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

        config = fetch(f"{subfolder}/config.json")
        try:
            for name in decoder_shards(fetch(f"{subfolder}/{DIFFUSERS_INDEX}"), repo_id, prefixes):
                fetch(f"{subfolder}/{name}")
        except LocalEntryNotFoundError:
            if not local_only:
                raise
            fetch(f"{subfolder}/{DIFFUSERS_SINGLE}")
        except EntryNotFoundError:
            fetch(f"{subfolder}/{DIFFUSERS_SINGLE}")
        return config.parent

    return locate


def hub_snapshot(repo_id: str, revision: str | None, locators: tuple[Callable, ...], missing: str) -> Path:
    """Fetch one component's files into the HF cache; returns its folder there.

    Each locator, `locate(repo_id, fetch, local_only)`, fetches one layout's files through `fetch(filename)`
    and returns the folder; they are tried in order, the next when the hub says a file of this one is not
    there (or, looking in the cache only, when the cache lacks one). `missing` says what a repo that holds
    none of them lacks ("neither X/ nor Y/ with a video VAE").

    With no revision, or a commit hash, the local cache is looked at first, with no network at all: a repo
    cached once loads offline at once (without a revision: the commit cached as `main`). A branch or tag
    name asks the hub for its newest commit first, and falls back to the cache only when the hub cannot be
    reached; `revision="main"` is how a cached repo is brought up to date. Otherwise the hub is asked once;
    a hub that cannot be reached is an error at the first file (no fallback to the other layout, which
    would only retry the same unreachable host).
    """
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    def locate(local_only: bool) -> Path:
        def fetch(filename: str) -> Path:
            return Path(hf_hub_download(repo_id, filename, revision=revision, local_files_only=local_only))

        *fallbacks, final = locators
        for locator in fallbacks:
            try:
                return locator(repo_id, fetch, local_only)
            except LocalEntryNotFoundError:
                if not local_only:  # the hub was not reached: the other layout would not be either
                    raise
            except EntryNotFoundError:  # the hub says this layout is not there
                pass
        return final(repo_id, fetch, local_only)

    named = revision is not None and re.fullmatch(r"[0-9a-f]{40}", revision) is None  # a branch or a tag
    try:
        if not named:
            try:
                return locate(local_only=True)
            except (LocalEntryNotFoundError, OfflineModeIsEnabled, EntryNotFoundError):
                pass
        online = not constants.HF_HUB_OFFLINE and hub_reachable(constants.ENDPOINT)
        if not online and not named:
            raise LocalEntryNotFoundError("offline")
        return locate(local_only=not online)
    except (LocalEntryNotFoundError, OfflineModeIsEnabled):
        raise CheckpointError(
            f"{repo_id}: no such local path, and not in the local Hugging Face cache while "
            "the hub cannot be reached (HF_HUB_OFFLINE set, or no network): check the path, "
            "download the repo once online, or pass a local path"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise CheckpointError(
            f"{repo_id}: not found on the Hugging Face hub: check the repo id and revision, or log in for a gated repo"
        ) from None
    except EntryNotFoundError:
        raise CheckpointError(f"{repo_id}: holds {missing}") from None


def hub_reachable(endpoint: str) -> bool:
    """One request to the hub, through its client's session (proxies and certificates honoured), without
    the client's retries: hf_hub_download retries an unreachable host for ~25 s per file."""
    from huggingface_hub.utils import get_session

    try:
        get_session().head(endpoint, timeout=10)
    except Exception:  # any transport error (DNS, refused, timeout, TLS): the hub cannot be reached
        return False
    return True
