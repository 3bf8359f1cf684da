"""A restarted server gets back the versions the decision log says were live: the stable version, the canary
and the canary's share of the traffic.

`hugerec loop` with the embedded server holds its served versions in memory only: after a kill the restarted
server is empty, and without this the loop's next candidate would become stable at once, with all of the
traffic and no canary phase. `restore_server` runs before the loop's next window:

    1. the roles come from the log (decision_log.live_roles): stable, canary, share
    2. each live version is loaded the way it was published when its files allow an exact replay, so that the
       server holds the very content the log's ids name (later version deltas are made against those ids):
         a whole bundle     bundles/<v>, when its manifest's sha256 is the logged id
         a version delta    updates/<v> on the base it was made against, when that base is live again with
                            the content the delta names
       otherwise a whole bundle exported anew from the version's checkpoint (checkpoints/<v>.pt), and a
       `restore` record in the log gives its new content id (loop._content_id reads it)
    3. the stable version is loaded first (the first version of a model becomes stable), then the canary is
       published with its share

A `restore` record is written for every version given back, so the log says when the server's state was
rebuilt and how. Nothing is done when the server already serves what the log says (a remote server that
stayed up) or when the log names no live version.

`remove_interrupted_loads` runs first, on every start of the loop: a kill during a version-delta load leaves
the server's working copy of the rows (updates/<v>/state-<v>.<random>/, a RocksDB checkpoint, and its lock
file) and, when the publish never completed, the whole updates/<v>/ of a version no record commits. Only
what the loop owns is removed: the working copies whose owner is dead (their flock is free: store/owned_dirs),
the updates/<v> folders of versions without a publish record that no live process works in, and the hidden
staging folders (.<v>.<random>) of a bundle or delta write that a kill cut short.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from hugerec.continuous.decision_log import LiveRoles, Record, live_roles
from hugerec.serving.bundles.bundle_files import MANIFEST, sha256_file
from hugerec.serving.bundles.export import export
from hugerec.serving.bundles.version_delta import STATE_PREFIX
from hugerec.serving.store.owned_dirs import LOCK, remove_stale

if TYPE_CHECKING:
    from hugerec.continuous.loop import Loop


def restore_server(loop: Loop) -> LiveRoles:
    """Give the loop's server (loop.publisher) the stable version and canary of the decision log; returns those
    roles. PublishError when the server refuses or cannot be reached; ValueError when a live version has neither
    its published files nor a checkpoint (one line naming the version and the folders)."""
    publisher = loop.publisher
    if publisher is None:
        raise ValueError("restore_server: the loop has no server to restore")
    live = live_roles(loop.log.records, loop.config.canary_share)
    status = publisher.status()
    served = (None, None) if status is None else (status["stable"], status["canary"])
    if live.stable is None or served == (live.stable, live.canary):
        return live
    if status is not None:
        raise ValueError(
            f"restore_server: the server serves stable {served[0]!r} and canary {served[1]!r}, the decision log "
            f"{loop.log.path} says {live.stable!r} and {live.canary!r}: not replacing versions it did not lose"
        )
    window = max(r.window for r in loop.log.records)
    exact: set[str] = set()
    for version, share in ((live.stable, 1.0), (live.canary, live.share)):
        if version is None or share is None:
            continue
        role = "stable" if version == live.stable else f"canary at share {share}"
        published = [r for r in loop.log.records if r.action == "publish" and r.version == version][-1]
        mode, base = published.extra.get("mode"), published.extra.get("base")
        logged_id = str(published.extra.get("id", ""))
        update, bundle = loop.update(version), loop.bundle(version)
        if mode == "delta" and base in exact and _holds(update, logged_id):
            publisher.publish_delta(update, str(base), version, share)
            how, extra = f"replayed its version delta on {base}", {"role": role}
        elif mode == "bundle" and _holds(bundle, logged_id):
            publisher.publish(bundle, version, share)
            how, extra = "replayed its bundle", {"role": role}
        else:
            if not loop.checkpoint(version).is_file():
                raise ValueError(
                    f"restore_server: live version {version!r} has no published files to replay ({update}, {bundle}) "
                    f"and no checkpoint {loop.checkpoint(version)}"
                )
            export(
                loop.load(version),
                bundle,
                name=loop.config.name,
                version=version,
                schema=loop.schema_of(version),
                overwrite=True,
            )
            publisher.publish(bundle, version, share)
            how = "a whole bundle exported anew from its checkpoint (its published files are gone)"
            extra = {"role": role, "mode": "bundle", "id": sha256_file(bundle / MANIFEST), "stable": live.stable}
        if "id" not in extra:
            exact.add(version)
        loop.log.append(Record(window, "restore", f"server restarted: {role} again; {how}", None, version, extra))
    return live


def _holds(folder: Path, logged_id: str) -> bool:
    """Whether `folder` still holds the published content whose manifest id the log recorded."""
    manifest = folder / MANIFEST
    return bool(logged_id) and manifest.is_file() and sha256_file(manifest) == logged_id


_VERSION = re.compile(r"w\d+")  # loop.version_of's names
_STAGED = re.compile(r"\.w\d+\.")  # bundle_files.staged_folder's hidden folders of such a version


def remove_interrupted_loads(loop: Loop) -> list[Path]:
    """Remove what killed version-delta loads and publishes left in the loop's updates/ and bundles/ (see the
    module doc); returns the removed folders. Safe while a server uses a version: a held lock is never taken."""
    committed = {r.version for r in loop.log.records if r.action == "publish"}
    removed: list[Path] = []
    for root in (loop.work / "updates", loop.work / "bundles"):
        if not root.is_dir():
            continue
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            if _STAGED.match(folder.name):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
            elif root.name == "updates" and _VERSION.fullmatch(folder.name):
                removed += remove_stale(folder, STATE_PREFIX)  # the working copies of dead servers
                if folder.name not in committed and not any(folder.glob(f"{STATE_PREFIX}*{LOCK}")):
                    shutil.rmtree(folder, ignore_errors=True)  # a publish that never completed
                    removed.append(folder)
    return removed
