#!/usr/bin/env python3
"""Start-up of every fedpers Flower container: hand the secrets to the container user, then drop root.

Compose's file-based secrets are bind mounts at /run/secrets/<name>: outside swarm their uid/gid/mode
settings are ignored, so a key that `fedpers deploy certs` wrote 0600 for the host user cannot be read by
Flower's container user (`app`, uid 49999). This entry point starts as root, copies each secret mounted for
this service into /run/fedpers-secrets (0700, owned by the app user; files 0400), gives the app user the
directories named in FEDPERS_OWN_DIRS (the SuperLink database, results, client state: a volume or bind
mount need not belong to it), then execs the command as that user. Commands read their files from
/run/fedpers-secrets/<secret name>.
"""
from __future__ import annotations

import os
import pwd
import shutil
import sys

SRC = "/run/secrets"
DST = "/run/fedpers-secrets"


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("fedpers-entrypoint: no command given")
    user = pwd.getpwnam(os.environ.get("FEDPERS_USER", "app"))
    if os.getuid() != 0:
        # Started as the app user already (e.g. `user:` set in compose): the secrets must be readable as is.
        if os.path.isdir(SRC) and not os.path.isdir(DST):
            sys.exit(f"fedpers-entrypoint: running as uid {os.getuid()}, cannot copy {SRC} to {DST}: start as root")
        os.execvp(argv[0], argv)
    os.makedirs(DST, mode=0o700, exist_ok=True)
    os.chown(DST, user.pw_uid, user.pw_gid)
    os.chmod(DST, 0o700)
    if os.path.isdir(SRC):
        for name in sorted(os.listdir(SRC)):
            src, dst = os.path.join(SRC, name), os.path.join(DST, name)
            if not os.path.isfile(src):
                continue
            shutil.copyfile(src, dst)
            os.chown(dst, user.pw_uid, user.pw_gid)
            os.chmod(dst, 0o400)
    for directory in os.environ.get("FEDPERS_OWN_DIRS", "").split():
        os.makedirs(directory, exist_ok=True)
        os.chown(directory, user.pw_uid, user.pw_gid)  # the top level: what the service creates goes inside
    os.setgroups([])
    os.setgid(user.pw_gid)
    os.setuid(user.pw_uid)
    os.environ.update(HOME=user.pw_dir, USER=user.pw_name)
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        sys.exit(f"fedpers-entrypoint: command not found: {argv[0]}")


if __name__ == "__main__":
    main(sys.argv[1:])
